"""agentgym/TextWorld-v0: real TextWorld games, generated offline and cached, played through textworld."""

from __future__ import annotations

import json
import random
import sys

import gymnasium as gym
import pytest

pytest.importorskip("textworld", reason="pip install 'agentgym[textworld]'")

import agentgym  # noqa: E402,F401 - registers the ids
from agentgym.envs.textworld.games import GameSpec, generate_tasks, spec_from_task, task_for  # noqa: E402
from agentgym.errors import TaskError  # noqa: E402
from agentgym.suite import Task  # noqa: E402
from agentgym.registration.suites import load_suite


def _call(text: str) -> str:
    return "<tool_call>" + json.dumps({"name": "command", "arguments": {"text": text}}) + "</tool_call>"


@pytest.fixture(scope="module")
def env():  # type: ignore[no-untyped-def]
    env = gym.make("agentgym/TextWorld-v0")
    yield env
    env.close()


def test_import_agentgym_does_not_import_textworld() -> None:
    import subprocess

    code = "import agentgym, sys; print('textworld' in sys.modules, 'agentgym.envs.textworld' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("kind", ["cooking", "household"])
def test_reference_solver_wins_with_the_games_score(env, kind: str) -> None:  # type: ignore[no-untyped-def]
    task = task_for(GameSpec(kind, 1, "train", 0))
    obs, info = env.reset(seed=0, options={"task": task})
    assert "command" in info["instructions"] and "$$$$" not in obs  # the ASCII title is stripped
    solver = env.unwrapped.reference_solver()
    total, rewards, done = 0.0, [], False
    while not done:
        obs, reward, term, trunc, step_info = env.step(solver(obs))
        total += reward
        rewards.append(reward)
        done = term or trunc
    assert step_info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}
    assert total == pytest.approx(1.0)
    assert sum(r > 0 for r in rewards) >= 2  # the game's points are paid on the steps that earn them


def test_bad_commands_are_errors_and_progress_survives_truncation(env) -> None:  # type: ignore[no-untyped-def]
    task = task_for(GameSpec("household", 1, "train", 0))
    task = Task(task.id, task.prompt, metadata={**task.metadata, "max_turns": 3})
    env.reset(seed=0, options={"task": task})
    obs, reward, term, trunc, info = env.step(_call("open chest \u00e9 drawer"))
    assert "ASCII" in obs and info["turn"]["tool_errors"] and reward == 0.0
    obs, reward, term, trunc, info = env.step('command("open chest drawer")')  # function-call form, 1 of 7 points
    assert reward == pytest.approx(1 / 7) and not (term or trunc)
    obs, reward, term, trunc, info = env.step(_call("dance wildly"))  # the game's own parser answers
    assert trunc and not term and reward == 0.0
    assert info["outcome"]["score"] == pytest.approx(1 / 7) and info["outcome"]["success"] is False


def test_state_key_follows_the_world_not_the_text(env) -> None:  # type: ignore[no-untyped-def]
    task = task_for(GameSpec("household", 1, "train", 0))
    env.reset(seed=0, options={"task": task})
    start = env.unwrapped.state_key()
    env.step(_call("look"))
    env.step(_call("inventory"))
    assert env.unwrapped.state_key() == start  # looking around changes nothing in the world
    env.step(_call("open chest drawer"))
    opened = env.unwrapped.state_key()
    assert opened != start and opened.startswith("textworld bedroom ")
    env.step(_call("close chest drawer"))
    assert env.unwrapped.state_key() == start


def test_admissible_commands_hint() -> None:
    env = gym.make("agentgym/TextWorld-v0", admissible_commands=True)
    try:
        obs, _ = env.reset(seed=0, options={"task": task_for(GameSpec("household", 1, "train", 0))})
        assert "Admissible commands:" in obs and "open chest drawer" in obs
    finally:
        env.close()


