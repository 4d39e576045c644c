"""`agentgym serve` cannot be killed or monopolised by one request: oversized bodies (declared or chunked), prompts,
``n`` and token budgets are refused at once and the server keeps serving; an API key guards every route but /health.

The attacks run against a real server process (``python -m agentgym.cli serve`` on the tiny model) whose address
space is capped with ``setrlimit(RLIMIT_AS)``, so a regression shows up as a dead or bloated server, never as a
machine that swaps; its peak memory is read from ``/proc/<pid>/status`` (``VmHWM``, see proc(5)).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.serving.limits import RequestLimits  # noqa: E402

MODEL = "tiny-limits"
KEY = "test-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO = Path(__file__).resolve().parents[2]
#: The server process may map at most this much: enough for torch and the tiny model (about 1.2 GB mapped, 0.45 GB
#: resident), far less than parsing and tokenising a 100 MB prompt took before bodies were capped (17.5 GB).
ADDRESS_SPACE_BYTES = 6 * 1024**3
#: A per-request budget small enough to hit with an ordinary request (set with the CLI flag, so it is tested too).
BUDGET = 20_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return Path(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cap_address_space() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = self.root + "/v1"

    def peak_rss_kb(self) -> int:
        """VmHWM: the most resident memory the process has had (proc(5))."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM in /proc/<pid>/status")

    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.fixture(scope="module")
def served(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = _free_port()
    # The key comes from the environment (the --api-key flag is checked by test_cli_flags_are_validated).
    env = {**os.environ, "AGENTGYM_API_KEY": KEY, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
           "PYTHONPATH": str(REPO)}
    log = (tmp_path_factory.mktemp("log") / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", "serve", str(model_dir), "--port", str(port), "--model-name", MODEL,
         "--max-request-tokens", str(BUDGET)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_cap_address_space,
    )
    server = Served(proc, port)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(server.root + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.alive(), Path(log.name).read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not start within 180 s"
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _completion_ok(server: Served) -> None:
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60) as client:
        reply = client.completions.create(model=MODEL, prompt="What is 12 + 30?", max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1


def _raw_prompt_body(n_bytes: int) -> bytes:
    """A completions body whose prompt is ``n_bytes`` of ASCII (built directly: json.dumps of it takes a while)."""
    return b'{"model": "' + MODEL.encode() + b'", "max_tokens": 1, "prompt": "' + b"x" * n_bytes + b'"}'


def _error(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


# ---- body size ---------------------------------------------------------------------------------------


def test_a_100mb_prompt_is_refused_unread_and_the_server_keeps_serving(served: Served) -> None:
    _completion_ok(served)  # warm: the baseline peak includes a generation
    baseline_kb = served.peak_rss_kb()
    start = time.monotonic()
    resp = httpx.post(served.base_url + "/completions", content=_raw_prompt_body(100_000_000),
                      headers={**AUTH, "content-type": "application/json"}, timeout=60)
    elapsed = time.monotonic() - start
    assert resp.status_code == 413, resp.text[:500]
    error = _error(resp)
    assert error["code"] == "request_too_large" and "8388608 bytes" in error["message"]
    assert "--max-body-bytes" in error["message"]
    assert elapsed < 10, elapsed  # the upload itself, over loopback; the server reads none of it into memory
    assert served.alive()
    grown_mb = (served.peak_rss_kb() - baseline_kb) / 1024
    assert grown_mb < 100, f"peak RSS grew by {grown_mb:.0f} MB for a refused body"
    _completion_ok(served)
    assert served.alive()
    metrics = httpx.get(served.root + "/metrics", headers=AUTH).text
    assert 'agentgym:http_responses_total{model_name="tiny-limits",endpoint="/v1/completions",status="413"}' in metrics


def test_a_10mb_prompt_is_refused_within_two_seconds(served: Served) -> None:
    start = time.monotonic()
    resp = httpx.post(served.base_url + "/chat/completions", headers=AUTH, timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "y" * 10_000_000}]})
    assert time.monotonic() - start < 2.0
    assert resp.status_code == 413 and _error(resp)["code"] == "request_too_large"
    _completion_ok(served)


