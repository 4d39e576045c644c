"""Sub-agents on the recording gateway: an ``openai``-SDK agent spawns a sub-agent (and an ``anthropic``-SDK
sub-sub-agent) under ``X-Agentgym-Parent-Session``; the child sessions are linked to their parent, their recorded
ids re-render exactly, and trainers read them as part of the parent episode (one return, one advantage) or as
episodes of their own. A session cannot be attached to a parent without the parent's token."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.serving.gateway import PARENT_HEADER, PARENT_TOKEN_HEADER, SESSION_HEADER, TOKEN_HEADER  # noqa: E402
from agentgym.serving.openai_server import ServerThread  # noqa: E402
from agentgym.serving.sessions import read_session, sessions_to_trajectories  # noqa: E402
from agentgym.trainers.gateway import GatewayGrpoTrainer, episode_leaders  # noqa: E402
from tests.serving.test_gateway import CalcScript  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
QUESTION = [{"role": "user", "content": "What is 12*34?"}]


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> CalcScript:
    from transformers import AutoTokenizer

    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 20),
                             config=SMALL)
    return CalcScript(AutoTokenizer.from_pretrained(str(model)))


def agent_with_subagents(base_url: str, *, fail: bool = False) -> dict[str, Any]:
    """An agent program written against the ``openai`` package that, before acting, asks a sub-agent (its own
    session, linked by the parent header; its token defaults to the parent's), which in turn asks an
    ``anthropic``-SDK sub-agent of its own. ``fail`` answers 0 instead of the model's answer."""
    root, rest = base_url.split("/s/", 1)
    parent, token = rest.split("/")[:2]
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        start = client.post("/env/reset", body={}, cast_to=object)
        question = [{"role": "user", "content": start["observation"]}]
        with openai.OpenAI(base_url=f"{root}/s/{parent}-sub/{token}/v1", api_key="unused", max_retries=0,
                           default_headers={PARENT_HEADER: parent}) as sub:
            sub.chat.completions.create(model="script", messages=question, temperature=1.0)
            with anthropic.Anthropic(base_url=f"{root}/s/{parent}-subsub/{token}", api_key="unused", max_retries=0,
                                     default_headers={PARENT_HEADER: f"{parent}-sub"}) as subsub:
                subsub.messages.create(model="script", max_tokens=24, messages=question)
            if fail:  # the sub-agent reports its own reward: only `separate` uses it
                sub.post("/session/reward", body={"reward": 0.25}, cast_to=object)
        messages = list(question)
        result: dict[str, Any] = {}
        for _ in range(4):
            action = client.chat.completions.create(model="script", messages=messages).choices[0].message.content
            result = client.post("/env/step", body={"action": "answer(0)" if fail else action}, cast_to=object)
            if result["done"]:
                return result
            messages += [{"role": "assistant", "content": action}, {"role": "user", "content": result["observation"]}]
    return result


def test_openai_agent_spawns_subagents_merged_or_separate(script: CalcScript, tmp_path: Path) -> None:
    suite = load_suite("games-calc")
    record = tmp_path / "rec"
    with ServerThread(script, model_name="script", record_dir=record) as server:
        gateway = server.app.state.gateway
        root = server.base_url.removesuffix("/v1")
        won = gateway.open_session("won", env_id=suite.env_id, task=suite.train[0], seed=0, group_id="g0")
        lost = gateway.open_session("lost", env_id=suite.env_id, task=suite.train[0], seed=1, group_id="g0")
        assert agent_with_subagents(gateway.session_base_url(root, won))["outcome"]["success"]
        assert not agent_with_subagents(gateway.session_base_url(root, lost), fail=True)["outcome"]["success"]
    heads = {s: read_session(record / f"{s}.jsonl")[0] for s in ("won-sub", "won-subsub")}
    assert heads["won-sub"]["parent"] == "won" and heads["won-subsub"]["parent"] == "won-sub"
    assert [r["session"] for r in read_session(record / "won.jsonl") if r["type"] == "subagent"] == ["won-sub"]
    # the sub-agents' recorded prompts are their requests as the server rendered them (both APIs)
    tok = script.tokenizer
    observation = next(r for r in read_session(record / "won.jsonl") if r["type"] == "reset")["observation"]
    rendered = tok.encode(tok.apply_chat_template([{"role": "user", "content": observation}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
    for child, api in (("won-sub", "openai"), ("won-subsub", "anthropic")):
        (call,) = [r for r in read_session(record / f"{child}.jsonl") if r["type"] == "call"]
        assert (call["prompt_token_ids"], call["api"], call["ids_source"]) == (rendered, api, "server"), child

    merged = sessions_to_trajectories(record, ["won", "lost"], subagents="merge")
    assert (merged.sessions, merged.subagent_sessions, merged.segments, merged.mismatches) == (2, 4, 6, 0)
    by_session = {t.metadata["session"]: t for t in merged.trajectories}
    for sid in ("won", "won-sub", "won-subsub"):
        t = by_session[sid]
        assert (t.metadata["episode"], t.group_id, t.success, t.score) == ("won", "g0", True, 1.0), sid
    assert by_session["lost-sub"].score == 0.0  # its own reported reward is not the episode's return
    assert sessions_to_trajectories(record).sessions == 2  # children are never read as episodes of their own

    separate = sessions_to_trajectories(record, ["won", "lost"], subagents="separate")
    by_session = {t.metadata["session"]: t for t in separate.trajectories}
    assert (by_session["won-sub"].metadata["episode"], by_session["won-sub"].group_id) == ("won-sub", "g0/sub")
    assert by_session["won-sub"].score == 1.0  # no reward of its own: the root's
    assert by_session["lost-sub"].score == 0.25 and by_session["lost-subsub"].score == 0.0

    # merge: every row of an episode gets the episode's one advantage, each episode counted once in its group
    rows = merged.trajectories
    scores = torch.tensor([t.score for t in rows])
    batch = SimpleNamespace(input_ids=torch.zeros(len(rows), 5, dtype=torch.long), episode_index=None)
    trainer = GatewayGrpoTrainer.__new__(GatewayGrpoTrainer)  # the advantage step alone: no model needed
    trainer.config = SimpleNamespace(advantage="grpo", singleton_advantage="zero", advantage_control="none")
    advantages, _ = trainer._token_advantages(rows, scores, torch.ones(len(rows), dtype=torch.bool),
                                              list(range(len(rows))), batch)
    per_row = {t.metadata["session"]: float(a[0]) for t, a in zip(rows, advantages)}
    expected = 1.0 / (2 ** 0.5 + 1e-6)  # two episodes scoring 1 and 0: (1 - 0.5) / std([1, 0])
    for sid in ("won", "won-sub", "won-subsub"):
        assert per_row[sid] == pytest.approx(expected, rel=1e-4), sid
    for sid in ("lost", "lost-sub", "lost-subsub"):
        assert per_row[sid] == pytest.approx(-expected, rel=1e-4), sid
    assert episode_leaders(rows).sum() == 2
    with pytest.raises(Exception, match="subagents must be"):
        GatewayGrpoTrainer(SimpleNamespace(), lambda url: None, subagents="both")


def test_a_session_joins_a_parent_only_with_the_parents_token(script: CalcScript, tmp_path: Path) -> None:
    record = tmp_path / "rec"
    with ServerThread(script, model_name="script", record_dir=record) as server:
        gateway = server.app.state.gateway
        root = server.base_url.removesuffix("/v1")
        parent = gateway.open_session("p")
        other = gateway.open_session("q")
        with openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0) as client:
            def call(session: str, headers: dict[str, str]) -> Any:
                return client.chat.completions.create(model="script", messages=QUESTION,
                                                      extra_headers={SESSION_HEADER: session, **headers})

            wrong = "wrong-token-0123456789abcdef"
            with pytest.raises(openai.PermissionDeniedError, match="parent session 'p' needs its token"):
                call("p-child", {PARENT_HEADER: parent, TOKEN_HEADER: wrong})
            with pytest.raises(openai.PermissionDeniedError):
                call("p-child", {PARENT_HEADER: parent, PARENT_TOKEN_HEADER: wrong})
            assert not (record / "p-child.jsonl").exists()
            with pytest.raises(openai.NotFoundError, match="No parent session 'nobody'"):
                call("p-child", {PARENT_HEADER: "nobody", TOKEN_HEADER: gateway.token(parent)})
            with pytest.raises(openai.BadRequestError, match="names itself"):
                call("p", {PARENT_HEADER: "p", TOKEN_HEADER: gateway.token(parent)})
            # an existing session cannot be claimed as a child, even by a parent whose token is right
            with pytest.raises(openai.ConflictError, match="not a sub-agent of 'p'"):
                call("q", {PARENT_HEADER: parent, PARENT_TOKEN_HEADER: gateway.token(parent),
                           TOKEN_HEADER: gateway.token(other)})
            # a child with a token of its own, proving the parent's in its own header
            own = "child-token-0123456789abcdef"
            call("p-child", {PARENT_HEADER: parent, PARENT_TOKEN_HEADER: gateway.token(parent), TOKEN_HEADER: own})
            assert gateway.token("p-child") == own
            # the child's later calls need the child's token; another parent cannot adopt it
            with pytest.raises(openai.PermissionDeniedError):
                call("p-child", {PARENT_HEADER: parent, PARENT_TOKEN_HEADER: gateway.token(parent),
                                 TOKEN_HEADER: gateway.token(parent)})
            with pytest.raises(openai.ConflictError, match="not a sub-agent of 'q'"):
                call("p-child", {PARENT_HEADER: other, PARENT_TOKEN_HEADER: gateway.token(other), TOKEN_HEADER: own})
            call("p-child", {PARENT_HEADER: parent, PARENT_TOKEN_HEADER: gateway.token(parent), TOKEN_HEADER: own})
            client.post("/session/reward", body={"reward": 1.0}, cast_to=object,
                        options={"headers": {SESSION_HEADER: parent, TOKEN_HEADER: gateway.token(parent)}})
            with pytest.raises(openai.ConflictError, match="has ended"):
                call("p-late", {PARENT_HEADER: parent, TOKEN_HEADER: gateway.token(parent)})
    calls = [r for r in read_session(record / "p-child.jsonl") if r["type"] == "call"]
    assert len(calls) == 2
    assert not (record / "p-late.jsonl").exists()
    assert [r["session"] for r in read_session(record / "p.jsonl") if r["type"] == "subagent"] == ["p-child"]
