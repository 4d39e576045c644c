"""Stable seeds derived from a run's seed and loop counters.

Python's ``hash()`` is salted per process, so seeds for task order, rollouts and mini-batch shuffles are
mixed with SHA-256 instead: the same config and counters give the same seed in every process, on every
rank and after a resume.
"""

from __future__ import annotations

import hashlib

__all__ = ["mix_seed"]


def mix_seed(*parts: int) -> int:
    """A 62-bit seed determined by ``parts`` (order matters): ``mix_seed(cfg.seed, step, k)``."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 62) - 1)
