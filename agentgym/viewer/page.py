"""One HTML page of a run: settings, summary, learning curves, an episode browser with filters and search, each
episode as a chat (tool calls, observations, images inline), a token view and two episodes side by side.

The episodes are rendered here, every piece of model and env text through :func:`html.escape`; the data the
script needs (episode facts for the filters, token records) is JSON inside a ``<script type="application/json">``
block with ``<``, ``>`` and ``&`` written as ``\\u`` escapes, so no text can close that block. Images are
``<img src='images/<sha256>.png'>``: the PNG beside the report, or the one the server hands out under that path.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.trajectory import Trajectory, utf8_safe
from agentgym.utils.images import ImageRef
from agentgym.viewer.assets import CSS, SCRIPT
from agentgym.viewer.curves import curves_html
from agentgym.viewer.formatting import format_value, label
from agentgym.viewer.run import Episode, ViewerRun

__all__ = ["CSP", "render_page"]

#: The page runs its own script (pinned by hash) and inline style, shows images from beside it, and loads nothing
#: else: were some text ever to slip past escaping as markup, a script it brought would not run.
CSP = ("default-src 'none'; img-src 'self' data: file:; style-src 'unsafe-inline'; "
       f"script-src 'sha256-{base64.b64encode(hashlib.sha256(SCRIPT.encode('utf-8')).digest()).decode()}'")
_CSP = html.escape(CSP, quote=True)

#: Summary keys shown first, in this order (the rest follow as the file has them).
_SUMMARY_FIRST = ("episodes", "success_rate", "mean_score", "mean_turns", "mean_tool_calls", "mean_action_tokens",
                  "errors", "end_reasons", "wall_s")


#: Settings named on the folded settings line of a training run.
_SETTINGS_HEADLINE = ("trainer", "suite", "model", "steps", "tasks_per_step", "group_size", "learning_rate", "advantage")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_page(run: ViewerRun) -> str:
    """The whole page for ``run`` (valid UTF-8: lone surrogates in model text are shown as ``\\udXXX``)."""
    data = {"kind": run.kind,
            "episodes": [_facts(i, ep) for i, ep in enumerate(run.episodes)],
            "tokens": {str(i): ep.tokens for i, ep in enumerate(run.episodes) if ep.tokens is not None}}
    payload = json.dumps(data, ensure_ascii=True, allow_nan=False, default=str)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    # a trainer's summary repeats its config under "config": the settings panel already shows it
    summary = {k: v for k, v in run.summary.items() if not (k == "config" and run.settings)}
    overview = _settings_html(run.settings) + _summary_html(summary)
    if run.notes:
        overview += "<section class='notes'><h2>Not shown</h2>" + "".join(f"<p>{_e(n)}</p>" for n in run.notes) + "</section>"
    curves = curves_html(run.metrics) if run.metrics else ""
    curves_section = (f"<section id='curves'><h2>Learning curves</h2><div class='curve-grid'>{curves}</div></section>"
                      if curves else "")
    articles = "".join(_episode_html(i, ep) for i, ep in enumerate(run.episodes))
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(run.title)}</title><link rel="icon" href="data:,">
<meta http-equiv="Content-Security-Policy" content="{_CSP}"><style>{CSS}</style></head>
<body data-kind="{_e(run.kind)}">
<h1 id="title">{_e(run.title)}</h1>
<div id="overview">{overview}</div>
{curves_section}
<main id="browser">
<aside id="sidebar"><div id="filters">
<input id="search" type="search" placeholder="search observations and actions" aria-label="search">
<label><input type="checkbox" id="failed-only"> failed only</label>
<select id="filter-reason" aria-label="end reason"></select><select id="filter-task" aria-label="task"></select>
<select id="filter-step" aria-label="training step"></select><span id="shown-count"></span></div>
<ol id="episode-list"></ol></aside>
<section id="pane"><div id="pane-toolbar">
<button type="button" data-view="chat" class="active">Chat</button><button type="button" data-view="tokens">Tokens</button>
<select id="token-colour" aria-label="colour tokens by" hidden><option value="mask">colour: loss mask</option>
<option value="logprob">colour: log-prob</option><option value="advantage">colour: advantage</option></select>
<label>compare with <select id="compare-with"></select></label></div>
<div id="pane-body"></div></section>
</main>
<div id="episodes" hidden>{articles}</div>
<script type="application/json" id="viewer-data">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    return utf8_safe(page)


def _facts(i: int, ep: Episode) -> dict[str, Any]:
    """What the filters and the episode list read of one episode."""
    t = ep.trajectory
    return {"i": i, "task": utf8_safe(t.task_id), "seed": t.seed, "success": bool(t.success),
            "reason": utf8_safe(t.end_reason), "step": ep.train_step, "turns": len(t.turns),
            "score": round(float(t.score), 4), "source": ep.source}


def _kv_rows(mapping: Mapping[str, Any], *, none: str = "n/a", order: Sequence[str] = ()) -> str:
    keys = [k for k in order if k in mapping] + [k for k in mapping if k not in order]
    rows = []
    for key in keys:
        value = mapping[key]
        if isinstance(value, Mapping) and value and key != "end_reasons":
            cell = f"<table class='kv'>{_kv_rows(value, none=none, order=order)}</table>"
            rows.append(f"<tr><th>{_e(label(str(key)))}</th><td>{cell}</td></tr>")
            continue
        shown = none if value is None else format_value(value)
        num = " class='num'" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        rows.append(f"<tr><th>{_e(label(str(key)))}</th><td{num}>{_e(utf8_safe(shown))}</td></tr>")
    return "".join(rows)


def _settings_html(settings: Mapping[str, Any]) -> str:
    """Every setting, in columns; a trainer's 80 fields start folded, with the ones that identify the run named in
    the fold's line."""
    if not settings:
        return ""
    headline = ", ".join(f"{label(k)} {format_value(settings[k])}" for k in _SETTINGS_HEADLINE if settings.get(k) is not None)
    folded = len(settings) > 16
    return (f"<details id='settings'{'' if folded else ' open'}><summary>Run settings"
            f"{': ' + _e(utf8_safe(headline)) if folded and headline else ''}</summary><table class='kv'>"
            f"{_kv_rows(settings, none='—')}</table></details>")


