"""Progress bars for long work: training steps, rollouts, index and cache builds.

One implementation serves every loop so that bars look alike, nest, and never garble log lines:

* ``"auto"`` (the default everywhere) shows a bar only when stderr is a terminal, so tests, CI logs and
  redirected output stay plain text; ``True``/``False`` force it. ``AGENTGYM_PROGRESS=1``/``0`` overrides
  ``"auto"`` (e.g. to see bars under a pager, or to silence them in a terminal). Under ``torchrun`` only
  rank 0 draws.
* Bars go to stderr through rich. While one is live, log handlers that wrote to the terminal are pointed
  at rich's proxy for it, so a log line prints whole above the bar instead of through it.
* A bar opened while another is live (the rollout of a training step) becomes a second line of the same
  display and disappears when done: rich allows one live display at a time, and a nested
  ``rich.progress.Progress`` would raise.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["ProgressBar", "progress_enabled", "track"]

T = TypeVar("T")

_ACTIVE: ProgressBar | None = None  # the bar that owns the live display (outermost)


def progress_enabled(setting: bool | str | None = "auto") -> bool:
    """Whether to draw a bar for ``setting``: ``True``/``False`` as given; ``"auto"``/``None``: stderr is a terminal.

    ``"auto"`` also reads ``AGENTGYM_PROGRESS`` (``1``/``0``) and stays off on ranks other than 0 and in CI
    (``CI`` set), where a terminal may be emulated but nobody watches it.
    """
    if isinstance(setting, bool):
        return setting
    if setting not in (None, "auto"):
        from agentgym.errors import ConfigError

        raise ConfigError(f"progress must be true, false or 'auto' (a bar when stderr is a terminal), got {setting!r}.")
    forced = os.environ.get("AGENTGYM_PROGRESS", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    if os.environ.get("RANK", "0") != "0" or os.environ.get("CI"):
        return False
    stream = sys.stderr
    return bool(getattr(stream, "isatty", None) and stream.isatty())


def _rate_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Items per second, or seconds per item when slower than one a second (training steps)."""

        def render(self, task: Any) -> Any:
            speed = task.finished_speed or task.speed
            if not speed:
                return Text("-", style="progress.data.speed")
            text = f"{speed:.2f} {task.fields.get('unit', 'it')}/s" if speed >= 1 else \
                f"{1 / speed:.1f} s/{task.fields.get('unit', 'it')}"
            return Text(text, style="progress.data.speed")

    return RateColumn()


class ProgressBar:
    """A context manager drawing one bar (rate, elapsed time and ETA) when enabled; a no-op otherwise.

    Args:
        total: Items expected (``None``: unknown, the bar pulses).
        description: What is counted, shown left of the bar (e.g. ``"GRPO steps"``).
        enabled: ``True``/``False``/``"auto"``, see :func:`progress_enabled`.
        completed: Items already done (a resumed run starts its bar there).
        unit: Name of one item in the rate column (``step``, ``ep``, ``doc``).
        console: A rich console to draw on (default: stderr); tests pass one that records.
    """

    def __init__(self, total: int | None, description: str, *, enabled: bool | str | None = "auto",
                 completed: int = 0, unit: str = "it", console: Any = None) -> None:
        self.total = total
        self.description = description
        self.enabled = progress_enabled(enabled)
        self.completed = completed
        self.unit = unit
        self._console = console
        self._progress: Any = None
        self._task: Any = None
        self._owner = False
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []

    def __enter__(self) -> ProgressBar:
        global _ACTIVE
        if not self.enabled:
            return self
        if _ACTIVE is not None and _ACTIVE._progress is not None:  # nest: a second line of the live display
            self._progress = _ACTIVE._progress
        else:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.progress import TimeRemainingColumn

            console = self._console or Console(stderr=True)
            before = (sys.stdout, sys.stderr)
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _rate_column(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=console, transient=False,
                speed_estimate_period=24 * 3600.0,  # rate over the whole run: a step may take minutes (rich: 30 s)
            )
            self._progress.start()
            self._owner = True
            _ACTIVE = self
            self._redirect_log_handlers(before)
        self._task = self._progress.add_task(self.description, total=self.total, completed=self.completed,
                                             info="", unit=self.unit)
        return self

    def _redirect_log_handlers(self, before: tuple[Any, Any]) -> None:
        """Log handlers made before the bar hold the real stdout/stderr: point them at rich's proxies."""
        proxies = {id(before[0]): sys.stdout, id(before[1]): sys.stderr}
        loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                           if isinstance(lg, logging.Logger)]
        for lg in loggers:
            for handler in lg.handlers:
                if type(handler) is logging.StreamHandler and id(handler.stream) in proxies:
                    proxy = proxies[id(handler.stream)]
                    if proxy is not handler.stream:
                        self._handlers.append((handler, handler.stream))
                        handler.setStream(proxy)

    def advance(self, n: int = 1, info: str | None = None) -> None:
        """Count ``n`` more items done; ``info`` replaces the text shown right of the bar (e.g. a success rate)."""
        if self._progress is None:
            return
        fields = {} if info is None else {"info": info}
        self._progress.update(self._task, advance=n, **fields)

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        if self._progress is None:
            return
        if self._owner:
            self._progress.stop()
            for handler, stream in self._handlers:
                handler.setStream(stream)
            self._handlers.clear()
            _ACTIVE = None
        else:
            self._progress.remove_task(self._task)  # nested bars vanish when done; the outer one keeps going
        self._progress = None


def track(iterable: Iterable[T], description: str, *, total: int | None = None, completed: int = 0,
          enabled: bool | str | None = "auto", unit: str = "it") -> Iterator[T]:
    """Yield from ``iterable`` while a :class:`ProgressBar` counts the items (``total`` defaults to ``len``)."""
    if total is None and hasattr(iterable, "__len__"):
        total = completed + len(iterable)  # type: ignore[arg-type]
    with ProgressBar(total, description, enabled=enabled, completed=completed, unit=unit) as bar:
        for item in iterable:
            yield item
            bar.advance()
