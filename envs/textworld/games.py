"""TextWorld games generated offline: difficulty levels, task generation and the on-disk game cache.

Why a cache: generating one game (TextWorld's logic engine, then the Inform 7 compiler) takes seconds, while
playing a step takes milliseconds. Each game is identified by ``(kind, level, distribution, seed)`` and built once
under the agentgym cache root by :func:`agentgym.utils.cache.build_once` (file lock, temporary directory, atomic
rename), so concurrent workers never see half a game and tests pay generation once per machine.

Two kinds of games, three levels each:

* ``cooking``: TextWorld's ``tw-cooking`` challenge (the First TextWorld Problems games): find the kitchen, read
  the cookbook, fetch, cut and cook ingredients, prepare and eat the meal. Levels add ingredients, rooms,
  closed containers, cooking and cutting.
* ``household``: TextWorld's ``tw-simple`` challenge: one fixed, hand-made six-room house (bedroom, kitchen, living
  room, bathroom, backyard, garden) where a key must be found to open a container, a food fetched and put on the
  stove. Every game has the same house and there are only a few dozen distinct quests, so household games are for
  training only (distribution ``train``): no household game can be held out in layout. It is not ALFWorld: that
  benchmark builds on the 120 indoor scenes of ALFRED and has six task types.

Held out in content, not only in seed. A game's ``distribution`` (``train``, ``valid`` or ``test``) fixes both:

* its foods: the recipe's ingredients come from TextWorld's train, valid or test food list only (TextWorld's own
  valid/test distributions also allow every training food with unseen preparations; ours do not), so no held-out
  recipe, walkthrough or quest can equal a training one;
* its house layout (which rooms connect to which): a layout belongs to the distribution its digest picks
  (:func:`layout_distribution`), and the map is redrawn until it belongs to the game's own. A level-1 cooking game
  is a single kitchen, one layout shared by all, so held-out games start at level 2.

Every generated game writes what the agent meets (ingredients, walkthrough, layout) to ``content.json`` beside
it, and :func:`check_content` refuses a game whose content is not its distribution's; the env runs it on every
reset, so a suite's ``validate()`` fails on a held-out game that could repeat a training one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.utils.cache import build_once, cache_root, is_built
from agentgym.errors import DependencyNotInstalled, TaskError
from agentgym.suite import Task

__all__ = ["DISTRIBUTIONS", "KINDS", "LEVELS", "GameSpec", "check_content", "game_content", "game_path",
           "generate_tasks", "layout_distribution", "prepare_games", "require_textworld", "spec_from_task", "task_for"]

logger = logging.getLogger(__name__)

KINDS = ("cooking", "household")
LEVELS = (1, 2, 3)
#: Content distributions: disjoint foods and disjoint house layouts (see the module docstring).
DISTRIBUTIONS = ("train", "valid", "test")
#: How many maps to draw for a game before giving up on finding one of its distribution's layouts.
_MAX_MAP_DRAWS = 200

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
        if self.kind == "household" and self.distribution != "train":
            raise TaskError("Household games all share one fixed house, so none can be held out in layout: they "
                            "exist in the 'train' distribution only. Hold out cooking games (levels 2-3) instead.")
        if self.kind == "cooking" and self.distribution != "train" and self.level == 1:
            raise TaskError("A level-1 cooking game is a single kitchen, the same layout in every game, so it cannot "
                            "be held out in layout: use level 2 or 3 for the 'valid' and 'test' distributions.")

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
            "optionally distribution (train/valid/test); make tasks with agentgym.envs.textworld.games.generate_tasks."
        ) from None


def _challenge(spec: GameSpec) -> tuple[str, dict[str, Any]]:
    if spec.kind == "cooking":
        settings = dict(_COOKING_LEVELS[spec.level], drop=False, recipe_seed=spec.seed, split=spec.distribution)
        return "tw-cooking", settings
    return "tw-simple", dict(_HOUSEHOLD_LEVELS[spec.level], test=False)


def layout_distribution(rooms: Sequence[tuple[str, str]]) -> str:
    """The distribution a house layout belongs to, from a digest of its room connections (name pairs).

    Partitioning layouts by digest holds them out by construction: a layout is in exactly one distribution, so a
    held-out game never shares its house with a training game, whichever training games were drawn. A single-room
    house (no connections) is in ``train``.
    """
    pairs = sorted({tuple(sorted(pair)) for pair in rooms})
    if not pairs:
        return "train"
    digest = hashlib.sha256(json.dumps(pairs).encode()).digest()
    return DISTRIBUTIONS[digest[0] % len(DISTRIBUTIONS)]


def food_lists() -> dict[str, frozenset[str]]:
    """TextWorld's train / valid / test food lists (disjoint), the ingredients each distribution may use."""
    from textworld.challenges.tw_cooking import cooking

    return {name: frozenset(cooking.FOODS_SPLITS[name]) for name in DISTRIBUTIONS}


