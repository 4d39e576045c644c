"""ScienceWorld's two scoring protocols, each checked against the scienceworld package's own scoring of the same
commands: ``agentgym`` keeps the simulator's -100 for a failed task; ``upstream`` scores as the published ReAct and
SwiftSage evaluation scripts do (a failure counts 0, 100 simulator moves, one command a step, "easy")."""

from __future__ import annotations

import json
import shutil

import gymnasium as gym
import pytest

pytest.importorskip("scienceworld", reason="pip install 'agentgym[scienceworld]'")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs a Java runtime (apt-get install default-jre-headless)", allow_module_level=True)

import agentgym  # noqa: E402,F401 - registers the ids
from agentgym.envs.scienceworld import env as sw  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402


def _call(text: str) -> str:
    return "<tool_call>" + json.dumps({"name": "command", "arguments": {"text": text}}) + "</tool_call>"


def _package_score(commands: list[str], simplifications: str, step_limit: int, failure_counts_zero: bool) -> float:
    """The same commands played on the package's own simulator, scored the way the published scripts score
    (``info['score']`` of the last step; with ``failure_counts_zero``, a negative score becomes 0), over 100."""
    from scienceworld import ScienceWorldEnv as Simulator

    sim = Simulator("", envStepLimit=step_limit)
    try:
        sim.load("find-living-thing", 0, simplifications, generateGoldPath=True)
        sim.reset()
        score = 0
        for command in commands:
            _, _, done, info = sim.step(command)
            score = info["score"]
            if done:
                break
        if score < 0 and failure_counts_zero:
            score = 0
        return score / 100.0
    finally:
        sim.close()


def _play(protocol: str, commands: list[str]) -> tuple[dict, float, int]:
    env = gym.make("agentgym/ScienceWorld-v0", protocol=protocol)
    try:
        env.reset(seed=0, options={"task": sw.task_for("find-living-thing", 0, "train")})
        total, turns = 0.0, 0
        for command in commands:
            _, reward, term, trunc, info = env.step(_call(command))
            total, turns = total + reward, turns + 1
            if term or trunc:
                return info["outcome"], total, turns
        raise AssertionError("the episode did not end")
    finally:
        env.close()


FAIL = ["open door to kitchen", "focus on picture"]  # a picture is not a living thing: the task fails at -100


@pytest.mark.parametrize(("protocol", "simplifications", "zero"), [("agentgym", "", False), ("upstream", "easy", True)])
def test_a_failed_episode_scores_as_the_package_and_the_published_scripts(protocol: str, simplifications: str,
                                                                          zero: bool) -> None:
    outcome, total, _ = _play(protocol, FAIL)
    expected = _package_score(FAIL, simplifications, 1_000_000, zero)
    assert outcome["end_reason"] == "failed" and outcome["success"] is False
    assert outcome["score"] == pytest.approx(expected) == pytest.approx(total)
    assert expected == (0.0 if zero else -1.0)


def test_upstream_ends_after_100_moves_with_the_points_earned() -> None:
    # "look around" is free, as the package counts moves; the doors cost one each and earn nothing after the first.
    commands = ["look around", "open door to kitchen", "go to kitchen"] + ["go to hallway", "go to kitchen"] * 60
    outcome, total, turns = _play("upstream", commands)
    expected = _package_score(commands, "easy", sw.UPSTREAM_STEP_LIMIT, True)
    assert outcome == {"success": False, "score": pytest.approx(expected), "end_reason": "step_limit"}
    assert 0.0 < expected < 1.0 and total == pytest.approx(expected)
    assert turns == sw.UPSTREAM_STEP_LIMIT + 2  # 101 moves (the package ends when moves exceed the limit) + 1 free


def test_upstream_fixes_its_settings_and_refuses_others() -> None:
    env = gym.make("agentgym/ScienceWorld-v0", protocol="upstream")
    try:
        env.reset(seed=0)
        assert env.unwrapped.max_turns == 200 and env.unwrapped.max_calls_per_turn == 1
        used = env.unwrapped._sim.get_simplifications_used()  # "easy" is the package's name for all four
        assert {"openDoors", "teleportAction", "noElectricalAction", "selfWateringFlowerPots"} <= set(used.split(", "))
    finally:
        env.close()
    default = gym.make("agentgym/ScienceWorld-v0")
    try:
        default.reset(seed=0)
        assert not default.unwrapped._sim.get_simplifications_used().strip()
        assert default.unwrapped.max_calls_per_turn == 4
        assert default.unwrapped._sim.envStepLimit > 10_000  # a pooled JVM from an upstream env has no step limit
    finally:
        default.close()
    with pytest.raises(ConfigError, match="cannot be combined"):
        gym.make("agentgym/ScienceWorld-v0", protocol="upstream", simplifications="")
    with pytest.raises(ConfigError, match="must be one of"):
        gym.make("agentgym/ScienceWorld-v0", protocol="swiftsage")
    assert load_suite("scienceworld-upstream").make_env().unwrapped.protocol == "upstream"
