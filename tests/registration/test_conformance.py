"""Every registered id passes check_agent_env, and ids resolve through gym.make in every supported way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym.env import AgentEnv
from agentgym.errors import RegistrationError
from agentgym.parsers import CompositeParser, FunctionCallParser, ToolCallParser
from agentgym.suite import Task
from agentgym.testing import EnvCheckError, check_agent_env
from agentgym.toolset import ToolSet, tool


# Envs whose every step drives a browser, a JVM or a sandboxed process: the default run fuzzes them with fewer
# examples (every other check is the same); `make test-slow` fuzzes them with the full 50.
SLOW_STEP_ENVS = ("agentgym/SWE-v1", "agentgym/ScienceWorld-v0", "agentgym/WebShop-v1", "agentgym/WebShop-text-v1",
                  "agentgym/Search-v1", "agentgym/MiniWoB-v0", "agentgym/TextWorld-v0")


@pytest.mark.parametrize("env_id", agentgym.env_ids())
def test_check_agent_env(env_id: str) -> None:
    check_agent_env(env_id, seed=0, fuzz_examples=8 if env_id in SLOW_STEP_ENVS else 50)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [env_id for env_id in SLOW_STEP_ENVS if env_id in agentgym.env_ids()])
def test_check_agent_env_with_the_full_fuzz(env_id: str) -> None:
    check_agent_env(env_id, seed=1, fuzz_examples=50)


@pytest.mark.parametrize("env_id", agentgym.env_ids())
def test_gym_make_after_import(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        obs, info = env.reset(seed=0)
        assert (isinstance(obs, str) or isinstance(obs.get("text"), str)) and info["tools"] and info["instructions"]
        assert env.spec is not None and env.spec.id == env_id
    finally:
        env.close()


def _make_in_fresh_interpreter(env_ids: list[str]) -> None:
    """``gym.make('agentgym:' + id)`` and a reset of each id in an interpreter that never imported agentgym; every
    id must be registered by that import alone."""
    code = (
        "import sys, json, gymnasium as gym\n"
        "assert 'agentgym' not in sys.modules\n"
        f"ids = {json.dumps(env_ids)}\n"
        "out = {}\n"
        "for env_id in ids:\n"
        "    env = gym.make('agentgym:' + env_id)\n"
        "    obs, info = env.reset(seed=0)\n"
        "    out[env_id] = [type(env.unwrapped).__name__, isinstance(obs, str) or isinstance(obs.get('text'), str)]\n"
        "    env.close()\n"
        "import agentgym\n"
        "print(json.dumps({'made': out, 'registered': agentgym.env_ids()}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # Envs start here (a JVM, browsers, sandboxes): a generous bound, since a loaded CI machine is slow.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result["made"]) == set(env_ids) and sorted(result["registered"]) == sorted(agentgym.env_ids())
    assert all(is_str for _, is_str in result["made"].values())


def _one_id_per_env_module(exclude: tuple[str, ...] = ()) -> list[str]:
    """One registered id per env module (its last, among the ids not in ``exclude``)."""
    ids = [env_id for env_id in agentgym.env_ids() if env_id not in exclude]
    return list({gym.spec(env_id).entry_point.split(":")[0]: env_id for env_id in ids}.values())


def test_gym_make_with_module_prefix_in_fresh_interpreter() -> None:
    """Gymnasium 1.x imports ``agentgym`` itself for ``agentgym:`` ids; no prior import is needed. Every id is
    registered by that import; one id per env module whose reset starts no browser, JVM or sandbox is made and
    reset there (test_gym_make_after_import resets every id, and the slow variant below makes the heavy ones in a
    fresh interpreter too)."""
    _make_in_fresh_interpreter(_one_id_per_env_module(exclude=SLOW_STEP_ENVS))


@pytest.mark.slow
def test_gym_make_with_module_prefix_in_fresh_interpreter_for_every_env_module() -> None:
    _make_in_fresh_interpreter(_one_id_per_env_module())


def test_unknown_id_suggests_the_right_one() -> None:
    with pytest.raises(RegistrationError, match="Did you mean 'agentgym/Calculator-v0'"):
        agentgym.make("agentgym/Calculater-v0")


# ---- the checker itself catches broken envs ---------------------------------------------------------
class _TinyEnv(AgentEnv):
    """A one-tool env used to prove that check_agent_env fails loudly on broken behaviour."""

    description: ClassVar[str] = "test env"

    @tool
    def ping(self, n: int) -> str:
        """Reply.

        Args:
            n: Any integer.
        """
        return f"pong {n}"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.ping])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([FunctionCallParser(["ping"])])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return Task("t", "ping me")

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Call ping."

    def reference_solver(self) -> Any:
        return lambda observation: "ping(1)"


class _NondeterministicEnv(_TinyEnv):
    counter = 0

    @tool
    def ping(self, n: int) -> str:
        """Reply with a value that leaks state between env instances.

        Args:
            n: Any integer.
        """
        type(self).counter += 1
        return f"pong {type(self).counter}"


class _LeakyEnv(_TinyEnv):
    """Deterministic per instance, but it clears its ping count only when an episode ends: an episode left half-way
    (a context limit, a run that stopped) hands its count to the next episode on the same env."""

    def __init__(self, **kwargs: Any) -> None:
        self.pings = 0
        super().__init__(**kwargs)

    @tool
    def ping(self, n: int) -> str:
        """Reply with the number of pings so far.

        Args:
            n: Any integer.
        """
        self.pings += 1
        return f"pong {self.pings}"

    def step(self, action: Any) -> Any:
        result = super().step(action)
        if result[2] or result[3]:
            self.pings = 0
        return result


class _CrashingEnv(_TinyEnv):
    def step(self, action: Any) -> Any:
        if isinstance(action, str) and "\x00" in action:  # only garbage reaches this; check_env's samples do not
            raise RuntimeError("parser bug")
        return super().step(action)


@pytest.fixture()
def broken_ids() -> Any:
    ids = {"agentgym-test/Nondet-v0": _NondeterministicEnv, "agentgym-test/Crash-v0": _CrashingEnv,
           "agentgym-test/Leaky-v0": _LeakyEnv}
    for env_id, cls in ids.items():
        gym.register(id=env_id, entry_point=cls)
    yield ids
    for env_id in ids:
        gym.registry.pop(env_id, None)


def test_checker_reports_nondeterminism(broken_ids: Any) -> None:
    with pytest.raises(EnvCheckError, match="diverged"):
        check_agent_env("agentgym-test/Nondet-v0", fuzz_examples=0)


def test_checker_reports_state_an_earlier_episode_left_behind(broken_ids: Any) -> None:
    """The engine reuses envs for later episodes and runs: an env whose reset leaves an earlier episode's state
    fails the check, even though two fresh instances agree."""
    with pytest.raises(EnvCheckError, match="reset must clear everything an earlier episode left"):
        check_agent_env("agentgym-test/Leaky-v0", fuzz_examples=0)


def test_checker_reports_crash_on_garbage(broken_ids: Any) -> None:
    with pytest.raises(AssertionError, match="step\\(\\) raised RuntimeError: parser bug"):
        check_agent_env("agentgym-test/Crash-v0", fuzz_examples=20)
