"""A served model carries the settings it was trained with: ``agentgym serve`` publishes its ``agentgym.json``,
``OpenAIPolicy`` and ``agentgym eval`` apply them unless told otherwise, and ``serve`` says what it is doing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli import main  # noqa: E402
from agentgym.policies.openai import OpenAIPolicy  # noqa: E402
from agentgym.serving.openai_server import ServerThread  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRAINED = {"system_prompt": "", "max_tokens": 7, "suite": "games-calc"}


def _tiny(path: Path) -> Path:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    return build_tiny_model(path, config=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                         intermediate_size=64, vocab_size=400))


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentgym.policies.rollout_defaults import save_rollout_defaults

    path = _tiny(tmp_path_factory.mktemp("trained") / "model")
    save_rollout_defaults(path, **TRAINED)
    return path


class PromptSpy:
    """The served policy, recording every prompt it is asked to continue (to see what clients really send), on the
    batched path and the continuous one."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy
        self.prompts: list[str] = []
        self.max_tokens: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def generate(self, prompts: Any, sampling: Any, **kwargs: Any) -> Any:
        samplings = sampling if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
        self.prompts += [self._policy.tokenizer.decode(list(p)) for p in prompts]
        self.max_tokens += [s.max_tokens for s in samplings]
        return self._policy.generate(prompts, sampling, **kwargs)

    def continuous_submit(self, prompt: Any, sampling: Any, **kwargs: Any) -> Any:
        """The server's continuous-batching path: one sequence at a time."""
        self.prompts.append(self._policy.tokenizer.decode(list(prompt)))
        self.max_tokens.append(sampling.max_tokens)
        return self._policy.continuous_submit(prompt, sampling, **kwargs)


@pytest.fixture(scope="module")
def spied(trained_dir: Path) -> Any:
    from agentgym.policies.hf import HFPolicy
    from agentgym.serving.openai_defaults import served_defaults

    policy = HFPolicy.from_pretrained(str(trained_dir))
    spy = PromptSpy(policy)
    with ServerThread(spy, model_name="model", defaults=served_defaults(trained_dir, policy)) as server:
        yield server, spy


def test_a_served_model_dir_publishes_its_training_settings(trained_dir: Path) -> None:
    with ServerThread(trained_dir) as server:
        card = httpx.get(server.base_url + "/models").json()["data"][0]
        published = httpx.get(server.base_url.removesuffix("/v1") + "/agentgym/defaults").json()
    assert card["id"] == "model"
    assert {k: card["agentgym"][k] for k in TRAINED} == TRAINED
    assert card["agentgym"]["chat_template"] is True and card["agentgym"]["max_model_len"] == card["max_model_len"]
    assert published == {"model": "model", "defaults": card["agentgym"]}


def test_a_model_dir_without_settings_publishes_none_and_bad_values_are_dropped(tmp_path: Path) -> None:
    plain = _tiny(tmp_path / "plain")
    with ServerThread(plain) as server:
        card = httpx.get(server.base_url + "/models").json()["data"][0]
        assert "agentgym" not in card
        assert OpenAIPolicy(server.base_url).fetch_server_defaults() == {}
    from agentgym.serving.openai_defaults import served_defaults

    (plain / "agentgym.json").write_text(json.dumps({"system_prompt": 5, "max_tokens": "x", "suite": "games-calc"}))
    assert "system_prompt" not in served_defaults(plain, None) and "max_tokens" not in served_defaults(plain, None)


def test_openai_policy_takes_the_servers_system_prompt_and_reports_max_tokens(spied: Any) -> None:
    server, _ = spied
    policy = OpenAIPolicy(server.base_url)  # no model: discovered with the defaults
    assert policy.default_system_prompt is None
    found = policy.fetch_server_defaults()
    assert policy.model == "model" and found["max_tokens"] == 7 and policy.default_system_prompt == ""
    assert policy.server_defaults == found


def _eval(url: str, out: Path, *flags: str) -> dict[str, Any]:
    code = main(["eval", "--suite", "games-calc", "--policy", f"openai:{url}#model", "--limit", "2",
                 "--out", str(out), "--no-progress", *flags])
    assert code == 0
    return json.loads((out / "summary.json").read_text())


def test_eval_through_the_server_prompts_the_model_as_it_was_trained(spied: Any, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Without the published settings the eval sent the env's long instructions and 256 tokens a turn."""
    import agentgym

    env = agentgym.make("agentgym/Calculator-v0")
    instructions = env.reset(seed=0)[1]["instructions"]
    env.close()
    server, spy = spied
    spy.prompts.clear(), spy.max_tokens.clear()
    _eval(server.base_url, tmp_path / "a")
    assert "using the server's defaults for model: system prompt '', max tokens 7" in capsys.readouterr().err
    assert spy.max_tokens and set(spy.max_tokens) == {7}
    assert not any(instructions[:60] in p for p in spy.prompts), spy.prompts[0]


def test_explicit_flags_win_over_the_servers_settings(spied: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    server, spy = spied
    spy.prompts.clear(), spy.max_tokens.clear()
    _eval(server.base_url, tmp_path / "b", "--max-tokens", "5", "--system-prompt", "SYSTEM-MARK")
    assert set(spy.max_tokens) == {5}
    assert all("SYSTEM-MARK" in p for p in spy.prompts)
    assert "using the server's defaults" not in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_prints_progress_then_a_banner_with_the_settings(trained_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "agentgym.cli", "serve", str(trained_dir), "--port",
                                    str(port)], stdout=sink, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and "ready" not in log.read_text() and process.poll() is None:
            time.sleep(0.3)
        text = log.read_text()
        assert text.index("loading") < text.index("model loaded in") < text.index("is ready"), text
        for shown in (f"http://127.0.0.1:{port}/v1", "system prompt:  none (empty)", "max tokens:     7 per turn",
                      "context:", "limits:", "no API key"):
            assert shown in text, text
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def test_fetching_settings_from_a_server_without_models_or_from_no_server() -> None:
    """A proxy without ``GET /models`` publishes nothing (requests may still work); no server at all is the
    error that says to start one."""
    from fastapi import FastAPI

    from agentgym.policies.openai_http import OpenAIServerError
    from agentgym.serving.http import BackgroundServer

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    server = BackgroundServer(app, host="127.0.0.1", port=0, ready_path="/health", startup_timeout_s=60)
    url = server.start()
    try:
        policy = OpenAIPolicy(url + "/v1", "model", max_retries=0)
        assert policy.fetch_server_defaults() == {} and policy.default_system_prompt is None
    finally:
        server.stop()
    with pytest.raises(OpenAIServerError, match="Check that the server is running"):
        OpenAIPolicy(url + "/v1", "model", max_retries=0, timeout_s=5).fetch_server_defaults()