def check_content(spec: GameSpec, content: Mapping[str, Any]) -> None:
    """Refuse a game whose content is not its distribution's: a held-out game with a training food or a training
    house layout could repeat a training game's recipe, walkthrough or house, so it would not be held out."""
    foods = food_lists()
    ingredients = set(content.get("ingredients") or ())
    problems = []
    if spec.kind == "cooking":
        stray = sorted(ingredients - foods[spec.distribution])
        if stray:
            problems.append(f"its recipe uses {stray}, outside the {spec.distribution} food list")
        if not ingredients:
            problems.append("its record names no recipe ingredients")
    where = layout_distribution([tuple(pair) for pair in content.get("rooms") or ()])
    if spec.kind == "cooking" and where != spec.distribution:
        problems.append(f"its house layout belongs to the {where} distribution")
    if spec.distribution != "train" and not content.get("rooms"):
        problems.append("it has a single room, a layout every training game can share")
    if problems:
        raise TaskError(f"TextWorld game {spec.name} is not held out as its distribution promises: "
                        + "; ".join(problems) + ". The generator no longer matches this TextWorld version; delete "
                        "the game's cache directory and report the TextWorld version.")


def game_content(spec: GameSpec) -> dict[str, Any]:
    """What the agent meets in ``spec``'s game (ingredients, walkthrough, quest, rooms), generating it if needed."""
    path = game_path(spec).with_name("content.json")
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise TaskError(f"Cannot read {path} ({exc}); delete {path.parent} to regenerate the game.") from exc


def _game_dir(spec: GameSpec) -> Path:
    return cache_root() / "textworld" / "games-v3" / spec.name


def prepare_games(specs: Sequence[GameSpec], workers: int | None = None) -> int:
    """Generate the games among ``specs`` that are not cached yet, ``workers`` at a time (default: one per CPU
    core; each game is a child process of about 10 s of CPU), and return how many were generated.

    Why ahead of the episodes: generated on first use inside ``reset``, a batch of new games (a held-out split's
    first evaluation) started hundreds of generations at once on a few cores, and every one of them ran past the
    rollout's step timeout."""
    missing = list({spec.name: spec for spec in specs if not is_built(_game_dir(spec))}.values())
    if not missing:
        return 0
    workers = min(len(missing), max(1, workers or os.cpu_count() or 1))
    logger.warning("TextWorld: generating %d game(s) not cached yet, %d at a time (about 10 s of CPU each; kept in "
                   "%s)", len(missing), workers, _game_dir(missing[0]).parent)
    started = time.perf_counter()

    def generate(spec: GameSpec) -> str | None:
        try:
            game_path(spec)
        except Exception as exc:  # noqa: BLE001 - one bad game fails its own episodes (in reset), not the others
            return f"{spec.name}: {exc}"
        return None

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        failed = [error for error in pool.map(generate, missing) if error]
    logger.warning("TextWorld: %d game(s) generated in %.0f s%s", len(missing) - len(failed),
                   time.perf_counter() - started, f"; {len(failed)} failed, first: {failed[0]}" if failed else "")
    return len(missing) - len(failed)


