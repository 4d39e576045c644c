"""TextWorld held-out splits are held out in content: disjoint foods and house layouts, checked on every game.

The attacks: a validation game that repeats a training quest (tw-simple's house has only a few dozen quests), a
held-out cooking recipe made of training foods (TextWorld's own test distribution allows 22 training foods), and a
held-out game in a house a training game also has. Each is refused, by construction and by the reset-time check.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("textworld", reason="pip install 'agentgym[textworld]'")

import numpy as np  # noqa: E402
import gymnasium as gym  # noqa: E402

import agentgym  # noqa: E402,F401 - registers the ids
from agentgym.envs.textworld import games  # noqa: E402
from agentgym.envs.textworld.games import DISTRIBUTIONS, GameSpec, check_content, game_content  # noqa: E402
from agentgym.errors import TaskError  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.suite import Task  # noqa: E402


def _rooms(level: int, distribution: str, seed: int) -> tuple[tuple[str, str], ...]:
    """The room connections of the house a cooking game of this spec gets (its map alone, drawn in milliseconds)."""
    from textworld.challenges.tw_cooking import cooking

    spec = GameSpec("cooking", level, distribution, seed)
    map_seed = games._map_seed(spec, seed)
    graph = cooking.make_graph_world(np.random.RandomState(map_seed), cooking.ROOMS[:level], cooking.NEIGHBORS,
                                     size=(5, 5))
    return tuple(sorted(tuple(sorted((graph.nodes[a]["name"], graph.nodes[b]["name"]))) for a, b in graph.edges))


def test_house_layouts_are_split_between_distributions() -> None:
    for level in (2, 3):
        layouts = {d: {_rooms(level, d, seed) for seed in range(12)} for d in DISTRIBUTIONS}
        assert layouts["train"] and layouts["valid"] and layouts["test"]
        assert not layouts["train"] & layouts["valid"] and not layouts["train"] & layouts["test"]
        assert not layouts["valid"] & layouts["test"]


def test_food_lists_are_disjoint() -> None:
    foods = games.food_lists()
    assert len(foods["valid"]) == len(foods["test"]) == 8 and len(foods["train"]) == 22
    assert not foods["train"] & foods["valid"] and not foods["train"] & foods["test"]
    assert not foods["valid"] & foods["test"]


def _house(distribution: str) -> list[list[str]]:
    return [list(pair) for pair in _rooms(2, distribution, 0)]


@pytest.mark.parametrize("distribution", ["valid", "test"])
def test_content_check_refuses_a_held_out_game_with_training_content(distribution: str) -> None:
    spec = GameSpec("cooking", 2, distribution, 5)
    food = sorted(games.food_lists()[distribution])[0]
    check_content(spec, {"ingredients": [food], "rooms": _house(distribution)})  # held out: accepted
    with pytest.raises(TaskError, match="outside the"):  # a training food: a training recipe may repeat
        check_content(spec, {"ingredients": [food, "red potato"], "rooms": _house(distribution)})
    with pytest.raises(TaskError, match="layout belongs to the train"):  # a training house
        check_content(spec, {"ingredients": [food], "rooms": _house("train")})
    with pytest.raises(TaskError, match="single room"):
        check_content(spec, {"ingredients": [food], "rooms": []})
    with pytest.raises(TaskError, match="outside the train food list"):  # and the other way round
        check_content(GameSpec("cooking", 2, "train", 5), {"ingredients": [food], "rooms": _house("train")})


def test_games_that_cannot_be_held_out_are_refused() -> None:
    with pytest.raises(TaskError, match="one fixed house"):
        GameSpec("household", 2, "test", 0)
    with pytest.raises(TaskError, match="single kitchen"):
        GameSpec("cooking", 1, "valid", 0)
    with pytest.raises(TaskError, match="distribution must be one of"):
        GameSpec("cooking", 2, "dev", 0)


def test_suite_held_out_splits_are_cooking_games_of_held_out_distributions() -> None:
    suite = load_suite("textworld")
    assert len(suite.split("test_large")) >= 400  # a held-out standard error of at most 0.025
    for split, distribution in (("validation", "valid"), ("test", "test"), ("test_large", "test")):
        tasks = suite.split(split)
        assert {t.metadata["distribution"] for t in tasks} == {distribution}
        assert {t.metadata["kind"] for t in tasks} == {"cooking"} and min(t.metadata["level"] for t in tasks) >= 2
    assert {t.metadata["distribution"] for t in suite.train} == {"train"}


def _key(content: dict) -> dict[str, object]:
    return {"game": (content["objective"], tuple(content["walkthrough"]), tuple(map(tuple, content["layout"]))),
            "quest": (content["objective"], tuple(sorted(map(tuple, content["recipe"])))),
            "walkthrough": tuple(content["walkthrough"]),
            "layout": tuple(map(tuple, content["rooms"]))}


@pytest.mark.slow
def test_generated_held_out_games_repeat_no_training_game_quest_walkthrough_or_layout() -> None:
    """Generates games (a minute each on a loaded machine): training games of both kinds and levels against the
    smoke test split and the first games of the textworld validation, test and test_large splits."""
    suite = load_suite("textworld")
    train = list(load_suite("textworld-smoke").train)
    train += [t for t in suite.train if t.metadata["kind"] == "cooking" and t.metadata["level"] == 2][:3]
    held_out = (list(load_suite("textworld-smoke").test) + list(suite.split("validation")[:2]) + list(suite.test[:2])
                + list(suite.split("test_large")[:1]))
    seen = {name: set() for name in ("game", "quest", "walkthrough", "layout")}
    for task in train:
        for name, value in _key(game_content(games.spec_from_task(task))).items():
            seen[name].add(value)
    for task in held_out:
        for name, value in _key(game_content(games.spec_from_task(task))).items():
            assert value not in seen[name], f"held-out {task.id} repeats a training {name}"


def test_validate_fails_on_a_held_out_game_with_training_content(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A held-out game whose recipe shares a training food (as TextWorld's own test distribution allows) makes the
    suite's validate() fail instead of scoring it; the game here is a real one with its record altered."""
    from agentgym.utils.cache import cache_root

    suite = load_suite("textworld-smoke")
    spec = games.spec_from_task(suite.test[0])
    source = games.game_path(spec).parent
    copy = tmp_path / source.relative_to(cache_root())
    shutil.copytree(source, copy)
    content = json.loads((copy / "content.json").read_text())
    (copy / "content.json").write_text(json.dumps({**content, "ingredients": content["ingredients"] + ["carrot"]}))
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(tmp_path))
    with pytest.raises(TaskError, match="not held out as its distribution promises"):
        suite.validate("test", limit=1)
    monkeypatch.undo()
    assert suite.validate("test", limit=1).ok  # the real record passes


