"""Gateway sessions cannot be hijacked: a session's name is not its credential, its token is.

Another client that knows (or guesses) a session's name cannot record calls into it, step its env, end it with a
reward, or read it; nobody learns where sessions are stored; with an API key, the gateway refuses clients without
it. All through the ``openai`` package, as the agents that use the gateway talk to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.serving.gateway import SESSION_HEADER, TOKEN_HEADER  # noqa: E402
from agentgym.serving.openai_server import ServerThread  # noqa: E402
from agentgym.serving.sessions import read_session  # noqa: E402
from tests.serving.test_gateway import CalcScript  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
QUESTION = [{"role": "user", "content": "What is 12*34?"}]


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> CalcScript:
    from agentgym.policies.hf import HFPolicy

    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 20),
                             config=SMALL)
    return CalcScript(HFPolicy.from_pretrained(str(model)).tokenizer)


def _calls(record: Path, session: str) -> list[dict[str, Any]]:
    return [r for r in read_session(record / f"{session}.jsonl") if r["type"] == "call"]


def test_another_client_cannot_record_step_end_or_read_a_session(script: CalcScript, tmp_path: Path) -> None:
    record = tmp_path / "sessions"
    with ServerThread(script, model_name="script", record_dir=record) as server:
        root = server.base_url.removesuffix("/v1")
        opened = httpx.post(root + "/v1/sessions", json={"session": "alice", "suite": "games-calc", "split": "test",
                                                         "task_id": "test-00003", "seed": 3}).json()
        assert len(opened["token"]) >= 32 and opened["base_url"] == f"{root}/s/alice/{opened['token']}/v1"
        with openai.OpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0) as alice:
            alice.post("/env/reset", body={}, cast_to=object)
            alice.chat.completions.create(model="script", messages=QUESTION)
            summary = alice.get("/session", cast_to=object)
        assert summary["calls"] == 1 and "path" not in summary and str(record) not in str(summary)

        # Mallory knows the name "alice" and tries every way of naming it, without the token or with a guess.
        guessed = "A" * 43
        urls = [f"{root}/s/alice/v1", f"{root}/s/alice/{guessed}/v1", f"{root}/v1"]
        for url in urls:
            headers = {SESSION_HEADER: "alice"} | ({TOKEN_HEADER: guessed} if url.endswith("/s/alice/v1") else {})
            with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, default_headers=headers) as mallory:
                with pytest.raises(openai.PermissionDeniedError, match="needs its token") as refused:
                    mallory.chat.completions.create(model="script", messages=QUESTION, user="alice")
                assert str(record) not in str(refused.value)
                with pytest.raises(openai.PermissionDeniedError):
                    mallory.post("/env/step", body={"action": "answer(408)"}, cast_to=object)
                with pytest.raises(openai.PermissionDeniedError):
                    mallory.post("/session/reward", body={"reward": 1.0, "success": True}, cast_to=object)
                with pytest.raises(openai.PermissionDeniedError):
                    mallory.get("/session", cast_to=object)
        health = httpx.get(root + "/health").json()
        assert health == {"status": "ok"}

        # Nothing of Mallory's reached Alice's record; Alice's session goes on and ends with the env's outcome.
        assert len(_calls(record, "alice")) == 1
        assert not [r for r in read_session(record / "alice.jsonl") if r["type"] in ("step", "end")]
        with openai.OpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0) as alice:
            end = alice.post("/env/step", body={"action": "answer(0)"}, cast_to=object)
        assert end["done"] and end["outcome"]["end_reason"]
        ends = [r for r in read_session(record / "alice.jsonl") if r["type"] == "end"]
        assert len(ends) == 1 and ends[0]["source"] == "env"


def test_a_session_created_by_its_first_call_hands_its_token_to_that_client_only(script: CalcScript,
                                                                                  tmp_path: Path) -> None:
    record = tmp_path / "sessions"
    with ServerThread(script, model_name="script", record_dir=record) as server:
        with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            raw = client.chat.completions.with_raw_response.create(model="script", messages=QUESTION, user="bob")
            token = raw.headers[TOKEN_HEADER]
            assert len(token) >= 32
            with pytest.raises(openai.PermissionDeniedError, match=TOKEN_HEADER):
                client.chat.completions.create(model="script", messages=QUESTION, user="bob")
            again = client.chat.completions.with_raw_response.create(
                model="script", messages=QUESTION, user="bob", extra_headers={TOKEN_HEADER: token})
            assert TOKEN_HEADER not in again.headers  # issued once, to the session's creator
            with pytest.raises(openai.PermissionDeniedError, match="URL-safe"):
                client.chat.completions.create(model="script", messages=QUESTION, user="carol",
                                               extra_headers={TOKEN_HEADER: "short"})
        assert len(_calls(record, "bob")) == 2
        assert not (record / "carol.jsonl").exists()


def test_client_env_kwargs_cannot_reach_server_files(script: CalcScript, tmp_path: Path) -> None:
    """Keyword arguments of an env can name files (a Harbor task folder, sandbox mounts): clients set none but
    max_turns."""
    with ServerThread(script, model_name="script", record_dir=tmp_path / "rec") as server:
        root = server.base_url.removesuffix("/v1")
        bad = httpx.post(root + "/v1/sessions", json={"env": "agentgym/Calculator-v0",
                                                      "env_kwargs": {"tasks": [{"id": "x", "prompt": "p"}]}})
        assert bad.status_code == 400 and "max_turns" in bad.json()["error"]["message"]
        good = httpx.post(root + "/v1/sessions", json={"env": "agentgym/Calculator-v0",
                                                       "env_kwargs": {"max_turns": 2}})
        assert good.status_code == 200


def test_the_api_key_is_required_when_set(script: CalcScript, tmp_path: Path) -> None:
    from agentgym.serving.gateway import create_gateway_app
    from agentgym.serving.http import BackgroundServer

    key = "gateway-key-0123456789"
    with ServerThread(script, model_name="script") as upstream:
        app = create_gateway_app(upstream.base_url, tmp_path / "rec", api_key=key)
        with BackgroundServer(app, ready_path="/health") as gateway:
            root = gateway.url
            assert httpx.get(root + "/health").status_code == 200
            assert httpx.post(root + "/v1/sessions", json={}).status_code == 401
            with openai.OpenAI(base_url=root + "/v1", api_key="wrong-key-0123456789", max_retries=0) as client:
                with pytest.raises(openai.AuthenticationError):
                    client.chat.completions.create(model="script", messages=QUESTION, user="k1")
            opened = httpx.post(root + "/v1/sessions", json={}, headers={"Authorization": f"Bearer {key}"}).json()
            with openai.OpenAI(base_url=opened["base_url"], api_key=key, max_retries=0) as client:
                reply = client.chat.completions.create(model="script", messages=QUESTION)
            assert reply.choices[0].message.content == "calc(12*34)"
    assert not (tmp_path / "rec" / "k1.jsonl").exists()


def test_the_proxy_gateway_takes_the_api_key_and_caps_bodies_before_forwarding(tmp_path: Path) -> None:
    """``agentgym serve --proxy URL --record DIR --api-key KEY`` runs this app: no key is 401, a huge body 413.

    The upstream is an address nothing listens on, so a request that reached the proxying code would fail
    differently (502): both refusals happen before the gateway reads or forwards anything.
    """
    from fastapi.testclient import TestClient

    from agentgym.cli.main import build_parser
    from agentgym.serving.gateway import create_gateway_app

    args = build_parser().parse_args(["serve", "--proxy", "http://127.0.0.1:9", "--record", str(tmp_path),
                                      "--api-key", "k" * 24, "--max-body-bytes", "1000"])
    assert (args.api_key, args.max_body_bytes) == ("k" * 24, 1000)
    app = create_gateway_app(args.proxy, tmp_path / "rec", api_key=args.api_key, max_body_bytes=args.max_body_bytes)
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json={}).status_code == 401
        big = client.post("/v1/chat/completions", headers={"Authorization": "Bearer " + "k" * 24},
                          content=b"{" + b" " * 5000 + b"}")
        assert big.status_code == 413 and "1000 bytes" in big.json()["error"]["message"]
        assert client.get("/health").status_code == 200
