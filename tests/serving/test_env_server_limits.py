"""``agentgym serve-env`` cannot be starved or made to read server files, and its API key holds on HTTP and WS.

Each test runs a real server process (``agentgym serve-env`` on loopback) and real clients: ``websockets`` and
agentgym's OpenEnv client. A second client is a second remote address: the whole 127.0.0.0/8 block is local, so a
client bound to 127.0.0.2 reaches the server from another address.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import pytest

from agentgym.serving.remote_env import EnvServerProcess, launch_env_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                reason="openenv-core is not installed (pip install 'agentgym[serve-env]')")

CALC = "agentgym/Calculator-v0"
KEY = "env-server-key-0123456789"


def serve_env_with_defaults(*args: str, env: dict[str, str] | None = None) -> EnvServerProcess:
    """``agentgym serve-env CALC --port 0 ARGS``: the command's own defaults, not the launcher's."""
    command = [sys.executable, "-m", "agentgym.cli", "serve-env", CALC, "--port", "0", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    assert process.stdout is not None
    line = process.stdout.readline()
    assert " on " in line, f"serve-env printed {line!r}"
    return EnvServerProcess(process, line.split(" on ", 1)[1].split()[0])


def ws_url(server: EnvServerProcess) -> str:
    return server.url.replace("http", "ws", 1) + "/ws"


def sessions(server: EnvServerProcess, **headers: str) -> dict[str, Any]:
    return httpx.get(server.url + "/sessions", headers=headers, timeout=10).json()


def wait_for(predicate: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_64_idle_sessions_from_one_client_do_not_lock_out_another() -> None:
    """With the defaults (64 sessions, idle timeout on), a client that opens 64 sessions and sends nothing gets
    half of them and a clear refusal; a client from another address still plays an episode."""
    from websockets.sync.client import connect

    with serve_env_with_defaults() as server, ExitStack() as held:
        sockets = [held.enter_context(connect(ws_url(server), open_timeout=30)) for _ in range(64)]
        answers: list[Any] = [None] * 64  # None: an open session, waiting for its first message

        def poll() -> int:
            for i, ws in enumerate(sockets):
                if answers[i] is None:
                    try:
                        answers[i] = json.loads(ws.recv(timeout=0))
                    except TimeoutError:
                        pass
            return sum(a is not None for a in answers)

        deadline = time.monotonic() + 30
        while poll() < 32 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # room for a 33rd refusal, which must not come
        poll()
        refused = [a for a in answers if a is not None]
        assert answers.count(None) == 32 and len(refused) == 32
        assert refused[0]["data"]["code"] == "CLIENT_LIMIT_REACHED"
        assert "--max-sessions-per-client" in refused[0]["data"]["message"]
        status = sessions(server)
        assert status["active_sessions"] == 32 and status["max_sessions_per_client"] == 32
        assert status["idle_timeout_s"] == 600

        with connect(ws_url(server), open_timeout=30, source_address=("127.0.0.2", 0)) as other:
            other.send(json.dumps({"type": "reset", "data": {"seed": 5}}))
            first = json.loads(other.recv(timeout=30))
            assert first["type"] == "observation" and "What is" in first["data"]["observation"]["text"]
            other.send(json.dumps({"type": "step", "data": {"text": "answer(1)"}}))
            assert json.loads(other.recv(timeout=30))["data"]["done"]


def test_idle_sessions_are_closed_and_their_envs_released() -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with launch_env_server(CALC, max_sessions=4, extra_args=("--idle-timeout", "1")) as server:
        # a raw OpenEnv client that resets, then goes quiet
        with connect(ws_url(server), open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            assert sessions(server)["live_envs"] == 1
            goodbye = json.loads(ws.recv(timeout=10))
            assert goodbye["data"]["code"] == "SESSION_IDLE_TIMEOUT" and "--idle-timeout" in goodbye["data"]["message"]
            assert goodbye["data"]["message"].startswith("Session expired")
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
            assert "session expired" in closed.value.rcvd.reason
        assert wait_for(lambda: sessions(server)["live_envs"] == 0 and sessions(server)["active_sessions"] == 0)
        assert sessions(server)["idle_closed"] >= 1

        # Remote-v0 mid-episode without its keepalive: the episode ends with an error (its env is gone); the next
        # reset opens a session.
        env = gym.make("agentgym/Remote-v0", url=server.url, timeout_s=30, keepalive_s=0)
        env.reset(seed=2)
        time.sleep(2.5)
        obs, reward, terminated, _, info = env.step("answer(1)")
        assert terminated and info["outcome"]["end_reason"] == "error" and "SESSION_IDLE_TIMEOUT" in obs
        env.reset(seed=2)
        time.sleep(2.5)
        env.reset(seed=3)  # idle between episodes: a reset reconnects without complaint
        assert env.step("answer(1)")[2]
        env.close()


@pytest.mark.parametrize("task", [
    {"id": "x", "prompt": "p", "metadata": {"swebench": {"repo_path": "/work", "instance_id": "a__b-1"}}},
    {"id": "x", "prompt": "p", "metadata": {"a": 1, "b": 2, "op": "*", "repo_path": "/etc"}},
    {"id": "x", "prompt": "p", "metadata": {"a": 1, "b": 2, "op": "/etc/passwd"}},
    {"id": "x", "prompt": "p", "metadata": {"a": 1, "b": 2, "op": "*"}, "source_file": "x"},
])
def test_reset_options_that_name_server_paths_are_refused(task: dict[str, Any], calc_server: Any) -> None:
    from websockets.sync.client import connect

    made = sessions(calc_server)["envs_made"]
    with connect(ws_url(calc_server), open_timeout=30) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 1, "options": {"task": task}}}))
        answer = json.loads(ws.recv(timeout=30))
    assert answer["type"] == "error"
    assert "location" in answer["data"]["message"] or "not a field" in answer["data"]["message"] \
        or "Unknown task field" in answer["data"]["message"]
    assert sessions(calc_server)["envs_made"] == made  # refused before any env was made


def test_a_client_task_as_data_is_still_played(calc_server: Any) -> None:
    env = gym.make("agentgym/Remote-v0", url=calc_server.url, timeout_s=30)
    obs, info = env.reset(options={"task": {"id": "mine", "prompt": "What is 6*7?",
                                            "answer": 42, "metadata": {"a": 6, "b": 7, "op": "*"}}})
    assert info["task_id"] == "mine" and env.step("answer(42)")[1] > 0
    env.close()


@pytest.fixture(scope="module")
def calc_server() -> Any:
    with launch_env_server(CALC, max_sessions=8) as server:
        yield server


def test_swe_server_refuses_a_task_that_points_at_a_server_repository(tmp_path: Path) -> None:
    """The attack: a SWE-bench-format task whose repo_path is a git repository on the server."""
    from websockets.sync.client import connect

    repo = Path(__file__).resolve().parents[2]  # this checkout: a git repository on the "server"
    task = {"id": "steal", "prompt": "read it", "metadata": {"swebench": {
        "instance_id": "x__y-1", "repo": "x/y", "repo_path": str(repo), "base_commit": "HEAD",
        "patch": "", "test_patch": "", "FAIL_TO_PASS": [], "PASS_TO_PASS": []}}}
    with launch_env_server("agentgym/SWE-v1", max_sessions=2) as server:
        with connect(ws_url(server), open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 0, "options": {"task": task}}}))
            answer = json.loads(ws.recv(timeout=120))
        assert answer["type"] == "error" and "repo_path" in answer["data"]["message"]
        assert sessions(server)["envs_made"] == 0


def test_the_api_key_holds_on_http_and_websocket() -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from agentgym.serving.env_server import EnvServerError

    with serve_env_with_defaults(env={"AGENTGYM_API_KEY": KEY}) as server:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert httpx.get(server.url + "/sessions", timeout=10).status_code == 401
        assert httpx.get(server.url + "/sessions", headers={"Authorization": "Bearer wrong-key-123456"},
                         timeout=10).status_code == 401
        assert httpx.post(server.url + "/reset", json={}, timeout=10).status_code == 401
        assert sessions(server, Authorization=f"Bearer {KEY}")["active_sessions"] == 0
        with pytest.raises(InvalidStatus):
            connect(ws_url(server), open_timeout=30)
        with pytest.raises(InvalidStatus):
            connect(ws_url(server), open_timeout=30, subprotocols=["agentgym.key.wrong-key-123456"])
        # header and subprotocol (the server answers with the subprotocol, as RFC 6455 clients require)
        with connect(ws_url(server), open_timeout=30, additional_headers={"x-api-key": KEY}) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        with connect(ws_url(server), open_timeout=30, subprotocols=[f"agentgym.key.{KEY}"]) as ws:
            assert ws.subprotocol == f"agentgym.key.{KEY}"
            ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        # agentgym's OpenEnv client and Remote-v0
        with pytest.raises(EnvServerError, match="API key") as refused:
            gym.make("agentgym/Remote-v0", url=server.url, api_key="")
        assert refused.value.code == "UNAUTHORIZED"
        env = gym.make("agentgym/Remote-v0", url=server.url, api_key=KEY)
        env.reset(seed=1)
        assert env.step("answer(1)")[2]
        env.close()


def test_mcp_is_off_so_anonymous_posts_create_no_sessions() -> None:
    """openenv-core's /mcp made a server session per anonymous POST, outside every /ws limit: 3 POSTs filled a
    3-session server for good. It is answered 404 (HTTP and WebSocket), and the server stays free for /ws clients."""
    from openenv.core import GenericEnvClient
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with launch_env_server(CALC, max_sessions=3) as server:
        for i in range(5):
            answer = httpx.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": i, "params": {},
                                                           "method": "openenv/session/create"}, timeout=30)
            assert answer.status_code == 404 and answer.json()["code"] == "MCP_NOT_SERVED"
        with connect(ws_url(server).replace("/ws", "/mcp"), open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=30))["data"]["code"] == "MCP_NOT_SERVED"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404
        assert sessions(server)["active_sessions"] == 0
        clients = [GenericEnvClient(base_url=server.url).sync() for _ in range(3)]
        try:
            for client in clients:  # all three sessions are still there for real clients
                client.connect()
                assert client.reset(seed=1).observation["text"]
        finally:
            for client in clients:
                client.close()


def test_http_reset_and_step_answer_4xx_with_the_reason() -> None:
    with launch_env_server(CALC, max_sessions=2) as server:
        step = httpx.post(server.url + "/step", json={"action": {"text": "answer(1)"}}, timeout=60)
        assert step.status_code == 400 and "reset" in step.json()["detail"] and "/ws" in step.json()["detail"]
        reset = httpx.post(server.url + "/reset", json={"options": {"task_id": "no-such-task"}}, timeout=60)
        assert reset.status_code == 400 and "Unknown task_id" in reset.json()["detail"]
        unknown = httpx.post(server.url + "/reset", json={"options": {"repo_path": "/etc"}}, timeout=60)
        assert 400 <= unknown.status_code < 500, unknown.text
        assert httpx.post(server.url + "/reset", json={"seed": 1}, timeout=60).status_code == 200


def test_idle_time_is_only_waiting_for_the_client(caplog: pytest.LogCaptureFixture) -> None:
    """A 4.5 s model call against --idle-timeout 3: Remote-v0 keeps its session alive while its episode waits for
    the action; openenv-core's GenericEnvClient keeps it with a state request, and without one it gets a clear
    'session expired' close; Remote-v0 reconnects by itself on the next reset after an expiry, and logs it."""
    import logging

    from openenv.core import GenericEnvClient
    from websockets.exceptions import ConnectionClosed

    with launch_env_server(CALC, max_sessions=4, extra_args=("--idle-timeout", "3")) as server:
        env = gym.make("agentgym/Remote-v0", url=server.url, timeout_s=30)
        _, info = env.reset(seed=2)
        time.sleep(4.5)  # the model thinks
        obs, _, terminated, _, info = env.step("calc(1+1)")
        assert not terminated, obs
        assert "error" not in str(info.get("outcome", {}))
        assert sessions(server)["idle_closed"] == 0

        client = GenericEnvClient(base_url=server.url).sync()
        client.connect()
        client.reset(seed=1)
        for _ in range(4):  # 4.8 s of thinking, with a state request every 1.2 s
            time.sleep(1.2)
            client.state()
        assert not client.step({"text": "calc(1+1)"}).done
        time.sleep(4.5)  # no message at all: the session expires
        with pytest.raises(ConnectionClosed) as closed:
            client.step({"text": "calc(1+1)"})
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
        assert "session expired" in closed.value.rcvd.reason
        client.close()

        # between episodes Remote-v0 sends nothing: its session expires, and the next reset opens another
        env.step("answer(2)")
        time.sleep(4.5)
        with caplog.at_level(logging.WARNING, logger="agentgym.serving.remote_env"):
            env.reset(seed=3)
        assert any("expired" in r.message and "reconnected" in r.message for r in caplog.records)
        assert not env.step("calc(1+1)")[2]
        env.close()
