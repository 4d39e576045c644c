"""Suite generators over the shipped SWE task specs (``tasks/data/swe_tasks.jsonl``).

Splits are by function: a task is in ``test`` when a hash of (library, file, function) falls in the
held-out fifth, so no test task mutates a function that any train task touches. ``smoke`` takes the first
two test tasks of each library (by id), ten in all.
"""

from __future__ import annotations

import random
from collections import defaultdict

from agentgym.errors import TaskError
from agentgym.suite import Task
from agentgym.tasks.swe.builder import SweTaskSpec, load_specs

__all__ = ["spec_to_task", "swe_tasks"]

SPLITS = ("train", "test", "smoke")


def spec_to_task(spec: SweTaskSpec) -> Task:
    return Task(id=spec.id, prompt=spec.statement, answer=None,
                metadata={"spec": spec.to_dict(), "library": spec.library, "function": spec.mutation.function})


def swe_tasks(rng: random.Random, count: int, *, split: str, per_library: int = 2) -> list[Task]:
    """The first ``count`` tasks of ``split`` (``train``, ``test`` or ``smoke``), in a stable order."""
    if split not in SPLITS:
        raise TaskError(f"SWE split must be one of {SPLITS}, got {split!r}.")
    specs = sorted(load_specs(), key=lambda s: s.id)
    if split == "smoke":
        by_library: dict[str, list[SweTaskSpec]] = defaultdict(list)
        for spec in specs:
            if spec.split == "test" and len(by_library[spec.library]) < per_library:
                by_library[spec.library].append(spec)
        chosen = [s for lib in sorted(by_library) for s in by_library[lib]]
    else:
        chosen = [s for s in specs if s.split == split]
    return [spec_to_task(s) for s in chosen[:count]]
