"""Values as a person reads them: rounded numbers, plain strings, ``n/a`` for what was not measured.

A summary is JSON (``3.5978426997899895``, ``null``, quoted strings, nested dicts); the viewer shows it as text a
reader can take in at a glance, and never as a Python or JSON literal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LABELS", "format_value", "label"]

#: Friendlier names of the summary metrics every eval writes (others keep their key, underscores as spaces).
LABELS = {
    "episodes": "episodes",
    "success_rate": "success rate",
    "mean_score": "mean score",
    "mean_turns": "mean turns",
    "mean_tool_calls": "mean tool calls",
    "mean_action_tokens": "mean action tokens",
    "errors": "errored episodes",
    "end_reasons": "end reasons",
    "mean_episode_s": "mean episode time (s)",
    "wall_s": "wall time (s)",
    "eval_before": "eval before training",
    "eval_after": "eval after training",
    "bc": "behaviour cloning warm start",
}


def label(key: str) -> str:
    """The display name of a summary or settings key."""
    return LABELS.get(key, key.replace("_", " "))


def format_value(value: Any, digits: int = 3) -> str:
    """``value`` as display text: floats to ``digits`` significant decimals (integers stay whole), ``None`` as
    ``n/a``, booleans as yes/no, sequences comma-joined, mappings as ``key=value`` pairs."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return _format_float(value, digits)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={format_value(v, digits)}" for k, v in value.items()) or "none"
    if isinstance(value, Sequence):
        return ", ".join(format_value(v, digits) for v in value) or "none"
    return str(value)


def _format_float(value: float, digits: int) -> str:
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 0.001:  # 3 decimals for rates, 3 significant digits for larger values: 3.6, 0.274, 12.3
        text = f"{value:.{max(digits - 1 - int(math.floor(math.log10(magnitude))), 0) if magnitude >= 1 else digits}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{value:.2e}"
