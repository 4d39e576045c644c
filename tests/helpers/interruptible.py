"""A stand-in for a training run in a worker process, for the Ctrl-C tests of the study runner: it announces that
it started, waits under an :class:`~agentgym.trainers.interrupt.InterruptGuard` as a trainer does, and on Ctrl-C
"saves" (writes a file) and raises :class:`~agentgym.trainers.interrupt.TrainingInterrupted` like the trainer loop."""

from __future__ import annotations

import time
from pathlib import Path

from agentgym.trainers.interrupt import InterruptGuard, TrainingInterrupted


def run_until_interrupted(study: str, scale: str, method: str, seed: int, model: str, settings: object,
                          workdir: str) -> dict:
    """A study's ``train_one``: wait up to a minute for a Ctrl-C, then return a finished run's record."""
    out, name = Path(workdir), f"{method}{seed}"
    with InterruptGuard():
        (out / f"{name}.started").write_text("")
        try:
            for _ in range(600):
                time.sleep(0.1)
        except KeyboardInterrupt:
            (out / f"{name}.saved").write_text("")
            raise TrainingInterrupted(out / name, 2, 5) from None
    return {"method": method, "seed": seed, "curve": [], "seconds": 60.0, "reused": False}
