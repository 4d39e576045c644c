"""``agentgym serve-env``: envs behind OpenEnv's protocol, driven by OpenEnv's own client and by Remote-v0.

Servers run as child processes on loopback (``launch_env_server``), started and stopped here. Importing
``openenv-core`` costs ~9 s of CPU (it imports gradio), so one server serves most tests of this module.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest

import agentgym
from agentgym.errors import EnvCrashed
from agentgym.serving.remote_env import launch_env_server
from tests.helpers.scripts import load_script

# openenv-core imports gradio (~12 s of CPU): imported inside the tests, so the xdist workers that only collect this
# module do not pay for it.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                reason="openenv-core is not installed (pip install 'agentgym[serve-env]')")

CALC = "agentgym/Calculator-v0"


@pytest.fixture(scope="module")
def server() -> Any:
    with launch_env_server(CALC, max_sessions=24) as proc:
        yield proc


def sessions(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/sessions", timeout=10).json()


def wait_for(predicate: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def reference_episode(seed: int) -> tuple[list[str], list[tuple[Any, ...]], dict[str, Any]]:
    """The reference solver's actions for ``seed`` in-process, the step results, and the reset info."""
    env = gym.make(CALC)
    obs, info = env.reset(seed=seed)
    solver = env.unwrapped.reference_solver()
    actions, results = [], []
    while True:
        action = solver(obs)
        result = env.step(action)
        actions.append(action)
        results.append(result)
        obs = result[0]
        if result[2] or result[3]:
            break
    env.close()
    return actions, results, info


def test_import_agentgym_does_not_import_openenv() -> None:
    code = "import sys, agentgym; print(json.dumps([m for m in ('openenv', 'fastapi', 'gradio', 'uvicorn') if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_openenv_generic_client_plays_an_episode(server: Any) -> None:
    from openenv.core import GenericEnvClient

    actions, results, info = reference_episode(seed=5)
    assert httpx.get(f"{server.url}/health", timeout=10).json()["status"] == "healthy"
    schema = httpx.get(f"{server.url}/schema", timeout=10).json()
    assert "text" in schema["action"]["properties"] and "image_png" in schema["observation"]["properties"]
    assert httpx.get(f"{server.url}/metadata", timeout=10).json()["name"] == CALC
    with GenericEnvClient(base_url=server.url).sync() as client:
        first = client.reset(seed=5)
        assert first.observation["info"]["instructions"] == info["instructions"]
        assert first.observation["info"]["tools"] == info["tools"] and not first.done
        for action, expected in zip(actions, results, strict=True):
            step = client.step({"text": action})
            assert step.observation["text"] == expected[0] and step.reward == pytest.approx(expected[1])
            assert step.done == (expected[2] or expected[3])
            assert step.observation["info"]["turn"]["kind"] == expected[4]["turn"]["kind"]
        assert step.observation["info"]["outcome"] == {"success": True, "score": 1.0, "end_reason": "answered"}
        state = client.state()
        assert state["env_id"] == CALC and state["step_count"] == len(actions) and state["done"] is True
        assert sessions(server.url)["active_sessions"] == 1
        # A bad reset field is an error answer, not a dead session.
        with pytest.raises(RuntimeError, match="Unknown reset field"):
            client.reset(seed=1, sed=2)
        assert client.reset(seed=1).observation["text"]
    assert wait_for(lambda: sessions(server.url)["active_sessions"] == 0)
    # OpenEnv's HTTP /reset is stateless: one throwaway env per request.
    reply = httpx.post(f"{server.url}/reset", json={"seed": 5}, timeout=30).json()
    assert reply["observation"]["text"] == first.observation["text"] and reply["done"] is False
    assert wait_for(lambda: sessions(server.url)["live_envs"] == 0)


def test_sessions_are_isolated_and_match_in_process(server: Any) -> None:
    """Two interleaved sessions with different seeds each replay their in-process episode exactly."""
    episodes = {seed: reference_episode(seed) for seed in (11, 12)}
    envs = {seed: gym.make("agentgym/Remote-v0", url=server.url, env_id=CALC) for seed in episodes}
    try:
        for seed, env in envs.items():
            obs, info = env.reset(seed=seed)
            assert info == episodes[seed][2]
        longest = max(len(e[0]) for e in episodes.values())
        for i in range(longest):
            for seed, env in envs.items():
                actions, results, _ = episodes[seed]
                if i < len(actions):
                    assert env.step(actions[i]) == results[i]
        assert envs[11].unwrapped.state_key() != envs[12].unwrapped.state_key()
    finally:
        for env in envs.values():
            env.close()
    assert wait_for(lambda: sessions(server.url)["live_envs"] == 0)


