"""Eval outputs: a rich table for the terminal and an HTML report.

The report is the trajectory viewer's page (:mod:`agentgym.viewer`) as one static HTML file; observation images
are ``<img>`` tags whose ``src`` is the relative path of their content-hashed PNG in the ``images/`` folder beside
it (the folder the trajectories JSONL uses too), so a run directory stays small and can be moved or copied as a whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym.trajectory import Trajectory
from agentgym.utils.durable import atomic_write_text
from agentgym.utils.terminal import terminal_safe

__all__ = ["format_metric", "render_summary_table", "write_html_report", "write_viewer_page"]

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

    shown = terminal_safe(title)
    # at least as wide as its title: rich wraps a title wider than the columns mid-word ("games-calc te / st")
    table = Table(title=escape(shown), min_width=min(len(shown) + 2, 120))
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


def write_html_report(path: str | Path, summary: Mapping[str, Any], trajectories: Sequence[Trajectory], title: str,
                      settings: Mapping[str, Any] | None = None) -> Path:
    """Write the viewer page of these trajectories as one HTML file (escaped; images as ``<img>`` of the PNGs in
    ``images/`` beside it, which are written there when missing). ``settings`` defaults to the ``run.json``
    beside the report (what ``agentgym eval`` writes there)."""
    from agentgym.viewer.run import Episode, ViewerRun

    path = Path(path)
    if settings is None:
        settings = _read_settings(path.parent / "run.json")
    run = ViewerRun(title=title, kind="eval", episodes=[Episode(t, "") for t in trajectories],
                    settings=dict(settings), summary=dict(summary))
    return write_viewer_page(path, run)


def write_viewer_page(path: str | Path, run: Any) -> Path:
    """Write ``run`` (a :class:`agentgym.viewer.ViewerRun`) as the static viewer page at ``path``, copying the
    images its episodes show into ``images/`` beside it."""
    from agentgym.errors import AgentGymError
    from agentgym.viewer.page import render_page

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    missing = set()
    for episode in run.episodes:
        t = episode.trajectory
        for image in [*t.prompt_images, *t.final_images]:
            try:
                image.save(path.parent)
            except (OSError, AgentGymError):  # moved or damaged: the page still opens, and says which are gone
                missing.add(image.sha256)
    if missing:
        run.notes.append(f"{len(missing)} image(s) could not be read from the run (moved or damaged) and are "
                         f"not shown, e.g. images/{sorted(missing)[0]}.png")
    # atomic, so a full disk leaves the previous report rather than half of one
    atomic_write_text(path, render_page(run))
    return path


def _read_settings(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
