"""Trajectory storage: append-only, schema-versioned JSONL, and export to Hugging Face datasets.

Each trajectory is one line written with a single ``os.write`` on an ``O_APPEND`` descriptor and then
flushed to disk, so a process killed mid-run (even by SIGKILL) leaves every finished trajectory intact;
at worst the last line is torn, and the reader skips a torn final line with a warning (a writer reopening
the file cuts that torn tail off before it appends, so it never glues a new line onto it).

Any string an env or a model produces is stored exactly. Lines are valid UTF-8 JSON; the rare line whose
text holds lone surrogates (``print('\\ud800')`` in a sandbox, a model emitting half of a pair) writes them
as ``\\udXXX`` escapes and carries ``"escaped_surrogates": true``, and this reader then restores each
escape as the single code point it was, so even a high surrogate followed by a low one is read back as the
two code points written, not joined into one character (which is what generic JSON readers would do).
A trajectory that cannot be serialised at all is logged, counted in :attr:`TrajectoryWriter.failed` and
kept as a ``repr`` line in a side file, never costing the rest of the batch.

Observation images (GUI screenshots) are never inlined: the writer saves each as a content-hashed PNG,
``images/<sha256>.png`` beside the JSONL, *before* the line that refers to it, and the line holds only the
relative path (see :mod:`agentgym.utils.images`). One screenshot seen in many turns or runs is one file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from agentgym.errors import DependencyNotInstalled
from agentgym.trajectory import Trajectory, jsonable, utf8_safe

__all__ = ["TrajectoryWriter", "decode_line", "encode_line", "errors_path", "read_trajectories", "save_images",
           "to_hf_dataset", "write_trajectories"]

logger = logging.getLogger(__name__)

_SURROGATES_FLAG = "escaped_surrogates"
# A JSON \uXXXX escape of a surrogate, preceded by an even number of backslashes (so it is an escape, not
# the literal text "\\ud800" after an escaped backslash).
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89a-f][0-9a-f]{2})", re.IGNORECASE)


def encode_line(record: dict[str, Any]) -> bytes:
    """One JSON line (UTF-8, ending in a newline) for ``record``; see the module docstring for surrogates.

    Values ``json`` rejects (NaN log-probs, numpy ints) go through :func:`~agentgym.trajectory.jsonable`
    first, so strict JSON is written either way.
    """
    try:
        text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        record = jsonable(record)
        text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        pass
    # Lone surrogates sit only inside JSON strings, where backslashreplace's "\udXXX" is the JSON escape.
    text = json.dumps({**record, _SURROGATES_FLAG: True}, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8", "backslashreplace")


def decode_line(raw: bytes) -> Any:
    """Inverse of :func:`encode_line`: the exact record, lone surrogates included."""
    record = json.loads(raw)
    if isinstance(record, dict) and record.get(_SURROGATES_FLAG) is True:
        # Put each escaped surrogate into the JSON text as the code point itself: json copies raw code points
        # verbatim, while it would join an escaped high+low pair into one character.
        text = _SURROGATE_ESCAPE.sub(lambda m: m.group(1) + chr(int(m.group(2), 16)), raw.decode("utf-8"))
        record = json.loads(text)
        del record[_SURROGATES_FLAG]
    return record


def errors_path(path: str | Path) -> Path:
    """Where :class:`TrajectoryWriter` keeps trajectories it could not serialise (``X.errors.jsonl``)."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".jsonl") + ".errors.jsonl")


def _cut_torn_tail(fd: int, path: Path) -> None:
    """Truncate bytes after the last newline (a line torn by a crash), so appends start on a fresh line."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end < size:
        logger.warning("%s: removing a torn final line (%d bytes) left by an interrupted write before appending",
                       path, size - end)
        os.ftruncate(fd, end)


class TrajectoryWriter:
    """Append trajectories to a JSONL file, one atomic line each; safe to share between threads.

    Attributes:
        count: Trajectories written to ``path``.
        failed: Trajectories that could not be serialised; each is logged and kept in :func:`errors_path`.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        _cut_torn_tail(self._fd, self.path)
        self._fsync = fsync
        self._lock = threading.Lock()
        self.count = 0
        self.failed = 0

    def write(self, trajectory: Trajectory) -> bool:
        """Append one trajectory; returns False when it could not be serialised (kept in the errors file).

        Raises:
            OSError: The file itself cannot be written (disk full); nothing else about one trajectory raises.
        """
        try:
            line = encode_line(trajectory.to_dict())
        except Exception as exc:  # noqa: BLE001 - one unserialisable trajectory must not cost the batch
            self._keep_failed(trajectory, exc)
            return False
        save_images(trajectory, self.path.parent)  # before the line, so no line refers to a missing file
        with self._lock:
            self._append(line)
            self.count += 1
        return True

    def _append(self, line: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"TrajectoryWriter for {self.path} is closed.")
        view = memoryview(line)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if self._fsync:
            os.fsync(self._fd)

    def _keep_failed(self, trajectory: Trajectory, exc: Exception) -> None:
        try:
            dump = repr(trajectory)
        except Exception as repr_exc:  # noqa: BLE001 - a broken __repr__ in metadata
            dump = f"<repr failed: {type(repr_exc).__name__}>"
        side = {"traj_id": trajectory.traj_id, "task_id": trajectory.task_id, "env_id": trajectory.env_id,
                "seed": trajectory.seed, "error": f"{type(exc).__name__}: {exc}", "repr": dump}
        line = (json.dumps(jsonable(side), ensure_ascii=True) + "\n").encode("ascii")
        with self._lock:
            self.failed += 1
            with errors_path(self.path).open("ab") as fh:
                fh.write(line)
        logger.error("%s: trajectory %s (task %s) could not be serialised (%s: %s); kept in %s",
                     self.path, trajectory.traj_id, trajectory.task_id, type(exc).__name__, exc,
                     errors_path(self.path))

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


def save_images(trajectory: Trajectory, folder: str | Path) -> int:
    """Write every image of ``trajectory`` (turns and final observation) under ``folder/images/``; returns how many
    references it holds. Files already there (same hash, same bytes) are not written again."""
    images = [*trajectory.prompt_images, *trajectory.final_images]
    for image in images:
        image.save(folder)
    return len(images)


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
            record: Any = decode_line(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if is_last:
                logger.warning("%s: skipping a torn final line (%d bytes) left by an interrupted write", path, len(raw))
                return
            raise ValueError(f"{path}:{lineno}: corrupt trajectory line ({exc}).") from exc
        yield Trajectory.from_dict(record, image_root=str(path.parent))


def to_hf_dataset(trajectories: Iterable[Trajectory]) -> Any:
    """Convert trajectories to a ``datasets.Dataset`` (one row per trajectory, turns as a list column).

    Arrow strings must be valid UTF-8, so lone surrogates appear as ``\\udXXX`` text there
    (:func:`~agentgym.trajectory.utf8_safe`); the JSONL file stays the exact record.
    """
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
        rows.append(_utf8_tree(d))
    return datasets.Dataset.from_list(rows)


def _utf8_tree(value: Any) -> Any:
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, dict):
        return {k: _utf8_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8_tree(v) for v in value]
    return value