def _summary_html(summary: Mapping[str, Any]) -> str:
    """The metrics in columns; a trainer's nested results (evaluation before and after, the warm start) each in a
    block of its own beside them."""
    if not summary:
        return ""
    nested = {k: v for k, v in summary.items() if isinstance(v, Mapping) and v and k != "end_reasons"}
    flat = {k: v for k, v in summary.items() if k not in nested}
    blocks = "".join(f"<div class='sub'><h3>{_e(label(str(k)))}</h3><table class='kv'>"
                     f"{_kv_rows(v, order=_SUMMARY_FIRST)}</table></div>" for k, v in nested.items())
    table = f"<table class='kv'>{_kv_rows(flat, order=_SUMMARY_FIRST)}</table>" if flat else ""
    return (f"<section id='summary'><h2>Summary</h2>{table}"
            f"{f'<div class=subs>{blocks}</div>' if blocks else ''}</section>")


def _images_html(images: Sequence[ImageRef]) -> str:
    return "".join(f"<img src='{_e(image.path)}' width='{image.width}' height='{image.height}' "
                   f"alt='observation image {image.width}x{image.height}'>" for image in images)


def _calls_html(info: Mapping[str, Any]) -> str:
    """The tool calls the env parsed from an action, as ``name(arguments)``; errors it reported beneath."""
    calls = info.get("calls") if isinstance(info.get("calls"), list) else []
    parts = []
    for call in calls:
        if not isinstance(call, Mapping):
            continue
        args = [format_value(a) if not isinstance(a, str) else repr(a) for a in call.get("args") or ()]
        kwargs = call.get("arguments") if isinstance(call.get("arguments"), Mapping) else {}
        args += [f"{k}={json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)}" for k, v in kwargs.items()]
        parts.append(f"<div class='call'><span class='fn'>{_e(utf8_safe(str(call.get('name', '?'))))}</span>"
                     f"({_e(utf8_safe(', '.join(args)))})</div>")
    errors = [str(x) for key in ("errors", "tool_errors") for x in (info.get(key) or []) if x]
    out = f"<div class='calls'>{''.join(parts)}</div>" if parts else ""
    if errors:
        out += "".join(f"<div class='turn-errors'>{_e(utf8_safe(err))}</div>" for err in errors)
    return out


def _episode_html(i: int, ep: Episode) -> str:
    t: Trajectory = ep.trajectory
    status = "ok" if t.success else "fail"
    meta = [("env", t.env_id), ("seed", t.seed), ("policy", t.policy or None), ("step", ep.train_step),
            ("end", t.end_reason), ("score", format_value(float(t.score))), ("turns", len(t.turns)),
            ("group", t.group_id or None), ("file", ep.source or None)]
    meta_html = "".join(f"<span>{_e(k)} <b>{_e(utf8_safe(str(v)))}</b></span>" for k, v in meta if v is not None)
    head = (f"<header class='ep-head'><h3>{_e(utf8_safe(t.task_id))}</h3><div class='ep-meta'>"
            f"<span class='{status}'><b>{'success' if t.success else 'failure'}</b></span>{meta_html}</div></header>")
    body = []
    if t.error:
        body.append(f"<p class='err'>{_e(utf8_safe(t.error))}</p>")
    for n, turn in enumerate(t.turns):
        obs_who = "task" if n == 0 else "observation"
        body.append(f"<div class='msg env'><div class='who'>{obs_who}</div><pre>{_e(utf8_safe(turn.observation))}</pre>"
                    f"{_images_html(turn.images)}</div>")
        kind = turn.kind or "action"
        body.append(f"<div class='msg agent kind-{_e(kind)}'><div class='who'>action {n + 1} · {_e(kind)} · reward "
                    f"{_e(format_value(float(turn.reward)))}</div><pre>{_e(utf8_safe(turn.action))}</pre>"
                    f"{_calls_html(turn.info)}</div>")
    if t.final_observation is not None:
        body.append(f"<div class='msg env final'><div class='who'>final observation</div>"
                    f"<pre>{_e(utf8_safe(t.final_observation))}</pre>{_images_html(t.final_images)}</div>")
    return f"<article class='episode {status}' id='ep-{i}' data-i='{i}'>{head}{''.join(body)}</article>"
