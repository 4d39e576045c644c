"""The simulated customer: answers what it is asked, in a fixed way, and minds being asked twice.

Deterministic keyword rules, not a model, so that episodes replay exactly and a reference solver exists; the
customer reveals each detail only when asked for it (order number, what went wrong, refund or replacement), as a
real customer who does not know what support needs would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentgym.envs.dialogue.tasks import PROBLEMS

__all__ = ["SimulatedCustomer"]

_ASKS = {
    "order_id": re.compile(r"\b(order|reference)\b.*\b(number|id|no\.?|code)\b|\border (number|id)\b", re.I),
    "problem": re.compile(r"\b(what happened|what went wrong|problem|issue|describe|wrong with)\b", re.I),
    "wish": re.compile(r"\b(refund|replacement|replace|prefer|would you like)\b", re.I),
}


class SimulatedCustomer:
    """One customer for one case; :meth:`reply` answers one agent message."""

    def __init__(self, case: Mapping[str, Any]) -> None:
        self.case = case
        self.told: set[str] = set()
        self.repeats = 0

    def opening(self) -> str:
        return f"Customer ({self.case['name']}): Hi, I have a problem with an order I placed."

    def reply(self, message: str) -> str:
        asked = [key for key, pattern in _ASKS.items() if pattern.search(message)]
        if not asked:
            return "Customer: I don't follow. What do you need from me?"
        parts = []
        for key in asked:
            if key in self.told:
                self.repeats += 1
                parts.append("I already told you that.")
                continue
            self.told.add(key)
            if key == "order_id":
                parts.append(f"My order number is {self.case['order_id']}.")
            elif key == "problem":
                parts.append(f"Well, {PROBLEMS[self.case['problem']]}.")
            else:
                parts.append(f"I'd like a {self.case['wish']}, please.")
        return "Customer: " + " ".join(parts)
