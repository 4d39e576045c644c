"""Sokoban rooms comparable with published numbers: gym-sokoban's generator, no box starting on a target, the
first-move reward, and held-out splits that share no room with training."""

from __future__ import annotations

import random
import statistics

import gymnasium as gym
import pytest
from agentgym.envs.games import sokoban
from agentgym.envs.games.sokoban import Puzzle, generate_puzzle, room_layout

from agentgym.errors import TaskError
from agentgym.registration.suites import load_suite
from agentgym.suite import Task


def _mean_moves(generator: str, boxes: int, count: int, seed: int, min_moves: int = 1) -> float:
    rng = random.Random(seed)
    return statistics.mean(len(generate_puzzle(rng, 6, 6, boxes, min_moves=min_moves, generator=generator)[1])
                           for _ in range(count))


def test_gym_sokoban_generator_gives_gym_sokobans_move_counts() -> None:
    # gym-sokoban 0.0.6's generate_room on 6x6 rooms: 3.3-3.4 shortest moves with 1 box, 7.4-7.8 with 2.
    one, two = _mean_moves("gym-sokoban", 1, 300, 1), _mean_moves("gym-sokoban", 2, 150, 2)
    assert abs(one - 3.3) < 0.4, one
    assert abs(two - 7.4) < 1.0, two
    # The package's own walk (with its default floor of 4 moves) does not: harder rooms with 1 box, easier with 2.
    assert _mean_moves("random-walk", 1, 300, 1, min_moves=4) > one + 0.6
    assert _mean_moves("random-walk", 2, 150, 2, min_moves=4) < two - 0.8


@pytest.mark.parametrize("generator", sokoban.GENERATORS)
@pytest.mark.parametrize("boxes", [1, 2])
def test_no_box_starts_on_a_target_by_default(generator: str, boxes: int) -> None:
    tasks = sokoban.generate_tasks(random.Random(5), 40, width=7, height=7, boxes=boxes, generator=generator)
    assert not [t.id for t in tasks if any(sokoban.BOX_ON_TARGET in row for row in t.metadata["rows"])]
    assert all(("-gym-" in t.id) == (generator == "gym-sokoban") for t in tasks)


def test_boxes_on_targets_only_when_asked() -> None:
    asked = sokoban.generate_tasks(random.Random(5), 60, boxes=2, boxes_on_targets=True)
    assert any(sokoban.BOX_ON_TARGET in row for t in asked for row in t.metadata["rows"])
    with pytest.raises(TaskError, match="random-walk"):
        sokoban.generate_tasks(random.Random(5), 1, generator="gym-sokoban", boxes_on_targets=True)
    with pytest.raises(TaskError, match="gym-sokoban"):
        sokoban.generate_tasks(random.Random(5), 1, generator="gym_sokoban")  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="boxes_on_targets=True"):  # 4 boxes off their targets rarely fit in 6x6
        sokoban.generate_tasks(random.Random(1), 10, boxes=4)
    with pytest.raises(TaskError, match="min_moves"):
        sokoban.generate_tasks(random.Random(5), 1, min_moves=0)


def test_env_draws_from_the_chosen_generator() -> None:
    env = gym.make("agentgym/Sokoban-v0", generator="gym-sokoban", boxes=2)
    try:
        _, info = env.reset(seed=3)
        assert info["task_id"].startswith("sokoban-6x6-b2-gym-")
    finally:
        env.close()
    with pytest.raises(TaskError, match="generator"):
        gym.make("agentgym/Sokoban-v0", generator="boxoban")


def test_a_box_that_starts_on_a_target_pays_nothing_on_the_first_move() -> None:
    """gym-sokoban's env would pay +1 here (it counts boxes on targets from 0 at reset); ours pays the step only."""
    rows = ["#######",
            "#*_@$.#",
            "#_____#",
            "#######"]
    env = gym.make("agentgym/Sokoban-v0", reward="gym-sokoban")
    try:
        env.reset(options={"task": Task("on-target", "Push the boxes.", None, {"rows": rows})})
        _, reward, *_ = env.step('move("down")')
        assert reward == pytest.approx(-0.1)
    finally:
        env.close()


def _layouts(tasks) -> set[tuple[str, ...]]:
    return {room_layout(t.metadata["rows"]) for t in tasks}


def test_sokoban_suite_held_out_splits_repeat_no_room_or_seed_of_training() -> None:
    """A held-out room is a layout (walls, targets, boxes) never trained on, wherever the player stands."""
    for name in ("sokoban", "sokoban-gym"):
        suite = load_suite(name)
        train = suite.split("train")
        train_layouts = _layouts(train)
        train_seeds = {t.metadata["seed"] for t in train}
        for split in set(suite.splits) - {"train"}:
            held = suite.split(split)
            assert not [t.id for t in held if room_layout(t.metadata["rows"]) in train_layouts], (name, split)
            assert not {t.metadata["seed"] for t in held} & train_seeds, (name, split)
            assert len(_layouts(held)) == len(held), (name, split)  # no room twice within a split either
    gym_suite = load_suite("sokoban-gym")
    assert gym_suite.env_kwargs == {"reward": "gym-sokoban"}
    for split in gym_suite.splits:  # the reference solver solves them
        report = gym_suite.validate(split=split, limit=5)
        assert report.ok and report.checked == 5, str(report)


def test_room_half_ignores_the_player() -> None:
    rows = ["######", "#@$_.#", "#____#", "######"]
    moved = ["######", "#_$_.#", "#@___#", "######"]
    assert room_layout(rows) == room_layout(moved)
    assert sokoban.room_half(rows) == sokoban.room_half(moved)
    assert Puzzle.parse(rows).boxes == Puzzle.parse(moved).boxes
