"""The games env-server image: built locally (no pulls) against a test-started dockerd, run, driven over HTTP/WS."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import pytest

import agentgym  # noqa: F401 - registers the ids
from tests.dockerd import docker_daemon
from tests.scripts import load_script

# a spec check, not an import: openenv-core imports gradio (~12 s of CPU in every xdist worker that collects this)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                reason="openenv-core is not installed (pip install 'agentgym[serve-env]')")

ROOT = Path(__file__).resolve().parent.parent


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


@pytest.mark.slow
def test_games_image_serves_envs_over_openenv() -> None:
    from openenv.core import GenericEnvClient

    build = _build_module()
    with docker_daemon():
        base = build.build_python_image("games")
        image = build.build_env_image("games")
        assert base == "agentgym-python-games:local" and image == "agentgym-env-games:local"
        port = _free_port()
        name = f"agentgym-env-test-{port}"
        run = subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--network", "host", image,
                              "agentgym/Maze-v0", "--host", "127.0.0.1", "--port", str(port), "--max-sessions", "4"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True).stderr
                assert time.monotonic() < deadline, f"the container's server did not come up: {logs[-2000:]}"
                time.sleep(0.5)
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
            remote = gym.make("agentgym/Remote-v0", url=url, env_id="agentgym/Maze-v0")
            assert remote.reset(seed=2)[0] == local.reset(seed=2)[0]
            remote.close()
            local.close()
            assert httpx.get(f"{url}/sessions", timeout=10).json()["env_id"] == "agentgym/Maze-v0"
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        # With no env id, the image serves its family's default (AGENTGYM_ENV_ID, set from the build argument).
        default = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c",
                                  "import os; print(os.environ['AGENTGYM_ENV_ID'])"],
                                 capture_output=True, text=True, timeout=120)
        assert default.stdout.strip() == build.DEFAULT_ENVS["games"], default.stderr
