"""How far new rubric scores agree with the old ones, and with the checker where an env has one.

Re-scoring stored episodes with another rubric or judge is only useful if one can see what changed: the mean
absolute difference and the Pearson correlation of scores, and, for episodes a checker judged (``success`` in the
outcome), how often the rubric's pass (score >= ``threshold``) matches the checker's verdict: the judge's accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentgym.trajectory import Trajectory

__all__ = ["agreement"]


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None  # a constant column correlates with nothing
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def agreement(old: Sequence[Trajectory], new: Sequence[Trajectory], threshold: float = 0.5) -> dict[str, Any]:
    """Agreement of ``new`` (rescored) with ``old`` (as stored), pairwise in order; episodes that failed or whose
    judge failed in ``new`` are left out and counted."""
    pairs = [(o, n) for o, n in zip(old, new) if n.error is None and n.end_reason != "error"]
    olds = [o.score for o, _ in pairs]
    news = [n.score for _, n in pairs]
    checked = [(bool(o.outcome["success"]), n.score >= threshold) for o, n in pairs if "success" in o.outcome]
    return {
        "episodes": len(new),
        "compared": len(pairs),
        "judge_errors": sum(1 for n in new if str(n.error or "").startswith("judge_error")),
        "mean_abs_diff": sum(abs(a - b) for a, b in zip(olds, news)) / len(pairs) if pairs else None,
        "pearson": _pearson(olds, news),
        "old_mean_score": sum(olds) / len(olds) if olds else None,
        "new_mean_score": sum(news) / len(news) if news else None,
        "judge_accuracy_vs_checker": sum(c == j for c, j in checked) / len(checked) if checked else None,
        "threshold": threshold,
    }
