"""Task lists for the GUI suites: a MiniWoB task id and a page seed per task.

A MiniWoB page generates its problem from ``Math.random``; seeding it makes the episode reproducible, so a
task is ``(task id, seed)``. Train and test splits of a suite use disjoint seed ranges, so held-out tasks
show problems (buttons, words, positions) the agent has not seen.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from agentgym.envs.gui.miniwob import task_ids, task_path

from agentgym.errors import TaskError
from agentgym.suite import Task

__all__ = ["generate_tasks", "make_task"]

SEED_RANGES = {"train": (0, 1_000_000), "test": (1_000_000, 2_000_000)}


def make_task(task: str, seed: int) -> Task:
    """The task of playing MiniWoB page ``task`` with its ``Math.random`` seeded by ``seed``."""
    task_path(task)  # raises with "did you mean" for unknown ids
    return Task(id=f"{task}/{seed}", prompt=f"MiniWoB++ task {task} (seed {seed})", answer=None,
                metadata={"task": task, "seed": int(seed)})


def generate_tasks(rng: random.Random, count: int, *, tasks: Sequence[str] | str = "all",
                   seeds: str = "train") -> list[Task]:
    """``count`` tasks cycling through ``tasks`` (``"all"`` = the package's 128 ids), each with a fresh seed.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks; with ``count == len(tasks)`` every task appears once.
        tasks: MiniWoB task ids, or ``"all"``.
        seeds: ``train`` or ``test``: which seed range to draw from (they do not overlap).
    """
    names = list(task_ids()) if tasks == "all" else list(tasks)
    if not names:
        raise TaskError("generate_tasks needs at least one MiniWoB task id.")
    for name in names:
        task_path(name)
    if seeds not in SEED_RANGES:
        raise TaskError(f"seeds must be one of {sorted(SEED_RANGES)}, got {seeds!r}.")
    low, high = SEED_RANGES[seeds]
    return [make_task(names[i % len(names)], rng.randrange(low, high)) for i in range(count)]
