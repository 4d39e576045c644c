"""One log format for every ``agentgym`` command, and metrics written as aligned ``key=value`` text.

A newcomer reading a run's stderr met two formats (the CLI's ``LEVEL name: message`` and ``logging.basicConfig``'s
``LEVEL:name:message`` from the quickstart), full dotted logger names, and metrics printed as Python dict reprs.
Every command (train, eval, serve, the quickstart) now calls :func:`setup_logging` once, which installs a single
handler on the root logger with ``HH:MM:SS LEVEL   name: message`` (the ``agentgym.`` prefix dropped from the logger
name), and trainers log their metrics through :func:`format_metrics`.
"""

from __future__ import annotations

import logging
import math
import sys
import warnings
from collections.abc import Mapping
from typing import IO, Any

from agentgym.utils.terminal import TerminalSafeFormatter

__all__ = ["KNOWN_FOREIGN_WARNINGS", "LOG_FORMAT", "ShortNameFormatter", "format_metrics", "quiet_known_warnings",
           "setup_logging"]

#: time, level (padded so messages start in one column), logger short name, message
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(shortname)s: %(message)s"
_DATE_FORMAT = "%H:%M:%S"
#: Marks the handler this module installed, so a second call replaces it instead of doubling every line.
_MARK = "_agentgym_handler"
#: Third-party loggers that narrate every request or file they touch at INFO; their warnings still show.
_CHATTY = ("httpx", "httpcore", "urllib3", "filelock", "asyncio")


#: Warnings other libraries raise about how agentgym calls them, which a user of agentgym cannot act on:
#: (message regex, category, module regex of the line the warning is attributed to).
#: * transformers renamed the forward argument ``past_key_values`` to ``cache`` (5.x) and, in some releases, warns
#:   on each call with the old name (once per forward call, hundreds per rollout, under ``-W always`` or pytest);
#:   the policies pass ``cache`` where the model's forward takes it and the old name where it does not.
#: * transformers 5.x renamed the model property ``is_gradient_checkpointing`` to ``is_activation_checkpointing``;
#:   peft (wrapping a model for LoRA) and the model loader read the old name, which every release still answers.
KNOWN_FOREIGN_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (r"`past_key_values` is deprecated and will be removed", FutureWarning, r"(torch|transformers)\b"),
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\b"),
)


def quiet_known_warnings() -> None:
    """Ignore :data:`KNOWN_FOREIGN_WARNINGS`, and show any other FutureWarning or DeprecationWarning raised inside
    torch or transformers once per process ("once": per message, wherever it is raised), so that no library warning
    repeats every step."""
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("once", category=category, module=r"(torch|transformers)\b")
    for message, category, module in KNOWN_FOREIGN_WARNINGS:  # inserted last, so matched first
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


class ShortNameFormatter(TerminalSafeFormatter):
    """:data:`LOG_FORMAT` with ``shortname``: the logger name without the ``agentgym.`` prefix
    (``trainers.loop``, ``rollout.engine``); other libraries keep their own names. Output goes through
    :func:`~agentgym.utils.terminal.terminal_safe`, since messages quote env and model text."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT, datefmt=_DATE_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        name = record.name
        record.shortname = name[len("agentgym."):] if name.startswith("agentgym.") else name
        return super().format(record)


def setup_logging(level: int = logging.WARNING, *, agentgym_level: int | None = None,
                  stream: IO[str] | None = None) -> logging.Handler:
    """Route every log record of this process through one handler in the one format; returns that handler.

    ``level`` applies to the root logger (other libraries), ``agentgym_level`` to agentgym's own loggers (e.g.
    INFO for a training run's progress while other libraries stay at WARNING). Calling it again (a command that
    runs another, a test) replaces the handler rather than adding a second one. Plain stream handlers that other
    code attached to the root logger (``logging.basicConfig``) are removed too: two handlers print every line twice,
    in two formats. Handlers of other kinds (files, a test runner's capture) stay.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _MARK, False) or type(old) is logging.StreamHandler:
            root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(ShortNameFormatter())
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("agentgym").setLevel(agentgym_level if agentgym_level is not None else logging.NOTSET)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    logging.captureWarnings(True)  # warnings.warn() output takes the same format (logger "py.warnings")
    quiet_known_warnings()
    return handler


def _format_value(value: Any) -> str:
    """Numbers to four significant digits (integers whole), so columns stay narrow and comparable step to step."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e9:
            return str(int(value))
        return f"{value:.4g}"
    return str(value)


def format_metrics(metrics: Mapping[str, Any], *, width: int = 8) -> str:
    """``key=value`` pairs separated by two spaces, each value left-aligned in ``width`` characters, keys in the
    order given: consecutive steps that log the same keys line up column by column.

    >>> format_metrics({"train/loss": 0.123456, "train/errors": 0.0})
    'train/loss=0.1235    train/errors=0'
    """
    parts = [f"{key}={_format_value(value):<{width}}" for key, value in metrics.items()]
    return "  ".join(parts).rstrip()
