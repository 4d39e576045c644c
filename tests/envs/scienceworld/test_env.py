"""agentgym/ScienceWorld-v0: the scienceworld package's own simulator (a JVM), its score and its gold paths."""

from __future__ import annotations

import json
import random
import shutil

import gymnasium as gym
import pytest

pytest.importorskip("scienceworld", reason="pip install 'agentgym[scienceworld]'")
if shutil.which("java") is None:  # the env's own error for this case is tested below
    pytest.skip("ScienceWorld needs a Java runtime (apt-get install default-jre-headless)", allow_module_level=True)

import agentgym  # noqa: E402,F401 - registers the ids
from agentgym.envs.scienceworld import env as sw  # noqa: E402
from agentgym.errors import TaskError  # noqa: E402
from agentgym.suite import Task  # noqa: E402
from agentgym.registration.suites import load_suite


def _call(text: str) -> str:
    return "<tool_call>" + json.dumps({"name": "command", "arguments": {"text": text}}) + "</tool_call>"


@pytest.fixture()
def env():  # type: ignore[no-untyped-def]
    """A fresh env per test; closing it returns its JVM to the process's pool, so the JVM starts once per run."""
    env = gym.make("agentgym/ScienceWorld-v0")
    yield env
    env.close()


def test_reference_solver_scores_100_and_splits_match_the_simulator(env) -> None:  # type: ignore[no-untyped-def]
    obs, info = env.reset(seed=0)
    assert info["task_id"] == "sw-find-non-living-thing-train-v0" and "non-living thing" in obs
    simulator = env.unwrapped._sim
    for split, getter in (("train", "get_variations_train"), ("dev", "get_variations_dev"),
                          ("test", "get_variations_test")):
        assert list(sw.variations("find-non-living-thing", split)) == list(getattr(simulator, getter)())
    solver = env.unwrapped.reference_solver()
    total, done = 0.0, False
    while not done:
        obs, reward, term, trunc, step_info = env.step(solver(obs))
        total += reward
        done = term or trunc
    assert step_info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}
    assert total == pytest.approx(1.0)


def test_truncation_keeps_the_points_earned_and_bad_commands_are_errors(env) -> None:  # type: ignore[no-untyped-def]
    task = sw.task_for("find-living-thing", 3, "train")
    env.reset(seed=0, options={"task": task})
    gold = list(env.unwrapped._gold)
    short = Task(task.id, task.prompt, metadata={**task.metadata, "max_turns": len(gold)})
    env.reset(seed=0, options={"task": short})
    obs, reward, *_ , info = env.step(_call("look \u00e0 around"))
    assert "ASCII" in obs and info["turn"]["tool_errors"] and reward == 0.0
    total = 0.0
    for action in gold[:-1]:  # all but the last gold action, and one turn was spent on the bad command
        obs, reward, term, trunc, info = env.step(_call(action))
        total += reward
        if term or trunc:
            break
    assert trunc and not term
    assert 0.0 < info["outcome"]["score"] < 1.0 and info["outcome"]["success"] is False
    assert total == pytest.approx(info["outcome"]["score"])


def test_state_key_ignores_looking(env) -> None:  # type: ignore[no-untyped-def]
    env.reset(seed=0)
    env.step(_call("look around"))
    before = env.unwrapped.state_key()
    env.step(_call("look around"))
    assert env.unwrapped.state_key() == before and before.startswith("scienceworld hallway score ")
    env.step(_call("open door to kitchen"))
    env.step(_call("go to kitchen"))
    assert env.unwrapped.state_key().startswith("scienceworld kitchen ")


def test_tasks_cover_all_30_types_with_the_benchmark_splits() -> None:
    assert len(sw.VARIATIONS) == 30
    tasks = sw.generate_tasks(random.Random(0), 60, split="test")
    assert {t.metadata["task_name"] for t in tasks} == set(sw.VARIATIONS)
    assert all(t.metadata["variation"] in sw.variations(t.metadata["task_name"], "test") for t in tasks)
    suite = load_suite("scienceworld")
    assert len(suite.test) == sum(v[2] for v in sw.VARIATIONS.values())
    train = {(t.metadata["task_name"], t.metadata["variation"]) for t in suite.train}
    assert not train & {(t.metadata["task_name"], t.metadata["variation"]) for t in suite.test}
    with pytest.raises(TaskError, match="Did you mean 'boil'"):
        sw.variations("boyl", "train")


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sw, "_IDLE", [])
    monkeypatch.setattr(sw.shutil, "which", lambda name: None)
    env = gym.make("agentgym/ScienceWorld-v0")
    with pytest.raises(sw.JavaNotFound, match="apt-get install default-jre-headless"):
        env.reset(seed=0)
    env.close()


def test_smoke_suite_train_split_validates() -> None:
    report = load_suite("scienceworld-smoke").validate("train")
    assert report.ok, str(report)


@pytest.mark.slow
def test_held_out_and_long_tasks_validate_and_every_split_matches() -> None:
    """The smoke suite's test and long splits, and the variation table against the simulator for all 30 types."""
    suite = load_suite("scienceworld-smoke")
    for split in ("test", "long"):
        report = suite.validate(split)
        assert report.ok, str(report)
    env = gym.make("agentgym/ScienceWorld-v0")
    try:
        env.reset(seed=0)
        simulator = env.unwrapped._sim
        for name in sw.VARIATIONS:
            simulator.load(name, 0, "")
            assert list(sw.variations(name, "train")) == list(simulator.get_variations_train()), name
            assert list(sw.variations(name, "dev")) == list(simulator.get_variations_dev()), name
            assert list(sw.variations(name, "test")) == list(simulator.get_variations_test()), name
    finally:
        env.close()
