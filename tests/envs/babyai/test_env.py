"""BabyAI: the text view, tools on minigrid's own levels, the BabyAI bot as reference, state keys and the suite."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("minigrid")

from agentgym.envs.babyai import env as babyai  # noqa: E402
from agentgym.envs.babyai.env import BabyAIEnv, describe_view  # noqa: E402

from agentgym.errors import TaskError  # noqa: E402
from agentgym.rollout import run_reference_episode  # noqa: E402
from agentgym.suite import Task  # noqa: E402
from agentgym.registration.suites import load_suite


def test_describe_view_is_egocentric() -> None:
    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = 1  # empty floor everywhere
    image[3, 6] = (10, 0, 0)  # the agent, bottom middle, looking up
    image[2, 4] = (6, 0, 0)  # red ball: 2 forward, 1 left
    image[3, 5] = (4, 2, 2)  # locked blue door right in front
    image[6, 6] = (2, 5, 0)  # wall 3 to the right
    image[:, 0, 0] = 0  # far row unseen
    text = describe_view(image, "a green key")
    assert "- a red ball 2 steps forward and 1 step left" in text
    assert "- a locked blue door 1 step forward" in text
    assert "- a wall 3 steps right" in text
    assert "Directly in front of you: a locked blue door." in text and "carrying a green key" in text


def test_tools_step_minigrid_and_state_key() -> None:
    env = gym.make("agentgym/BabyAI-v0")
    task = Task("b", "go", None, {"level": "BabyAI-GoToLocal-v0", "seed": 3})
    obs, info = env.reset(seed=0, options={"task": task})
    core = env.unwrapped
    assert obs.startswith("Mission: go to") and info["max_turns"] == core._world.max_steps
    assert {t["function"]["name"] for t in info["tools"]} == set(babyai.ACTIONS)
    key = core.state_key()
    for _ in range(4):
        env.step("turn_left()")
    assert core.state_key() == key  # a full turn comes back to the same state
    env.step('<tool_call>{"name": "turn_right", "arguments": {}}</tool_call>')
    assert core.state_key() != key
    _, reward, term, _, step = env.step("let me think about where the key is")
    assert step["turn"]["kind"] == "void" and reward == 0 and not term
    _, _, _, _, step = env.step('forward("fast")')
    assert step["turn"]["kind"] == "invalid"
    forked = core.fork()
    env.step("turn_left() turn_left()")
    assert forked.state_key() != core.state_key()
    with pytest.raises(TaskError, match="Did you mean"):
        env.reset(options={"task": Task("x", "p", None, {"level": "BabyAI-GoToLocl-v0", "seed": 1})})
    with pytest.raises(TaskError, match="seed"):
        env.reset(options={"task": Task("x", "p", None, {"level": "BabyAI-GoToLocal-v0"})})
    env.close()


def test_a_bare_action_name_is_that_action() -> None:
    """BALROG writes BabyAI actions as plain names; a reply that is only a name acts, a sentence does not."""
    env = BabyAIEnv()
    env.reset(seed=0, options={"task": Task("b", "go", None, {"level": "BabyAI-GoToLocal-v0", "seed": 3})})
    key = env.state_key()
    for reply in ("turn_left", "turn left", "Turn_Left.", "turn_left()"):
        _, _, _, _, step = env.step(reply)
        assert step["turn"]["kind"] == "tool_call" and step["turn"]["calls"][0]["name"] == "turn_left", reply
    assert env.state_key() == key  # four left turns, however written
    obs, _, _, _, step = env.step("turn left and then forward")
    assert step["turn"]["kind"] == "void" and "just the action's name, e.g. turn_left" in obs
    assert "function call turn_left()" in obs


def test_actions_that_change_nothing_say_so() -> None:
    env = BabyAIEnv()
    env.reset(seed=0, options={"task": Task("b", "go", None, {"level": "BabyAI-GoToLocal-v0", "seed": 1170024218})})
    assert env.step("forward()")[0].startswith("You went forward.")
    assert env.step("pickup()")[0].startswith("You picked up the purple box.")
    assert "carrying a purple box" in env.step("turn_left()")[0]
    assert env.step("forward()")[0].startswith("Something blocks your way")  # a wall
    assert env.step("drop()")[0].startswith("You cannot drop anything here")
    assert env.step("toggle()")[0].startswith("Nothing in front of you can be opened")


def test_level_step_limit_ends_the_episode() -> None:
    env = BabyAIEnv()
    task = Task("b", "go", None, {"level": "BabyAI-GoToLocal-v0", "seed": 3, "max_turns": 100})
    env.reset(seed=0, options={"task": task})
    limit = env._world.max_steps
    for turn in range(1, 100):
        _, _, term, trunc, step = env.step("turn_left() " * 4)
        if term or trunc:
            break
    assert turn == limit // 4 and term and step["outcome"] == {"success": False, "score": 0.0, "end_reason": "max_turns"}


def test_bot_succeeds_on_the_levels_own_reward() -> None:
    env = BabyAIEnv()
    task = Task("b", "put", None, {"level": "BabyAI-PutNextLocal-v0", "seed": 11})
    traj = run_reference_episode(env, task, seed=0)
    assert traj.outcome == {"success": True, "score": 1.0, "end_reason": "solved"}
    assert sum(t.reward for t in traj.turns) == 1.0 and "Mission complete" in env._transcript[-1][1]


def test_generator_held_out_seeds_and_bad_levels() -> None:
    train = babyai.generate_tasks(random.Random(0), 20)
    assert train == babyai.generate_tasks(random.Random(0), 20)
    test = babyai.generate_tasks(random.Random(0), 20, seeds="test")
    assert max(t.metadata["seed"] for t in train) < 2**30 <= min(t.metadata["seed"] for t in test)
    with pytest.raises(TaskError, match="Unknown BabyAI level"):
        babyai.generate_tasks(random.Random(0), 1, levels=["MiniGrid-Empty-5x5-v0"])
    with pytest.raises(TaskError, match="seeds"):
        babyai.generate_tasks(random.Random(0), 1, seeds="dev")  # type: ignore[arg-type]


@pytest.mark.parametrize("split", ["train", "test"])
def test_suite_validates_and_test_split_differs(split: str) -> None:
    suite = load_suite("babyai")
    report = suite.validate(split=split, limit=12)
    assert report.ok and report.checked == 12, str(report)
    train_levels = {t.metadata["level"] for t in suite.train}
    assert "BabyAI-PutNextLocal-v0" in {t.metadata["level"] for t in suite.test} - train_levels
    assert {t.metadata["seed"] for t in suite.test}.isdisjoint(t.metadata["seed"] for t in suite.train)


@pytest.mark.slow
def test_whole_test_and_validation_splits_validate() -> None:
    suite = load_suite("babyai")
    for split in ("test", "validation"):
        report = suite.validate(split=split)
        assert report.ok, str(report)


def test_saying_done_or_spinning_earns_nothing() -> None:
    env = BabyAIEnv(max_turns=20)
    env.reset(seed=0, options={"task": Task("b", "go", None, {"level": "BabyAI-PickupLoc-v0", "seed": 5})})
    total = 0.0
    for _ in range(20):
        _, reward, term, trunc, step = env.step("done() turn_left() toggle() done()")
        total += reward
        if term or trunc:
            break
    assert total == 0.0 and step["outcome"]["success"] is False