def test_remote_env_passes_check_agent_env(server: Any) -> None:
    from agentgym.testing import check_agent_env

    check_agent_env("agentgym/Remote-v0", seed=0, fuzz_examples=15, env_kwargs={"url": server.url, "env_id": CALC})
    assert wait_for(lambda: sessions(server.url)["active_sessions"] == 0)


def test_rollout_engine_runs_remote_episodes(server: Any) -> None:
    """The engine plays Remote-v0 episodes (reset info gives the agent its instructions and tools) with a scripted
    policy that replays the in-process reference solver; outcomes and rewards equal the in-process ones."""
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    seeds = list(range(20, 26))
    episodes = {seed: reference_episode(seed) for seed in seeds}
    by_question = {}
    for seed, (actions, _, info) in episodes.items():
        first = gym.make(CALC)
        by_question[first.reset(seed=seed)[0]] = actions
        first.close()

    def reply(messages: list[dict[str, Any]]) -> str:
        question = next(m["content"] for m in messages if m["role"] == "user")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return by_question[question][turn]

    kwargs = {"url": server.url, "env_id": CALC}
    specs = [EpisodeSpec("agentgym/Remote-v0", seed=seed, env_kwargs=kwargs) for seed in seeds]
    trajectories = RolloutEngine(ScriptedPolicy(reply), RolloutConfig(max_in_flight=6)).run(specs)
    assert [t.end_reason for t in trajectories] == ["answered"] * len(seeds)
    for traj in trajectories:
        actions, results, _ = episodes[traj.seed]
        assert [t.action for t in traj.turns] == actions
        assert [t.reward for t in traj.turns] == [r[1] for r in results]
        assert traj.outcome["success"] is True
    assert wait_for(lambda: sessions(server.url)["live_envs"] == 0)