def game_path(spec: GameSpec) -> Path:
    """Path of the compiled game file (``.z8``, with its ``.json`` and ``content.json`` beside it), generating it
    on first use."""
    target = _game_dir(spec)

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
    if spec.kind == "cooking":
        options.seeds = {**options.seeds, "map": _map_seed(spec, options.seeds["map"])}
    with _only_distribution_foods(spec.distribution):
        game = CHALLENGES[name][1](settings, options)
    textworld.generator.compile_game(game, options)
    Path(path).with_name("content.json").write_text(json.dumps(_content(game), indent=1), encoding="utf-8")


def _map_seed(spec: GameSpec, first: int) -> int:
    """The first map seed, from ``first`` on, whose house layout belongs to ``spec``'s distribution.

    tw-cooking draws its house from the ``map`` seed alone (a random walk on a grid), so the layout can be drawn
    here on its own, in milliseconds, before the game is built around it.
    """
    import numpy as np
    from textworld.challenges.tw_cooking import cooking

    rooms = cooking.ROOMS[:{1: 1, 6: 2, 9: 3, 12: 4}[_COOKING_LEVELS[spec.level]["go"]]]
    for draw in range(_MAX_MAP_DRAWS):
        seed = first if draw == 0 else (first * 1_000_003 + draw) % 2**32
        graph = cooking.make_graph_world(np.random.RandomState(seed), rooms, cooking.NEIGHBORS, size=(5, 5))
        if graph is None:
            continue
        pairs = [(graph.nodes[a]["name"], graph.nodes[b]["name"]) for a, b in graph.edges]
        if layout_distribution(pairs) == spec.distribution:
            return seed
    raise TaskError(f"No house layout of the {spec.distribution} distribution in {_MAX_MAP_DRAWS} maps for "
                    f"{spec.name}; choose another game seed.")


@contextlib.contextmanager
def _only_distribution_foods(distribution: str) -> Iterator[None]:
    """Make tw-cooking draw a held-out recipe from its held-out foods only.

    TextWorld's own valid/test distributions add every training food with unseen preparations (22 of the 30 test
    foods are training foods), so a held-out recipe could be a training recipe; emptying the training list for a
    held-out game leaves only the distribution's own foods (all their preparations). Runs in the generating child.
    """
    from textworld.challenges.tw_cooking import cooking

    if distribution == "train":
        yield
        return
    foods, preparations = cooking.FOODS_SPLITS, cooking.FOOD_PREPARATIONS_SPLITS
    cooking.FOODS_SPLITS = {**foods, "train": []}
    cooking.FOOD_PREPARATIONS_SPLITS = {**preparations, "valid": {}, "test": {}}
    try:
        yield
    finally:
        cooking.FOODS_SPLITS, cooking.FOOD_PREPARATIONS_SPLITS = foods, preparations


def _content(game: Any) -> dict[str, Any]:
    """What the agent meets in a generated game, for the held-out checks: ingredients, quest, walkthrough, rooms."""
    names = {key: info.name for key, info in game.infos.items()}
    rooms = sorted({tuple(sorted((names[f.arguments[0].name], names[f.arguments[1].name])))
                    for f in game.world.facts if f.name in ("north_of", "south_of", "east_of", "west_of")})
    directed = sorted({(names[f.arguments[0].name], f.name, names[f.arguments[1].name])
                       for f in game.world.facts if f.name in ("north_of", "south_of", "east_of", "west_of")})
    recipe = [[str(part) for part in item] for item in game.metadata.get("ingredients") or ()]
    return {"ingredients": [item[0] for item in recipe], "recipe": recipe,
            "objective": str(game.objective), "walkthrough": [str(c) for c in game.walkthrough or ()],
            "rooms": [list(pair) for pair in rooms], "layout": [list(edge) for edge in directed]}


def generate_tasks(rng: random.Random, count: int, *, kinds: Sequence[str] = KINDS, levels: Sequence[int] = (1,),
                   distribution: str = "train", seed_range: Sequence[int] = (0, 1_000_000)) -> list[Task]:
    """Draw ``count`` distinct games; only their specs are drawn here, the games are generated when first played.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks.
        kinds: Game kinds to draw from (``cooking``, ``household``).
        levels: Difficulty levels to draw from (1-3).
        distribution: ``train``, ``valid`` or ``test``: disjoint foods and house layouts (held out in content).
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