def test_task_generation_and_errors() -> None:
    tasks = generate_tasks(random.Random(1), 5, levels=[1, 2], seed_range=[10, 20])
    assert len({t.id for t in tasks}) == 5
    assert all(10 <= t.metadata["game_seed"] < 20 and t.metadata["level"] in (1, 2) for t in tasks)
    assert generate_tasks(random.Random(1), 5, levels=[1, 2], seed_range=[10, 20]) == tasks
    with pytest.raises(TaskError, match="distinct games"):
        generate_tasks(random.Random(0), 3, kinds=["cooking"], seed_range=[0, 2])
    with pytest.raises(TaskError, match="needs metadata kind"):
        spec_from_task(Task("x", "p"))
    with pytest.raises(TaskError, match="level must be one of"):
        GameSpec("cooking", 7, "train", 0)


def test_suite_splits_differ_and_hold_out_seeds() -> None:
    suite = load_suite("textworld")
    train_seeds = {t.metadata["game_seed"] for t in suite.train}
    test = suite.test
    assert not train_seeds & {t.metadata["game_seed"] for t in test}
    assert {t.metadata["distribution"] for t in test} == {"test"} and max(t.metadata["level"] for t in test) == 3
    assert max(t.metadata["level"] for t in suite.train) == 2
    assert {t.metadata["distribution"] for t in suite.split("validation")} == {"valid"}


def test_smoke_suite_train_split_validates() -> None:
    report = load_suite("textworld-smoke").validate("train")
    assert report.ok, str(report)


@pytest.mark.slow
def test_held_out_suites_validate() -> None:
    """Generates new games (seconds each): the smoke test split and the first tasks of each textworld split."""
    assert load_suite("textworld-smoke").validate("test").ok
    suite = load_suite("textworld")
    for split in ("train", "validation", "test"):
        report = suite.validate(split, limit=3)
        assert report.ok, str(report)


def test_games_started_on_many_threads_at_once_all_start() -> None:
    """Rollouts reset their envs on worker threads. TextWorld parses a game's logic with one shared parser, so
    games started at once used to fail with parser errors; every one of these must start and give its intro."""
    import concurrent.futures
    import threading

    suite = load_suite("textworld-smoke")
    tasks = list(suite.train) + list(suite.test)
    envs = [gym.make("agentgym/TextWorld-v0") for _ in range(4 * len(tasks))]
    barrier = threading.Barrier(len(envs))

    def start(k: int) -> str:
        barrier.wait(timeout=60)  # every thread starts its game at the same moment
        obs, _ = envs[k].reset(seed=k, options={"task": tasks[k % len(tasks)]})
        return obs

    try:
        with concurrent.futures.ThreadPoolExecutor(len(envs)) as pool:
            observations = list(pool.map(start, range(len(envs))))
    finally:
        for env in envs:
            env.close()
    assert all(obs.strip() for obs in observations)


def test_a_rollout_generates_its_new_games_before_the_episodes_start(tmp_path, monkeypatch) -> None:
    """A game is generated on first use (about 10 s of CPU). Inside reset, a held-out split's first evaluation ran
    hundreds of generations at once and every episode passed the step timeout; the engine has the env class
    generate them first, outside the timeout."""
    from agentgym.policies import ScriptedPolicy
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
    from agentgym.utils.cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # an empty cache: the game below is not generated yet
    task = task_for(GameSpec("household", 1, "train", 7))
    task = Task(task.id, task.prompt, metadata={**task.metadata, "max_turns": 2})
    specs = [EpisodeSpec("agentgym/TextWorld-v0", task=task, seed=i) for i in range(2)]
    config = RolloutConfig(max_in_flight=2, step_timeout_s=3.0)
    trajectories = RolloutEngine(ScriptedPolicy([_call("look")]), config).run(specs)
    assert [t.error for t in trajectories] == [None, None] and all(len(t.turns) == 2 for t in trajectories)
    assert list(tmp_path.glob("textworld/games-v3/*/game.z8"))