def test_a_client_that_disappears_frees_its_env(server: Any) -> None:
    """A client process killed mid-episode (no close message) frees its session and env on the server."""
    code = (
        "import json, sys, time\n"
        "from websockets.sync.client import connect\n"
        f"ws = connect('{server.url.replace('http', 'ws', 1)}/ws')\n"
        "ws.send(json.dumps({'type': 'reset', 'data': {'seed': 3}}))\n"
        "reply = json.loads(ws.recv())\n"
        "print(reply['type'], flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "observation"
        assert sessions(server.url)["live_envs"] == 1
    finally:
        child.kill()
        child.wait()
    assert wait_for(lambda: sessions(server.url)["live_envs"] == 0, 10), sessions(server.url)
    assert sessions(server.url)["active_sessions"] == 0


def test_short_load_run_leaks_nothing(server: Any) -> None:
    """16 concurrent sessions for 5 s (the benchmark's short form): no envs, sessions, fds or processes left."""
    bench = load_script("benchmarks/env_server.py")
    result = bench.load(server.url, server.pid, sessions=16, seconds=5.0)
    assert result["steps"] > 50 and result["errors"] == 0, result
    assert result["leaks"] == {}, result


def test_capacity_error_then_killed_server_ends_episode_with_error() -> None:
    """A full server says so (OpenEnv's CAPACITY_REACHED); a killed server ends the episode with error, fast."""
    from agentgym.serving.env_server import EnvServerError

    proc = launch_env_server(CALC, max_sessions=2)
    try:
        a = gym.make("agentgym/Remote-v0", url=proc.url, timeout_s=30)
        b = gym.make("agentgym/Remote-v0", url=proc.url, timeout_s=30)
        with pytest.raises(EnvServerError, match="CAPACITY_REACHED.*2/2.*--max-sessions") as caught:
            gym.make("agentgym/Remote-v0", url=proc.url)
        assert caught.value.code == "CAPACITY_REACHED"
        # On the wire: the server answers the connection itself with OpenEnv's error message and closes it (so
        # OpenEnv's GenericEnvClient sees either that error or the closed socket, whichever its first send meets).
        from websockets.sync.client import connect

        with connect(proc.url.replace("http", "ws", 1) + "/ws", open_timeout=30) as ws:
            answer = json.loads(ws.recv(timeout=30))
        assert answer["type"] == "error" and answer["data"]["code"] == "CAPACITY_REACHED"
        assert answer["data"]["max_sessions"] == 2 and "Server at capacity" in answer["data"]["message"]
        b.close()
        assert wait_for(lambda: sessions(proc.url)["active_sessions"] == 1)
        actions, results, _ = reference_episode(seed=4)
        a.reset(seed=4)
        assert a.step(actions[0]) == results[0]
        proc.kill()
        start = time.monotonic()
        obs, reward, terminated, truncated, info = a.step(actions[1])
        assert time.monotonic() - start < 10
        assert terminated and not truncated and info["outcome"]["end_reason"] == "error"
        assert info["turn"]["kind"] == "invalid" and "stopped answering" in obs
        assert reward == pytest.approx(-results[0][1])  # the episode's return is the error score, 0
        with pytest.raises(EnvCrashed, match="No agentgym env server answered"):
            a.reset(seed=4)
        a.close()
        a.close()
        with pytest.raises(EnvCrashed, match="serve-env"):
            gym.make("agentgym/Remote-v0", url=proc.url)
    finally:
        proc.stop()


def test_rollout_engine_over_a_dead_server_records_errors(server: Any) -> None:
    from agentgym.policies.scripted import ScriptedPolicy
    from agentgym.rollout import EpisodeSpec, RolloutEngine

    with socket_closed_port() as url:
        specs = [EpisodeSpec("agentgym/Remote-v0", seed=s, env_kwargs={"url": url}) for s in range(2)]
        trajectories = RolloutEngine(ScriptedPolicy(["answer(1)"])).run(specs)
    assert [t.end_reason for t in trajectories] == ["error", "error"]
    assert all("No agentgym env server answered" in (t.error or "") for t in trajectories)


class socket_closed_port:
    """A loopback URL where nothing listens (bound, then closed)."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        return None


def test_wire_format_round_trips_gui_observations() -> None:
    """Screenshots travel as lossless PNG and come back as the same uint8 pixels, in the same space."""
    from gymnasium import spaces

    from agentgym.serving.env_server import (
        AgentGymAction,
        AgentGymClient,
        _to_wire,
        observation_from_wire,
        space_from_json,
        space_to_json,
    )

    from agentgym.spaces import UnicodeText

    space = spaces.Dict({"text": UnicodeText(), "image": spaces.Box(0, 255, shape=(6, 5, 3), dtype=np.uint8)})
    assert space_from_json(json.loads(json.dumps(space_to_json(space)))) == space
    pixels = np.random.default_rng(0).integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    info = {"turn": {"kind": "tool_call", "score": np.float32(0.5)}, "shape": (1, 2)}
    wire = _to_wire({"text": "page", "image": pixels}, info, reward=0.0, terminated=False, truncated=False,
                    state_key="k")
    again = type(wire).model_validate_json(wire.model_dump_json())
    observation = observation_from_wire(again, space)
    assert observation["text"] == "page" and np.array_equal(observation["image"], pixels)
    assert space.contains(observation)
    assert again.info == {"turn": {"kind": "tool_call", "score": 0.5}, "shape": [1, 2]}
    with pytest.raises(agentgym.AgentGymError, match="extra keys"):
        _to_wire({"text": "x", "board": 1}, {}, reward=None, terminated=False, truncated=False, state_key=None)
    assert AgentGymAction(text="x").text == "x"
    from openenv.core.env_client import EnvClient

    assert issubclass(AgentGymClient, EnvClient)


@pytest.mark.parametrize(("argv", "message"), [
    (["serve-env", "agentgym/Calculater-v0"], "Did you mean 'agentgym/Calculator-v0'"),
    (["serve-env", CALC, "--env-kwargs", "{max_turns: 3}"], "--env-kwargs must be a JSON object"),
    (["serve-env", CALC, "--env-kwargs", "[1]"], "--env-kwargs must be a JSON object"),
    (["serve-env", CALC, "--port", "70000"], "--port must be in 0..65535"),
    (["serve-env", "--port", "0"], "serve-env needs an env id"),
])
def test_serve_env_cli_rejects_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.cli import main

    monkeypatch.delenv("AGENTGYM_ENV_ID", raising=False)

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_serve_env_reads_the_env_id_from_agentgym_env_id(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The env-server images name their family's env in AGENTGYM_ENV_ID; `docker run IMAGE --port N` serves it."""
    from agentgym.cli import main

    monkeypatch.setenv("AGENTGYM_ENV_ID", "agentgym/Calculater-v0")
    assert main(["serve-env", "--port", "0"]) == 2
    assert "Did you mean 'agentgym/Calculator-v0'" in capsys.readouterr().err


def test_remote_env_rejects_bad_arguments(server: Any) -> None:
    with pytest.raises(agentgym.AgentGymError, match="base URL"):
        gym.make("agentgym/Remote-v0", url="127.0.0.1:8000")
    with pytest.raises(agentgym.AgentGymError, match="serves 'agentgym/Calculator-v0', not 'agentgym/Maze-v0'"):
        gym.make("agentgym/Remote-v0", url=server.url, env_id="agentgym/Maze-v0")
    assert wait_for(lambda: sessions(server.url)["active_sessions"] == 0)
