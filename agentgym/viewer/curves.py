"""Learning curves as inline SVG: one small chart per metric of ``metrics.jsonl``, drawn here in Python.

Inline SVG needs no plotting library in the page and no CDN, so the curves show on an offline machine and in a
report mailed as one file.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.viewer.formatting import format_value

__all__ = ["curve_svg", "curves_html", "metric_series"]

#: Shown first, in this order: what a researcher looks at before anything else.
FIRST = ("eval/success_rate", "train/success_rate", "train/return_mean", "train/loss", "actor/loss", "critic/loss",
         "train/zero_signal_groups", "train/mean_turns", "train/entropy", "train/kl", "time/step_s")
WIDTH, HEIGHT = 300, 150
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 54, 10, 22, 22


def metric_series(records: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """metric -> [(step, value)] of every finite number logged (BC steps and the step counter left out)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        step = record.get("step")
        if not isinstance(step, (int, float)) or "bc/step" in record:
            continue
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            series.setdefault(key, []).append((float(step), float(value)))
    return series


def curves_html(records: Sequence[Mapping[str, Any]], limit: int = 24) -> str:
    """The charts of the metrics logged at two or more points (most useful first, then by name), at most ``limit``."""
    series = {k: v for k, v in metric_series(records).items() if len({s for s, _ in v}) >= 2}
    order = [k for k in FIRST if k in series] + sorted(k for k in series if k not in FIRST)
    return "".join(curve_svg(name, series[name]) for name in order[:limit])


def curve_svg(name: str, points: Sequence[tuple[float, float]]) -> str:
    """One chart: the polyline of ``points``, its value range on the left and its step range below."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y0 == y1:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x0 == x1:
        x0, x1 = x0 - 0.5, x1 + 0.5
    inner_w = WIDTH - _PAD_LEFT - _PAD_RIGHT
    inner_h = HEIGHT - _PAD_TOP - _PAD_BOTTOM

    def at(x: float, y: float) -> str:
        return (f"{_PAD_LEFT + (x - x0) / (x1 - x0) * inner_w:.1f},"
                f"{_PAD_TOP + (1 - (y - y0) / (y1 - y0)) * inner_h:.1f}")

    line = " ".join(at(x, y) for x, y in points)
    dots = "".join(f"<circle cx='{at(x, y).split(',')[0]}' cy='{at(x, y).split(',')[1]}' r='2'>"
                   f"<title>step {format_value(x)}: {format_value(y)}</title></circle>" for x, y in points)
    name_e = html.escape(name)
    bottom = HEIGHT - _PAD_BOTTOM
    flat = min(ys) == max(ys)
    value_ticks = [(_PAD_TOP + inner_h / 2 + 4, max(ys))] if flat else [(_PAD_TOP + 8, max(ys)), (bottom, min(ys))]
    ticks = "".join(f"<text x='{_PAD_LEFT - 4}' y='{y:.0f}' class='tick' text-anchor='end'>{format_value(v)}</text>"
                    for y, v in value_ticks)
    ticks += (f"<text x='{_PAD_LEFT}' y='{HEIGHT - 6}' class='tick'>step {format_value(min(xs))}</text>"
              f"<text x='{WIDTH - _PAD_RIGHT}' y='{HEIGHT - 6}' class='tick' text-anchor='end'>{format_value(max(xs))}</text>")
    return (f"<figure class='curve' data-metric='{name_e}'><svg viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' "
            f"height='{HEIGHT}' role='img' aria-label='{name_e} by step'>"
            f"<text x='{_PAD_LEFT}' y='14' class='curve-title'>{name_e}</text>"
            f"<line x1='{_PAD_LEFT}' y1='{bottom}' x2='{WIDTH - _PAD_RIGHT}' y2='{bottom}' class='axis'/>"
            f"<line x1='{_PAD_LEFT}' y1='{_PAD_TOP}' x2='{_PAD_LEFT}' y2='{bottom}' class='axis'/>"
            f"{ticks}<polyline points='{line}' class='series'/>{dots}</svg></figure>")
