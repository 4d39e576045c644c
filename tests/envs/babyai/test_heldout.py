"""BabyAI suites: a held-out split repeats no seed and no room (grid and mission) of its training split.

Disjoint seeds are not enough by themselves: two seeds can build the same room with the same mission, and a
"held-out" success rate on such a room measures memory. A room is compared without the agent's start cell and
heading, the stricter test (the same room and mission with the agent elsewhere is nearly the same task).
"""

from __future__ import annotations

import contextlib
import io

import gymnasium as gym
import pytest

pytest.importorskip("minigrid")

import minigrid  # noqa: E402,F401  (registers the BabyAI-* ids)

from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.suite import Task  # noqa: E402

_WORLDS: dict[str, object] = {}


def _room(task: Task) -> tuple[str, str, bytes]:
    level = task.metadata["level"]
    world = _WORLDS.setdefault(level, gym.make(level).unwrapped)
    with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints each rejected level sample
        obs, _ = world.reset(seed=task.metadata["seed"])  # type: ignore[attr-defined]
    return level, str(obs["mission"]), world.grid.encode().tobytes()  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["babyai", "babyai-goto"])
def test_held_out_splits_repeat_no_seed_or_room_of_training(name: str) -> None:
    suite = load_suite(name)
    train = suite.split("train")
    train_rooms = {_room(t) for t in train}
    train_seeds = {(t.metadata["level"], t.metadata["seed"]) for t in train}
    assert len(train_rooms) == len(train)
    for split in sorted(set(suite.splits) - {"train"}):
        held = suite.split(split)
        rooms = [_room(t) for t in held]
        assert not [t.id for t, room in zip(held, rooms) if room in train_rooms], (name, split)
        assert not {t.metadata["seed"] for t in held} & {seed for _, seed in train_seeds}, (name, split)
        assert len(set(rooms)) == len(held), (name, split)  # and no room twice within the split
    if name == "babyai-goto":  # the split large enough for a held-out standard error of 0.025
        assert len(suite.split("test_large")) >= 400


def test_the_further_held_out_splits_share_no_room_with_each_other() -> None:
    """Further held-out sets re-score a study's models on rooms none of its choices were made on."""
    suite = load_suite("babyai-goto")
    seen: dict[tuple[str, str, bytes], str] = {}
    for split in ("test", "test_large", "test_replica", "test_fresh"):
        for task in suite.split(split):
            assert seen.setdefault(_room(task), split) == split, (task.id, split, seen[_room(task)])