def test_a_chunked_body_without_content_length_is_counted_and_refused(served: Served) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(20):  # 20 MiB in all, with no Content-Length
            yield b"z" * 1024 * 1024
        yield b'"}'

    start = time.monotonic()
    resp = httpx.post(served.base_url + "/completions", content=chunks(),
                      headers={**AUTH, "content-type": "application/json"}, timeout=60)
    assert resp.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in resp.request.headers
    assert resp.status_code == 413, resp.text[:500]
    assert "--max-body-bytes" in _error(resp)["message"]
    assert time.monotonic() - start < 10
    _completion_ok(served)


def test_a_chunked_body_within_the_limit_still_works(served: Served) -> None:
    body = json.dumps({"model": MODEL, "prompt": "What is 12 + 30?", "max_tokens": 2}).encode()
    resp = httpx.post(served.base_url + "/completions", content=iter([body[:10], body[10:]]),
                      headers={**AUTH, "content-type": "application/json"}, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1


# ---- prompt size, n and the token budget ----------------------------------------------------------------


def test_a_prompt_under_the_body_limit_but_over_the_character_limit_is_refused_before_tokenising(
        served: Served) -> None:
    # 4 MB of text: tokenising it would take seconds; the character count refuses it at once.
    for payload in ({"prompt": "w" * 4_000_000}, {"prompt": ["v" * 400_000] * 5},
                    {"messages": [{"role": "user", "content": "u" * 1_500_000}]}):
        path = "/chat/completions" if "messages" in payload else "/completions"
        start = time.monotonic()
        resp = httpx.post(served.base_url + path, headers=AUTH, timeout=60,
                          json={"model": MODEL, "max_tokens": 1, **payload})
        assert time.monotonic() - start < 2.0
        assert resp.status_code == 400, resp.text[:500]
        error = _error(resp)
        assert error["code"] == "context_length_exceeded" and "--max-prompt-chars" in error["message"]
    resp = httpx.post(served.root + "/tokenize", headers=AUTH, json={"prompt": "t" * 2_000_000}, timeout=60)
    assert resp.status_code == 400 and "--max-prompt-chars" in _error(resp)["message"]


def test_n_1000_is_refused_at_once(served: Served) -> None:
    with openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0, timeout=60) as client:
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=16, n=1000)
        assert time.monotonic() - start < 2.0
        with pytest.raises(openai.BadRequestError, match="--max-n"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           n=129)
    message = info.value.body["message"]  # type: ignore[index]
    assert "at most 128" in message and "--max-n" in message
    stats = httpx.get(served.root + "/health").json()
    assert stats["queued"] == 0 and stats["running"] == 0


def test_a_request_over_the_token_budget_is_refused(served: Served) -> None:
    with openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0, timeout=60) as client:
        start = time.monotonic()
        # 100 x (prompt + 1000) > 20,000, with n well under --max-n.
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=1000, n=100)
        assert time.monotonic() - start < 2.0
        message = info.value.body["message"]  # type: ignore[index]
        assert f"budget of {BUDGET} tokens" in message and "--max-request-tokens" in message
        # A chat request without max_tokens reserves the rest of the 2048-token context for each choice.
        with pytest.raises(openai.BadRequestError, match="--max-request-tokens"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=16)
        # Batched prompts count together: 4 prompts x n=5 x (prompt + 1000) > 20,000.
        with pytest.raises(openai.BadRequestError, match="--max-request-tokens"):
            client.completions.create(model=MODEL, prompt=["a", "b", "c", "d"], max_tokens=1000, n=5)
        # Within the budget it runs.
        reply = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=4, temperature=1.0)
        assert len(reply.choices) == 4


