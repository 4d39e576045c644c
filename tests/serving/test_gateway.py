"""The recording gateway: an ``openai``-only agent program plays Calculator through it, every call is recorded
token-exactly, sessions merge into training sequences while their prefixes match (mismatches are counted), the
agent may report its own reward, streams and proxied servers record the same ids, and GRPO trains on the
recorded sessions (slow: held-out success rises)."""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.serving.gateway import SESSION_HEADER, TOKEN_HEADER  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.policies.base import Generation, SamplingParams  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.serving.openai_server import ServerThread  # noqa: E402
from agentgym.serving.sessions import sessions_to_trajectories  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import gateway_agent  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 40),
                            config=SMALL)


@pytest.fixture(scope="module")
def hf_policy(model_dir: Path) -> Any:
    from agentgym.policies.hf import HFPolicy

    return HFPolicy.from_pretrained(str(model_dir))


class CalcScript:
    """A scripted policy (an allowed stand-in for a model) that solves Calculator: ``calc(A*B)`` for a question,
    ``answer(N)`` for a tool result; replies are encoded ids plus the end-of-turn token, log-probs -0.5."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.name = "calc-script"
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply(self, prompt: str) -> str:
        last = prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
        question = re.search(r"What is (\d+)\s*\*\s*(\d+)", last)
        if question:
            return f"calc({question.group(1)}*{question.group(2)})"
        numbers = re.findall(r"-?\d+", last)  # the tool's "58*11 = 638": the result is the last number
        return f"answer({numbers[-1] if numbers else 0})"

    def generate(self, prompts: Any, sampling: Any, cancelled: Any = None) -> list[Generation]:
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        out = []
        for prompt, p in zip(prompts, params):
            text = self.reply(self.tokenizer.decode(prompt, skip_special_tokens=False))
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))[: p.max_tokens - 1] + [self.end_id]
            out.append(Generation(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=tuple(ids),
                                  logprobs=tuple(-0.5 for _ in ids), finish_reason="stop"))
        return out


def _play_all(gateway: Any, root: str, sessions: list[str], **kwargs: Any) -> list[dict[str, Any]]:
    """Each session's agent gets the base URL the gateway issued for it (it carries the session's token)."""
    with concurrent.futures.ThreadPoolExecutor(len(sessions)) as pool:
        return list(pool.map(lambda s: gateway_agent.play(gateway.session_base_url(root, s), **kwargs), sessions))


def test_the_agent_program_uses_only_the_openai_package() -> None:
    tree = ast.parse((REPO / "examples" / "gateway_agent.py").read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - {"__future__", "sys", "typing"} == {"openai"}
    assert len((REPO / "examples" / "gateway_agent.py").read_text(encoding="utf-8").splitlines()) <= 45


def test_openai_agent_plays_calculator_and_sessions_become_exact_trajectories(hf_policy: Any, tmp_path: Path) -> None:
    """A scripted model solves every task; each session is one training sequence whose ids are the served ids."""
    script = CalcScript(hf_policy.tokenizer)
    suite = load_suite("games-calc")
    record = tmp_path / "sessions"
    with ServerThread(script, model_name="script", record_dir=record) as server:
        gateway = server.app.state.gateway
        sessions = [gateway.open_session(f"calc-{i}", env_id=suite.env_id, task=suite.train[i], seed=i,
                                         group_id="g0") for i in range(3)]
        results = _play_all(gateway, server.base_url.removesuffix("/v1"), sessions)
    assert all(r["done"] and r["outcome"]["success"] for r in results)
    recorded = sessions_to_trajectories(record, sessions)
    assert (recorded.sessions, recorded.calls, recorded.segments, recorded.mismatches) == (3, 6, 3, 0)
    tok = hf_policy.tokenizer
    for i, traj in enumerate(recorded.trajectories):
        task = suite.train[i]
        assert traj.success and traj.score == 1.0 and traj.task_id == task.id and traj.group_id == "g0"
        assert [t.kind for t in traj.turns] == ["tool_call", "answer"]
        assert traj.turns[-1].reward == 1.0  # the env's reward reached the turn it paid
        view = traj.token_view()
        # the sequence is the final conversation exactly as the server rendered it, plus the last sampled ids
        calls = [json.loads(line) for line in (record / f"calc-{i}.jsonl").read_text().splitlines()
                 if json.loads(line)["type"] == "call"]
        assert list(view.input_ids) == calls[-1]["prompt_token_ids"] + calls[-1]["token_ids"]
        sampled = [tid for tid, m in zip(view.input_ids, view.loss_mask) if m]
        assert sampled == calls[0]["token_ids"] + calls[1]["token_ids"]
        assert tok.decode(calls[0]["token_ids"], skip_special_tokens=True) == f"calc({task.prompt.split()[-1][:-1]})"
        assert [lp for lp, m in zip(view.logprobs, view.loss_mask) if m] == [-0.5] * len(sampled)
        messages = [{"role": "user", "content": traj.turns[0].observation},
                    {"role": "assistant", "content": traj.turns[0].action},
                    {"role": "user", "content": traj.turns[1].observation}]
        rendered = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
        assert calls[1]["prompt_token_ids"] == rendered and calls[1]["ids_source"] == "server"


def test_rewritten_history_starts_a_counted_segment_and_reported_rewards_end_sessions(hf_policy: Any,
                                                                                       tmp_path: Path) -> None:
    """A black-box agent with no env: it names its session by header or `user`, edits its history once (a new
    segment, one mismatch), and reports its own reward."""
    script = CalcScript(hf_policy.tokenizer)
    record = tmp_path / "sessions"
    with ServerThread(script, model_name="script", record_dir=record) as server:
        with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            def chat(messages: list[dict[str, str]], **kw: Any) -> str:
                return client.chat.completions.create(model="script", messages=messages, **kw).choices[0].message.content

            # the client picks the session's token itself on its first call, and sends it with every call
            own = {SESSION_HEADER: "own-1", TOKEN_HEADER: "own-1-token-0123456789abcdef"}
            head = {"extra_headers": own}
            q = [{"role": "user", "content": "What is 12*34?"}]
            a1 = chat(q, **head)
            a2 = chat(q + [{"role": "assistant", "content": a1}, {"role": "user", "content": "408"}], **head)
            # the agent rewrites its first reply before the third call: that prompt extends no earlier call
            chat(q + [{"role": "assistant", "content": a1 + " "}, {"role": "user", "content": "408"},
                      {"role": "assistant", "content": a2}, {"role": "user", "content": "ok"}], **head)
            assert client.post("/session/reward", body={"reward": 0.75}, cast_to=object,
                               options={"headers": own})["ended"]
            chat(q, user="own-2")  # named by the user field; never ends, so it is not trained on
            with pytest.raises(openai.BadRequestError, match="names no session"):
                chat(q)
            with pytest.raises(openai.BadRequestError, match="not valid"):
                chat(q, user="../etc")
            with pytest.raises(openai.ConflictError, match="already ended"):
                client.post("/session/reward", body={"reward": 1.0}, cast_to=object,
                            options={"headers": own})
            # what the client did not ask for, it does not get
            reply = client.chat.completions.create(model="script", messages=q, user="own-3")
            assert reply.choices[0].logprobs is None and "token_ids" not in (reply.choices[0].model_extra or {})
    recorded = sessions_to_trajectories(record)
    assert (recorded.sessions, recorded.open_sessions, recorded.calls, recorded.segments,
            recorded.mismatches) == (1, 2, 3, 2, 1)
    [session] = recorded.trajectories  # one trajectory in two segments, as the rollout engine makes one
    assert session.score == 0.75 and session.success and session.group_id == "own-1"
    assert [t.segment_index for t in session.turns] == [0, 0, 1] and session.metadata["segments"] == 2
    first, second = session.token_views()
    assert second.input_ids[:1] == first.input_ids[:1] and len(second) > len(first), "the rewritten history, whole"
    split = sessions_to_trajectories(record, split_segments=True).trajectories
    assert [t.metadata["segment"] for t in split] == [0, 1] and [len(t.turns) for t in split] == [2, 1]


def test_streams_and_a_proxied_server_record_the_same_ids(hf_policy: Any, tmp_path: Path) -> None:
    """The gateway in front of a remote server (here `agentgym serve` on another port, as it would be vLLM): a
    streamed call and a plain call with the same seed record identical prompt ids, sampled ids and log-probs."""
    from agentgym.serving.gateway import create_gateway_app

    with ServerThread(hf_policy, model_name="tiny") as upstream:
        app = create_gateway_app(upstream.base_url, tmp_path / "rec")
        # a session created by its first call, with a token the client picked, carried in its base URL
        session_path = "/s/p1/p1-token-0123456789abcdef/v1"
        with ServerThread(app) as gateway, openai.OpenAI(base_url=gateway.base_url.removesuffix("/v1") + session_path,
                                                         api_key="unused", max_retries=0) as client:
            messages = [{"role": "user", "content": "What is 58*11?"}]
            plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, seed=7)
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=12, seed=7, stream=True) if c.choices)
            assert streamed == plain.choices[0].message.content
            assert len(client.models.list().data) == 1
    calls = [json.loads(line) for line in (tmp_path / "rec" / "p1.jsonl").read_text().splitlines()][1:]
    assert [c["type"] for c in calls] == ["call", "call"]
    for key in ("prompt_token_ids", "token_ids", "text", "ids_source"):
        assert calls[0][key] == calls[1][key], key
    assert calls[0]["logprobs"] == pytest.approx(calls[1]["logprobs"], abs=1e-5)
    assert len(calls[0]["token_ids"]) == len(calls[0]["logprobs"]) > 0
    served = hf_policy.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert calls[0]["prompt_token_ids"] == hf_policy.tokenizer.encode(served, add_special_tokens=False)


def test_session_api_refuses_bad_input_with_a_fix(hf_policy: Any, tmp_path: Path) -> None:
    script = CalcScript(hf_policy.tokenizer)
    with ServerThread(script, model_name="script", record_dir=tmp_path / "rec") as server:
        root = server.base_url.removesuffix("/v1")
        bad = httpx.post(root + "/v1/sessions", json={"env": "agentgym/Calculater-v0"})
        assert bad.status_code == 400 and "Calculator-v0" in bad.json()["error"]["message"]
        bad = httpx.post(root + "/v1/sessions", json={"suite": "games-calc", "task_id": "train-9x"})
        assert bad.status_code == 400 and "train-" in bad.json()["error"]["message"]
        bad = httpx.post(root + "/v1/sessions", json={"envv": "agentgym/Calculator-v0"})
        assert bad.status_code == 400 and "'env'" in bad.json()["error"]["message"]
        made = httpx.post(root + "/v1/sessions", json={"suite": "games-calc", "split": "test",
                                                         "task_id": "test-00003", "seed": 3}).json()
        assert made["env"] == "agentgym/Calculator-v0"
        assert made["base_url"].endswith(f"/s/{made['session']}/{made['token']}/v1")
        step = httpx.post(made["base_url"] + "/env/step", json={"action": "answer(1)"})
        assert step.status_code == 409 and "reset" in step.json()["error"]["message"]
        assert "What is" in httpx.post(made["base_url"] + "/env/reset", json={}).json()["observation"]
        assert httpx.post(made["base_url"] + "/env/step", json={"action": 3}).status_code == 400
        again = httpx.post(root + "/v1/sessions", json={"session": made["session"]})
        assert again.status_code == 409


def _gateway_config(model: Path, out: Path, **overrides: Any) -> Any:
    from agentgym.trainers.config import GrpoConfig

    values = dict(model=str(model), suite="games-calc", output_dir=str(out), steps=1, tasks_per_step=2,
                  group_size=2, eval_tasks=2, eval_every=0, checkpoint_every=0, system_prompt="",
                  max_tokens_per_turn=8, max_context_tokens=256, tensorboard=False, seed=0, learning_rate=1e-3,
                  max_in_flight=8)
    values.update(overrides)
    return GrpoConfig(**values)


def test_grpo_on_recorded_sessions_updates_the_served_model(model_dir: Path, tmp_path: Path) -> None:
    """One GRPO step whose episodes the openai-only agent played through the gateway: the sessions are on disk,
    they became the step's trajectories, and the update changed the parameters with a finite loss."""
    from agentgym.trainers.gateway import GatewayGrpoTrainer

    def agent(base_url: str) -> None:
        """A black box that asks the model once (recorded), then answers itself in every other session: the
        sessions' rewards differ, so GRPO has a signal even from an untrained model."""
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            question = client.post("/env/reset", body={}, cast_to=object)["observation"]
            text = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}],
                                                  max_tokens=8).choices[0].message.content
            a, b = re.findall(r"\d+", question)
            solve = int(base_url.split("/s/")[1].split("/")[0].rsplit("-", 1)[1]) % 2 == 0
            assert text is not None  # the model's reply is recorded; the agent's own answer is what the env gets
            client.post("/env/step", body={"action": f"answer({int(a) * int(b) if solve else 0})"}, cast_to=object)

    trainer = GatewayGrpoTrainer(_gateway_config(model_dir, tmp_path / "run"), agent)
    summary = trainer.train()
    sessions = sorted(p.stem for p in (tmp_path / "run" / "sessions").glob("s0-*.jsonl"))
    assert sessions == ["s0-0", "s0-1", "s0-2", "s0-3"]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "train/loss" in m)
    assert step["gateway/sessions"] == 4 and step["gateway/calls"] == 4 and step["train/success_rate"] == 0.5
    assert torch.isfinite(torch.tensor(step["train/loss"]))
    from agentgym.models.tiny import load_tiny_model

    start, _ = load_tiny_model(model_dir)
    trained, _ = load_tiny_model(tmp_path / "run" / "model")
    changed = [n for (n, a), (_, b) in zip(start.named_parameters(), trained.named_parameters()) if not torch.equal(a, b)]
    assert changed, "the GRPO step on recorded sessions changed no parameter"
    assert summary["eval_before"]["sessions_ended"] == 2 and summary["eval_before"]["success_rate"] == 0.5


