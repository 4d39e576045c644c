"""Trajectory storage: append-only, schema-versioned JSONL, and export to Hugging Face datasets.

Each trajectory is one line written with a single ``os.write`` on an ``O_APPEND`` descriptor and then
flushed to disk, so a process killed mid-run (even by SIGKILL) leaves every finished trajectory intact;
at worst the last line is torn, and the reader skips a torn final line with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from agentgym.errors import DependencyNotInstalled
from agentgym.trajectory import Trajectory

__all__ = ["TrajectoryWriter", "read_trajectories", "to_hf_dataset", "write_trajectories"]

logger = logging.getLogger(__name__)


class TrajectoryWriter:
    """Append trajectories to a JSONL file, one atomic line each; safe to share between threads."""

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fsync = fsync
        self._lock = threading.Lock()
        self.count = 0

    def write(self, trajectory: Trajectory) -> None:
        line = (json.dumps(trajectory.to_dict(), ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"TrajectoryWriter for {self.path} is closed.")
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self._fsync:
                os.fsync(self._fd)
            self.count += 1

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Append many trajectories; returns how many were written."""
    with TrajectoryWriter(path, fsync=False) as writer:
        for t in trajectories:
            writer.write(t)
        return writer.count


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Yield trajectories from a JSONL file, skipping a torn final line (a write cut off by a crash)."""
    path = Path(path)
    with path.open("rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        is_last = lineno == len(lines)
        try:
            record: Any = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if is_last:
                logger.warning("%s: skipping a torn final line (%d bytes) left by an interrupted write", path, len(raw))
                return
            raise ValueError(f"{path}:{lineno}: corrupt trajectory line ({exc}).") from exc
        yield Trajectory.from_dict(record)


def to_hf_dataset(trajectories: Iterable[Trajectory]) -> Any:
    """Convert trajectories to a ``datasets.Dataset`` (one row per trajectory, turns as a list column)."""
    try:
        import datasets
    except ImportError as exc:
        raise DependencyNotInstalled("datasets", "data", "exporting trajectories") from exc
    rows = []
    for t in trajectories:
        d = t.to_dict()
        d["outcome"] = json.dumps(d["outcome"])
        d["timing"] = json.dumps(d["timing"])
        d["metadata"] = json.dumps(d["metadata"])
        for turn in d["turns"]:
            turn["info"] = json.dumps(turn["info"])
        d["success"] = t.success
        d["score"] = t.score
        rows.append(d)
    return datasets.Dataset.from_list(rows)
