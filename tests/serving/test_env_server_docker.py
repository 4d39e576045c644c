"""Env-server images, built locally (no pulls) against a test-started dockerd, run, and driven over HTTP/WS: the games
image in the default suite, every other family's in the slow suite."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest

import agentgym  # noqa: F401 - registers the ids
from tests.helpers.dockerd import docker_daemon
from tests.helpers.scripts import load_script

# a spec check, not an import: openenv-core imports gradio (~12 s of CPU in every xdist worker that collects this)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                reason="openenv-core is not installed (pip install 'agentgym[serve-env]')")

ROOT = Path(__file__).resolve().parents[2]


def _build_module() -> Any:
    return load_script("docker/build.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_one_dockerfile_serves_every_family_with_its_default_env() -> None:
    build = _build_module()
    text = build.DOCKERFILE.read_text()
    assert "FROM agentgym-python-${FAMILY}:local" in text
    assert '"serve-env"' in text and "AGENTGYM_ENV_ID=${ENV_ID}" in text
    assert set(build.DEFAULT_ENVS) == set(build.FAMILIES)
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the ids

    assert all(env_id in gym.registry for env_id in build.DEFAULT_ENVS.values())
    folders = {p.name for p in (ROOT / "docker").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert not folders, f"one Dockerfile for every family, no per-family copies: {folders}"


@contextlib.contextmanager
def _serving(image: str, *args: str, run_options: tuple[str, ...] = ()) -> Iterator[str]:
    """Run ``image`` (``agentgym serve-env`` on a free loopback port) and yield its URL once ``/health`` answers;
    the container is removed afterwards. Its logs are in the failure message when it never comes up."""
    port = _free_port()
    name = f"agentgym-env-test-{port}"
    run = subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", *run_options, image, *args,
                          "--host", "127.0.0.1", "--port", str(port), "--max-sessions", "4"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
            assert time.monotonic() < deadline, f"the container's server did not come up: {logs.stderr[-3000:]}"
            time.sleep(0.5)
        yield url
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def _assert_same_observation(served: Any, local: Any) -> None:
    """Text observations equal; a GUI observation's text equal and its screenshot the same size (pixels can differ
    by font hinting between the container and this machine, so they are not compared one by one)."""
    if isinstance(local, dict):
        assert isinstance(served, dict) and served["text"] == local["text"]
        assert np.asarray(served["image"]).shape == np.asarray(local["image"]).shape
    else:
        assert served == local


def _reference_episode_matches(url: str, env_id: str, seed: int) -> dict[str, Any]:
    """Play the env's reference solver locally and through the served env side by side (``agentgym/Remote-v0``);
    every observation and reward must agree. Returns the served episode's outcome."""
    local = gym.make(env_id)
    remote = gym.make("agentgym/Remote-v0", url=url, env_id=env_id)
    try:
        obs, _ = local.reset(seed=seed)
        _assert_same_observation(remote.reset(seed=seed)[0], obs)
        solver = local.unwrapped.reference_solver()
        while True:
            action = solver(obs["text"] if isinstance(obs, dict) else obs)
            obs, reward, terminated, truncated, info = local.step(action)
            r_obs, r_reward, r_terminated, r_truncated, r_info = remote.step(action)
            _assert_same_observation(r_obs, obs)
            assert (r_reward, r_terminated, r_truncated) == (reward, terminated, truncated)
            if terminated or truncated:
                assert r_info["outcome"] == info["outcome"]
                return r_info["outcome"]
    finally:
        remote.close()
        local.close()


def test_games_image_serves_envs_over_openenv() -> None:
    """Built and driven in the default suite: the image recipe every family shares, end to end (about a minute)."""
    from openenv.core import GenericEnvClient

    build = _build_module()
    with docker_daemon():
        base = build.build_python_image("games")
        image = build.build_env_image("games")
        assert base == "agentgym-python-games:local" and image == "agentgym-env-games:local"
        with _serving(image, "agentgym/Maze-v0") as url:
            local = gym.make("agentgym/Maze-v0")
            obs, info = local.reset(seed=2)
            solver = local.unwrapped.reference_solver()
            with GenericEnvClient(base_url=url).sync() as client:
                first = client.reset(seed=2)
                assert first.observation["text"] == obs and first.observation["info"]["tools"] == info["tools"]
                while True:
                    action = solver(obs)
                    obs, reward, terminated, truncated, _ = local.step(action)
                    step = client.step({"text": action})
                    assert step.observation["text"] == obs and step.reward == pytest.approx(reward)
                    if terminated or truncated:
                        break
                assert step.done and step.observation["info"]["outcome"]["success"] is True
            local.close()
            assert _reference_episode_matches(url, "agentgym/Maze-v0", seed=2)["success"] is True
            assert httpx.get(f"{url}/sessions", timeout=10).json()["env_id"] == "agentgym/Maze-v0"
        # With no env id, the image serves its family's default (AGENTGYM_ENV_ID, set from the build argument).
        default = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c",
                                  "import os; print(os.environ['AGENTGYM_ENV_ID'])"],
                                 capture_output=True, text=True, timeout=120)
        assert default.stdout.strip() == build.DEFAULT_ENVS["games"], default.stderr


@pytest.mark.slow
@pytest.mark.parametrize("family", ["babyai", "code_interpreter", "search", "swe", "multi_agent", "web", "gui"])
def test_family_image_serves_its_default_env(family: str) -> None:
    """Every other family's image, built the same way, serves its default env: the reference solver's episode
    through the container equals the same episode in process (sandboxed code, retrieval indexes, browsers, the
    chess engine and the SWE libraries all live inside the image; nothing is fetched at run time)."""
    build = _build_module()
    with docker_daemon():
        build.build_python_image(family)
        image = build.build_env_image(family)
        with _serving(image, run_options=build.RUN_OPTIONS.get(family, ())) as url:
            env_id = build.DEFAULT_ENVS[family]
            assert httpx.get(f"{url}/sessions", timeout=10).json()["env_id"] == env_id
            outcome = _reference_episode_matches(url, env_id, seed=0)
            assert outcome["end_reason"] != "error", outcome
