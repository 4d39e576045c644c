"""TextWorld games generated offline: difficulty levels, task generation and the on-disk game cache.

Why a cache: generating one game (TextWorld's logic engine, then the Inform 7 compiler) takes seconds, while
playing a step takes milliseconds. Each game is identified by ``(kind, level, distribution, seed)`` and built once
under the agentgym cache root by :func:`agentgym.utils.cache.build_once` (file lock, temporary directory, atomic
rename), so concurrent workers never see half a game and tests pay generation once per machine.

Two kinds of games, three levels each:

* ``cooking``: TextWorld's ``tw-cooking`` challenge (the First TextWorld Problems games): find the kitchen, read
  the cookbook, fetch, cut and cook ingredients, prepare and eat the meal. Levels add ingredients, rooms,
  closed containers, cooking and cutting.
* ``household``: TextWorld's ``tw-simple`` challenge (ALFWorld-like): a six-room house (bedroom, kitchen, living
  room, bathroom, backyard, garden) where a key must be found to unlock a door and an object put in its place.
  Levels make the rewards sparser and the goal text briefer.

A task's ``distribution`` picks TextWorld's own train or test distribution of game content (the cooking game's
held-out foods and preparations; the household game's test objects), so a test split can differ in what the agent
sees, on top of held-out game seeds.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.utils.cache import build_once, cache_root
from agentgym.errors import DependencyNotInstalled, TaskError
from agentgym.suite import Task

__all__ = ["KINDS", "LEVELS", "GameSpec", "game_path", "generate_tasks", "require_textworld", "spec_from_task",
           "task_for"]

KINDS = ("cooking", "household")
LEVELS = (1, 2, 3)
DISTRIBUTIONS = ("train", "test")

#: tw-cooking settings per level: more ingredients, more rooms, then closed containers, cooking and cutting.
_COOKING_LEVELS: dict[int, dict[str, Any]] = {
    1: {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False},
    2: {"recipe": 2, "take": 2, "go": 6, "open": True, "cook": False, "cut": False},
    3: {"recipe": 3, "take": 3, "go": 9, "open": True, "cook": True, "cut": True},
}
#: tw-simple settings per level: the reward gets sparser and the goal text briefer.
_HOUSEHOLD_LEVELS: dict[int, dict[str, Any]] = {
    1: {"rewards": "dense", "goal": "detailed"},
    2: {"rewards": "balanced", "goal": "brief"},
    3: {"rewards": "sparse", "goal": "brief"},
}


def require_textworld() -> Any:
    """Import :mod:`textworld` or raise :class:`DependencyNotInstalled` naming the extra that installs it."""
    try:
        import textworld
        import textworld.challenges  # noqa: F401 - registers tw-cooking / tw-simple
    except ImportError as exc:
        raise DependencyNotInstalled("textworld", "textworld", "agentgym/TextWorld-v0 games") from exc
    return textworld


@dataclass(frozen=True)
class GameSpec:
    """Everything that determines one generated game."""

    kind: str
    level: int
    distribution: str
    seed: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TaskError(f"TextWorld game kind must be one of {KINDS}, got {self.kind!r}.")
        if self.level not in LEVELS:
            raise TaskError(f"TextWorld level must be one of {LEVELS}, got {self.level!r}.")
        if self.distribution not in DISTRIBUTIONS:
            raise TaskError(f"TextWorld distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}.")
        if not 0 <= self.seed < 2**31:
            raise TaskError(f"TextWorld game seed must lie in [0, 2**31), got {self.seed!r}.")

    @property
    def name(self) -> str:
        return f"{self.kind}-L{self.level}-{self.distribution}-s{self.seed}"


def spec_from_task(task: Task) -> GameSpec:
    """The game a task names; a clear error for tasks that lack the metadata."""
    meta = task.metadata
    try:
        return GameSpec(str(meta["kind"]), int(meta["level"]), str(meta.get("distribution", "train")),
                        int(meta["game_seed"]))
    except (KeyError, TypeError, ValueError):
        raise TaskError(
            f"TextWorld task {task.id!r} needs metadata kind ({'/'.join(KINDS)}), level (1-3), game_seed (int) and "
            "optionally distribution (train/test); make tasks with agentgym.envs.textworld.games.generate_tasks."
        ) from None


def _challenge(spec: GameSpec) -> tuple[str, dict[str, Any]]:
    if spec.kind == "cooking":
        settings = dict(_COOKING_LEVELS[spec.level], drop=False, recipe_seed=spec.seed, split=spec.distribution)
        return "tw-cooking", settings
    return "tw-simple", dict(_HOUSEHOLD_LEVELS[spec.level], test=spec.distribution == "test")


def game_path(spec: GameSpec) -> Path:
    """Path of the compiled game file (``.z8``, with its ``.json`` beside it), generating it on first use."""
    target = cache_root() / "textworld" / "games-v2" / spec.name

    def build(tmp: Path) -> None:
        require_textworld()  # a clear error here rather than a traceback from the child
        # TextWorld iterates over sets of strings while generating, so the game (the order of its rules and fail
        # conditions) depends on Python's string hashing: generate in a child with a fixed PYTHONHASHSEED so that
        # a spec names the same game file on every machine (this also keeps TextWorld's global RNG out of ours).
        code = ("import sys; from agentgym.envs.textworld.games import _generate; "
                "_generate(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])")
        proc = subprocess.run([sys.executable, "-c", code, spec.kind, str(spec.level), spec.distribution,
                               str(spec.seed), str(tmp / "game.z8")], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=600)
        if proc.returncode != 0:
            raise TaskError(f"TextWorld could not generate the game {spec.name}: {proc.stderr.strip()[-2000:]}")

    build_once(target, build)
    return target / "game.z8"


def _generate(kind: str, level: int, distribution: str, seed: int, path: str) -> None:
    """Generate and compile one game to ``path`` (run in a child process by :func:`game_path`)."""
    spec = GameSpec(kind, level, distribution, seed)
    textworld = require_textworld()
    from textworld.challenges import CHALLENGES

    name, settings = _challenge(spec)
    options = textworld.GameOptions()
    options.seeds = spec.seed
    options.path = path
    options.force_recompile = True
    game = CHALLENGES[name][1](settings, options)
    textworld.generator.compile_game(game, options)


def generate_tasks(rng: random.Random, count: int, *, kinds: Sequence[str] = KINDS, levels: Sequence[int] = (1,),
                   distribution: str = "train", seed_range: Sequence[int] = (0, 1_000_000)) -> list[Task]:
    """Draw ``count`` distinct games; only their specs are drawn here, the games are generated when first played.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks.
        kinds: Game kinds to draw from (``cooking``, ``household``).
        levels: Difficulty levels to draw from (1-3).
        distribution: TextWorld's content distribution, ``train`` or ``test`` (unseen foods and objects).
        seed_range: ``[low, high)`` of game seeds; give splits disjoint ranges to hold game seeds out.
    """
    kinds, levels = list(kinds), [int(v) for v in levels]
    low, high = (int(v) for v in seed_range)
    if not kinds or not levels:
        raise TaskError("generate_tasks needs at least one kind and one level.")
    if not 0 <= low < high <= 2**31:
        raise TaskError(f"seed_range must be [low, high) with 0 <= low < high <= 2**31, got {list(seed_range)}.")
    if count > len(kinds) * len(levels) * (high - low):
        raise TaskError(f"Only {len(kinds) * len(levels) * (high - low)} distinct games exist for these settings; "
                        f"asked for {count}. Widen seed_range.")
    tasks: list[Task] = []
    seen: set[GameSpec] = set()
    while len(tasks) < count:
        spec = GameSpec(rng.choice(kinds), rng.choice(levels), distribution, rng.randrange(low, high))
        if spec in seen:
            continue
        seen.add(spec)
        tasks.append(task_for(spec))
    return tasks


def task_for(spec: GameSpec) -> Task:
    """The task that plays ``spec``'s game."""
    what = "a cooking game" if spec.kind == "cooking" else "a household game"
    metadata: Mapping[str, Any] = {"kind": spec.kind, "level": spec.level, "distribution": spec.distribution,
                                   "game_seed": spec.seed}
    return Task(id=f"tw-{spec.name}", prompt=f"Play {what} (TextWorld, level {spec.level}).", answer=None,
                metadata=dict(metadata))