@pytest.mark.slow
def test_grpo_through_the_gateway_improves_held_out_success(tmp_path: Path) -> None:
    """The quickstart recipe with the openai-only agent program playing every episode through the gateway:
    BC warm start, then GRPO on the recorded sessions; the agent's held-out success must rise."""
    from agentgym.trainers.gateway import GatewayGrpoTrainer

    model = build_tiny_model(tmp_path / "model", texts=demonstration_texts("games-calc", 300))
    config = _gateway_config(model, tmp_path / "run", warmstart="bc", bc_demos=200, bc_shortcut_fraction=0.5,
                             bc_steps=500, steps=10, tasks_per_step=16, group_size=8, learning_rate=3e-4,
                             warmup_steps=5, max_tokens_per_turn=24, eval_tasks=60, max_in_flight=128)
    summary = GatewayGrpoTrainer(config, lambda url: gateway_agent.play(url, max_tokens=24)).train()
    before, after = summary["eval_before"]["success_rate"], summary["eval_after"]["success_rate"]
    assert after - before >= 0.2, (before, after)
    assert summary["eval_after"]["mismatches"] <= 0.1 * summary["eval_after"]["sessions_ended"]


def test_cli_records_another_server_through_the_proxy_mode(hf_policy: Any, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`agentgym serve --proxy URL --record DIR` in a subprocess, in front of a (scripted) upstream server."""
    import socket
    import subprocess
    import time

    from agentgym.cli import main

    assert main(["serve", "--proxy", "http://127.0.0.1:1/v1"]) == 2
    assert "--record DIR" in capsys.readouterr().err
    assert main(["serve"]) == 2 and "MODEL_DIR" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ServerThread(CalcScript(hf_policy.tokenizer), model_name="script") as upstream:
        proc = subprocess.Popen([sys.executable, "-m", "agentgym.cli", "serve", "--proxy", upstream.base_url,
                                 "--record", str(tmp_path / "rec"), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
                time.sleep(0.2)
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/s/cli-1/v1", api_key="unused") as client:
                reply = client.chat.completions.create(model="script",
                                                       messages=[{"role": "user", "content": "What is 12*34?"}])
            assert reply.choices[0].message.content == "calc(12*34)"
        finally:
            proc.terminate()
            proc.wait(30)
    call = [json.loads(line) for line in (tmp_path / "rec" / "cli-1.jsonl").read_text().splitlines()][-1]
    assert call["type"] == "call" and call["text"] == "calc(12*34)" and call["ids_source"] == "server"
    assert hf_policy.tokenizer.decode(call["token_ids"], skip_special_tokens=True) == "calc(12*34)"
