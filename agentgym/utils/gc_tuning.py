"""Fewer garbage-collector passes while a rollout runs.

A rollout allocates many short-lived containers per turn (messages, requests, turn records) while tens of
thousands of long-lived objects stay alive (envs, trajectories, and in a trainer the whole of torch and
transformers). CPython's cyclic collector runs its youngest generation every 700 net allocations and its older
ones every 10 passes of the one below, and each older pass walks every tracked object: with a free policy that
was about a fifth of the engine's time per step (measured with ``benchmarks/rollout_throughput.py``).
Reference counting still frees almost everything at once; only reference cycles wait longer.

:func:`relaxed_gc` raises the youngest generation's threshold for the duration of a block and restores the
interpreter's own thresholds when the last overlapping block ends, so engines running in several threads at
once never leave the process with thresholds nobody asked for.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, ...] | None = None


@contextlib.contextmanager
def relaxed_gc(threshold: int | None) -> Iterator[None]:
    """Run the block with the collector's youngest-generation threshold at least ``threshold`` allocations.

    ``None`` (or a threshold not above the current one) leaves the collector as it is. A disabled collector
    stays disabled, and thresholds someone set higher are kept.
    """
    global _depth, _saved
    if threshold is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            first, *older = _saved
            if first and threshold > first:
                gc.set_threshold(threshold, *older)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