def test_thousands_of_stop_strings_or_stop_token_ids_are_refused(served: Served) -> None:
    # The policy checks every stop string at every decoding step of every row: 10,000 of them would hold the model.
    for extra, param in (({"stop": [f"s{i}" for i in range(10_000)]}, "stop"),
                         ({"stop_token_ids": list(range(100_000))}, "stop_token_ids")):
        start = time.monotonic()
        resp = httpx.post(served.base_url + "/completions", headers=AUTH, timeout=60,
                          json={"model": MODEL, "prompt": "hi", "max_tokens": 200, **extra})
        assert time.monotonic() - start < 2.0
        assert resp.status_code == 400 and _error(resp)["param"] == param, resp.text[:300]
        assert "at most" in _error(resp)["message"]


# ---- the API key -----------------------------------------------------------------------------------------


def test_the_api_key_is_required_everywhere_but_health(served: Served) -> None:
    assert httpx.get(served.root + "/health").status_code == 200
    with openai.OpenAI(base_url=served.base_url, api_key="wrong-key-0123456789", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    for path in ("/metrics", "/tokenize"):
        assert httpx.request("GET" if path == "/metrics" else "POST", served.root + path, json={"prompt": "a"}
                             ).status_code == 401
    with openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0, timeout=60) as client:
        assert [m.id for m in client.models.list().data] == [MODEL]
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2)
        assert reply.choices[0].message.role == "assistant"
    # x-api-key is the header the anthropic package sends (this server has no /v1/messages to try it on).
    resp = httpx.post(served.base_url + "/completions", headers={"x-api-key": KEY}, timeout=60,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 200, resp.text


def test_an_unauthenticated_huge_body_is_refused_before_it_is_read(served: Served) -> None:
    start = time.monotonic()
    resp = httpx.post(served.base_url + "/completions", content=_raw_prompt_body(50_000_000),
                      headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 401 and time.monotonic() - start < 10
    assert served.alive()


# ---- configuration ---------------------------------------------------------------------------------------


def test_limits_are_validated_with_the_flag_named() -> None:
    with pytest.raises(ConfigError, match="--max-n"):
        RequestLimits(max_n=0)
    with pytest.raises(ConfigError, match="--max-body-bytes"):
        RequestLimits(max_body_bytes=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--max-request-tokens"):
        RequestLimits(max_request_tokens=-5)
    with pytest.raises(ConfigError, match="--max-prompt-chars"):
        RequestLimits(max_prompt_chars=1.5)  # type: ignore[arg-type]


def test_create_app_checks_its_limits_and_key(model_dir: Path) -> None:
    from agentgym.policies.hf import HFPolicy
    from agentgym.serving.openai_app import create_app

    policy = HFPolicy.from_pretrained(str(model_dir))
    with pytest.raises(ConfigError, match="at least 8 characters"):
        create_app(policy, model_name="m", api_key="short")
    with pytest.raises(ConfigError, match="RequestLimits"):
        create_app(policy, model_name="m", limits={"max_n": 4})  # type: ignore[arg-type]
    app = create_app(policy, model_name="m", limits=RequestLimits(max_n=4))
    assert app.state.limits.max_n == 4


def test_cli_flags_are_validated(capsys: pytest.CaptureFixture[str], model_dir: Path) -> None:
    from agentgym.cli import main

    for flag, value in (("--max-n", "0"), ("--max-body-bytes", "8MiB"), ("--max-prompt-chars", "-1"),
                        ("--max-request-tokens", "1e6")):
        with pytest.raises(SystemExit) as info:  # argparse: usage and the reason, exit status 2
            main(["serve", str(model_dir), flag, value])
        assert info.value.code == 2 and flag in capsys.readouterr().err
    assert main(["serve", str(model_dir), "--api-key", "short"]) == 2
    assert "at least 8 characters" in capsys.readouterr().err
