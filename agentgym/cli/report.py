"""Eval outputs: a rich table for the terminal and an HTML report.

The report is one HTML file; observation images are ``<img>`` tags whose ``src`` is the relative path of their
content-hashed PNG in the ``images/`` folder beside it (the folder the trajectories JSONL uses too), so a run
directory stays small and can be moved or copied as a whole.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym.trajectory import Trajectory, utf8_safe
from agentgym.utils.durable import atomic_write_text
from agentgym.utils.images import ImageRef
from agentgym.utils.terminal import terminal_safe

__all__ = ["format_metric", "render_summary_table", "write_html_report"]

_ROWS = (
    ("episodes", "episodes", "{:d}"),
    ("success_rate", "success rate", "{:.3f}"),
    ("mean_turns", "mean turns", "{:.2f}"),
    ("mean_tool_calls", "mean tool calls", "{:.2f}"),
    ("mean_action_tokens", "mean action tokens", "{:.1f}"),
    ("errors", "errored episodes", "{:d}"),
    ("wall_s", "wall time (s)", "{:.2f}"),
)


def render_summary_table(summary: Mapping[str, Any], title: str = "eval") -> Any:
    """A rich Table of the summary metrics.

    The title is escaped: it holds user text such as a split name, and rich would eat ``[test]`` as markup; it and
    the end reasons (which an env names) go through :func:`terminal_safe`, so they cannot carry terminal escapes.
    A metric that was not measured (``None``, e.g. action tokens of a chat-mode policy) shows as ``n/a``.
    """
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(terminal_safe(title)))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label, fmt in _ROWS:
        if key in summary:
            table.add_row(label, format_metric(summary[key], fmt))
    if summary.get("end_reasons"):
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(summary["end_reasons"].items()))
        table.add_row("end reasons", escape(terminal_safe(reasons)))
    return table


def format_metric(value: Any, fmt: str = "{}") -> str:
    """``fmt.format(value)``, or ``n/a`` for a metric that was not measured (``None``)."""
    return "n/a" if value is None else fmt.format(value)


def _images_html(images: Sequence[ImageRef]) -> str:
    return "".join(f"<img src='{html.escape(image.path)}' width='{image.width}' height='{image.height}' "
                   f"alt='observation image {image.width}x{image.height}'>" for image in images)


def write_html_report(path: str | Path, summary: Mapping[str, Any], trajectories: Sequence[Trajectory], title: str) -> Path:
    """Write one HTML file with the summary and every transcript (escaped; images as ``<img>`` of the PNGs in
    ``images/`` beside it, which are written there when missing)."""
    from agentgym.storage import save_images

    path = Path(path)
    for t in trajectories:
        save_images(t, path.parent)
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(json.dumps(v))}</td></tr>" for k, v in summary.items())
    episodes = []
    for t in trajectories:
        status = "ok" if t.success else "fail"
        turns = "".join(
            f"<div class='obs'><b>observation</b><pre>{html.escape(turn.observation)}</pre>{_images_html(turn.images)}</div>"
            f"<div class='act'><b>action ({html.escape(turn.kind)}, reward {turn.reward:g})</b>"
            f"<pre>{html.escape(turn.action)}</pre></div>"
            for turn in t.turns
        )
        if t.final_observation is not None:
            turns += (f"<div class='obs'><b>final observation</b><pre>{html.escape(t.final_observation)}</pre>"
                      f"{_images_html(t.final_images)}</div>")
        err = f"<p class='err'>{html.escape(t.error)}</p>" if t.error else ""
        episodes.append(
            f"<details class='{status}'><summary>{html.escape(t.task_id)} seed={t.seed} - {status} "
            f"({html.escape(t.end_reason)}, {len(t.turns)} turns)</summary>{err}{turns}</details>"
        )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:auto}} pre{{white-space:pre-wrap;background:#f6f6f6;padding:6px}}
img{{image-rendering:pixelated;border:1px solid #ccc;margin:4px 0}} .ok summary{{color:#176f2c}} .fail summary{{color:#a31515}} .err{{color:#a31515}} table td{{padding:2px 10px}}</style>
</head><body><h1>{html.escape(title)}</h1><table>{rows}</table><h2>Episodes</h2>{''.join(episodes)}</body></html>"""
    # model text may hold lone surrogates; atomic, so a full disk leaves the previous report rather than half of one
    atomic_write_text(path, utf8_safe(page))
    return path
