"""Task lists for the GUI suites: a MiniWoB task id and a page seed per task.

A MiniWoB page generates its problem from ``Math.random``; seeding it makes the episode reproducible, so a
task is ``(task id, seed)``. Train and test splits of a suite use disjoint seed ranges, so held-out tasks
show problems (buttons, words, positions) the agent has not seen.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from agentgym.envs.gui.miniwob import task_ids, task_path

from agentgym.errors import TaskError
from agentgym.suite import Task

__all__ = ["generate_tasks", "make_task"]

SEED_RANGES = {"train": (0, 1_000_000), "test": (1_000_000, 2_000_000)}


def make_task(task: str, seed: int, *, tag: str | None = None) -> Task:
    """The task of playing MiniWoB page ``task`` with its ``Math.random`` seeded by ``seed``.

    The seed stays in the metadata, out of the id and the prompt: the id reaches the policy
    (``info["task_id"]``), and the seed fixes every random choice of the page, hidden ones included (the
    number of ``guess-number``, shuffled answers), so a policy could replay MiniWoB's generator from it. The
    id ends in ``tag`` (callers that draw seeds pass a random tag), else in a hash of the seed, which hides
    it from a glance but not from a brute force over the seed range; pass a tag where that matters.
    """
    task_path(task)  # raises with "did you mean" for unknown ids
    suffix = tag if tag is not None else hashlib.blake2b(f"{task}/{seed}".encode(), digest_size=5).hexdigest()
    return Task(id=f"{task}/{suffix}", prompt=f"MiniWoB++ task {task}", answer=None,
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
    seeds = [rng.randrange(low, high) for _ in range(count)]
    return [make_task(names[i % len(names)], seed, tag=f"{rng.getrandbits(40):010x}") for i, seed in enumerate(seeds)]
