"""Ctrl-C during training: stop within about a second, keep the work done so far, say how to resume.

Why a handler of our own: Python turns SIGINT into a ``KeyboardInterrupt`` wherever the main thread happens to be,
possibly half-way through an optimizer step, which would leave weights and optimizer state out of step with each
other. :class:`InterruptGuard` raises at once while nothing changes the weights (sampling, evaluation: their work
is discarded and redone on resume) and defers the interrupt to the end of a :meth:`~InterruptGuard.critical`
region (one optimizer step, one BC step, a checkpoint write: short), so the trainer can then save a consistent
checkpoint. A second Ctrl-C interrupts at once, as Python would.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["BCInterrupted", "InterruptGuard", "TrainingInterrupted"]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after saving what it had; a ``KeyboardInterrupt``, so callers that stop on one
    still stop.

    Attributes:
        checkpoint: The checkpoint written (``None`` when the run had nothing to save yet).
        step: Completed training steps in that checkpoint.
        steps: The run's total steps.
        bc_steps_done: With an interrupted BC warm start, its completed steps (resuming runs the rest).
    """

    def __init__(self, checkpoint: Path | None, step: int, steps: int, bc_steps_done: int | None = None) -> None:
        self.checkpoint, self.step, self.steps, self.bc_steps_done = checkpoint, step, steps, bc_steps_done
        where = f"BC warm start step {bc_steps_done}" if bc_steps_done is not None else f"step {step}/{steps}"
        super().__init__(f"interrupted at {where}; " + (f"checkpoint saved in {checkpoint}" if checkpoint
                                                        else "nothing to save yet"))

    def __reduce__(self) -> tuple[Any, ...]:
        # a run in a worker process (a study's --jobs) sends it back to the parent, which unpickles it with these
        return type(self), (self.checkpoint, self.step, self.steps, self.bc_steps_done)


class BCInterrupted(KeyboardInterrupt):
    """A behaviour-cloning warm start stopped by Ctrl-C after ``completed`` of its steps (a whole number: the
    interrupt waits for the step under way)."""

    def __init__(self, completed: int) -> None:
        self.completed = completed
        super().__init__(f"BC warm start interrupted after {completed} steps")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.completed,)


class InterruptGuard:
    """A SIGINT handler for one training run (a context manager); see the module docstring.

    Outside the main thread, or where another program already replaced Python's default SIGINT handler (a
    notebook, a process pool's worker), it installs nothing and Python's default behaviour stays.
    """

    def __init__(self) -> None:
        self.requested = False
        self._depth = 0
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or self._depth == 0:
            self.requested = True
            raise KeyboardInterrupt
        self.requested = True  # raised when the critical region ends

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A region that must not be cut (it changes weights or writes state): a Ctrl-C inside it takes effect
        when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.requested:
            raise KeyboardInterrupt
