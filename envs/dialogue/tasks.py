"""Support cases: a customer with an order, a problem and a wish the agent must find out by asking.

Train and test cases come from disjoint customer names and order-id prefixes, so a test case never repeats a
training one.
"""

from __future__ import annotations

import random

from agentgym.errors import TaskError, did_you_mean
from agentgym.suite import Task

__all__ = ["PROBLEMS", "SPLITS", "WISHES", "generate_support_tasks"]

PROBLEMS = {
    "damaged": "the parcel arrived today and the lamp inside is broken",
    "late": "it was due two weeks ago and it still has not arrived",
    "wrong_item": "I ordered a blue kettle and got a red toaster",
}
WISHES = ("refund", "replacement")
SPLITS = {"train": ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana"),
          "test": ("Ivo", "June", "Kai", "Lena", "Milo", "Nora")}
_PREFIX = {"train": "A", "test": "T"}


def generate_support_tasks(rng: random.Random, count: int, *, split: str = "train") -> list[Task]:
    """``count`` distinct support cases of ``split`` (the suite generator)."""
    if split not in SPLITS:
        raise TaskError(f"Unknown split {split!r}.{did_you_mean(split, list(SPLITS))} Use train or test.")
    tasks: dict[str, Task] = {}
    while len(tasks) < count:
        order = f"{_PREFIX[split]}-{rng.randrange(1000, 10000)}"
        if order in tasks:
            continue
        name, problem, wish = rng.choice(SPLITS[split]), rng.choice(sorted(PROBLEMS)), rng.choice(WISHES)
        tasks[order] = Task(id=f"support-{order.lower()}", prompt=f"{name} writes to support about an order.",
                            answer={"order_id": order, "action": wish},
                            metadata={"name": name, "order_id": order, "problem": problem, "wish": wish})
    return list(tasks.values())