def _replay(path: str, commands: list[str]) -> tuple[float, bool]:
    """The same commands played on TextWorld's own env: its score over its max score, and whether it was won."""
    import textworld

    env = textworld.start(path, request_infos=textworld.EnvInfos(score=True, max_score=True, won=True))
    try:
        state = env.reset()
        for command in commands:
            state, _, done = env.step(command)
            if done:
                break
        return state["score"] / state["max_score"], bool(state["won"])
    finally:
        env.close()


@pytest.mark.parametrize(("task_index", "short"), [(0, False), (1, True)])
def test_held_out_episode_scores_as_textworld_scores_it(task_index: int, short: bool) -> None:
    """A won episode and one truncated two commands before the win, on the smoke suite's held-out games, each
    scored by TextWorld itself from the same commands."""
    task = load_suite("textworld-smoke").test[task_index]
    env = gym.make("agentgym/TextWorld-v0")
    try:
        if short:
            env.reset(seed=0, options={"task": task})
            cut = len(env.unwrapped._state["policy_commands"]) - 2  # the winning policy, less its last two
            task = Task(task.id, task.prompt, metadata={**task.metadata, "max_turns": cut})
        obs, _ = env.reset(seed=0, options={"task": task})
        solver, commands, total, done = env.unwrapped.reference_solver(), [], 0.0, False
        while not done:
            action = solver(obs)
            commands.append(env.unwrapped._state["policy_commands"][0])
            obs, reward, term, trunc, info = env.step(action)
            total, done = total + reward, term or trunc
    finally:
        env.close()
    score, won = _replay(str(games.game_path(games.spec_from_task(task))), commands)
    assert info["outcome"]["score"] == pytest.approx(score) == pytest.approx(total)
    assert info["outcome"]["success"] is won is (not short)
    assert 0.0 < score < 1.0 if short else score == 1.0
