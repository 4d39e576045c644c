"""Trajectory storage: append-only, schema-versioned JSONL, and export to Hugging Face datasets.

Each trajectory is one line written on an ``O_APPEND`` descriptor and then flushed to disk, so a process killed
mid-run (even by SIGKILL) leaves every finished trajectory intact; at worst the last line is torn, and the reader
skips a torn final line with a warning (a writer reopening the file cuts that torn tail off before it appends, so it
never glues a new line onto it). A write that fails part-way (a full disk stores part of the line, then ENOSPC) is
cut back to the line's start at once, so a later append cannot glue onto it either; :func:`repair_trajectories`
moves any unreadable line an older writer left out of the file before a run resumes.

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
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from agentgym.errors import DependencyNotInstalled
from agentgym.trajectory import Trajectory, jsonable, utf8_safe
from agentgym.utils.durable import LineAppender, atomic_write_bytes

__all__ = ["Repair", "TrajectoryWriter", "decode_line", "encode_line", "errors_path", "quarantine_path",
           "read_trajectories", "repair_trajectories", "save_images", "to_hf_dataset", "write_trajectories"]

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


class TrajectoryWriter:
    """Append trajectories to a JSONL file, one whole line each; safe to share between threads.

    A line that cannot be written (disk full: ENOSPC, EFBIG past ``RLIMIT_FSIZE``) is cut back at once, so the file
    never holds a partial line that a later append would glue onto (see :class:`~agentgym.utils.durable.LineAppender`).

    Args:
        path: The JSONL file; a torn final line left by a crash is cut off before the first append.
        fsync: fsync after each line.
        raise_on_os_error: ``True`` (default): :meth:`write` raises the ``OSError``. ``False``: it logs one line,
            counts the trajectory in :attr:`lost` and returns ``False``, so a caller that watches
            :attr:`consecutive_lost` (``agentgym eval``) decides when to stop instead of getting a traceback per
            episode.

    Attributes:
        count: Trajectories written to ``path``.
        failed: Trajectories that could not be serialised; each is logged and kept in :func:`errors_path`.
        lost: Trajectories that could not be written (I/O error); none of their bytes stay in ``path``.
        consecutive_lost: Writes lost since the last one that succeeded (a disk that stays full keeps it growing).
        last_error: The last ``OSError`` a write met, or ``None``.
        unwritten: ``traj_id`` s of the trajectories that are not in ``path`` (failed or lost).
    """

    def __init__(self, path: str | Path, *, fsync: bool = True, raise_on_os_error: bool = True) -> None:
        self.path = Path(path)
        self._lines = LineAppender(self.path, fsync=fsync)
        self._raise = raise_on_os_error
        self._lock = threading.Lock()
        self.count = 0
        self.failed = 0
        self.lost = 0
        self.consecutive_lost = 0
        self.last_error: OSError | None = None
        self.unwritten: set[str] = set()

    def write(self, trajectory: Trajectory) -> bool:
        """Append one trajectory; returns False when it is not in the file (unserialisable, or lost to an I/O error
        with ``raise_on_os_error=False``).

        Raises:
            OSError: With ``raise_on_os_error=True``, the file itself cannot be written (disk full); the file is
                then as it was before the call.
        """
        try:
            line = encode_line(trajectory.to_dict())
        except Exception as exc:  # noqa: BLE001 - one unserialisable trajectory must not cost the batch
            self._keep_failed(trajectory, exc)
            return False
        try:
            save_images(trajectory, self.path.parent)  # before the line, so no line refers to a missing file
            self._lines.append(line)
        except OSError as exc:
            with self._lock:
                self.lost += 1
                self.consecutive_lost += 1
                self.last_error = exc
                self.unwritten.add(trajectory.traj_id)
            if self._raise:
                raise
            logger.warning("%s: trajectory %s (task %s, seed %s) was not written: %s", self.path, trajectory.traj_id,
                           trajectory.task_id, trajectory.seed, exc)
            return False
        with self._lock:
            self.count += 1
            self.consecutive_lost = 0
        return True

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
            self.unwritten.add(trajectory.traj_id)
            try:
                with LineAppender(errors_path(self.path), fsync=False) as side_file:
                    side_file.append(line)
            except OSError as side_exc:  # a full disk must not turn one bad record into a crash of the run
                logger.error("%s: could not keep it either: %s", errors_path(self.path), side_exc)
        logger.error("%s: trajectory %s (task %s) could not be serialised (%s: %s); kept in %s",
                     self.path, trajectory.traj_id, trajectory.task_id, type(exc).__name__, exc,
                     errors_path(self.path))

    def close(self) -> None:
        self._lines.close()

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


def read_trajectories(path: str | Path, *, skip_corrupt: bool = False) -> Iterator[Trajectory]:
    """Yield trajectories from a JSONL file, skipping a torn final line (a write cut off by a crash).

    Args:
        skip_corrupt: Also skip a line anywhere in the file that is not valid JSON, with a warning naming it (for
            reading what an older writer left after a full disk); by default such a line raises.

    Raises:
        ValueError: A line before the last one is not JSON (unless ``skip_corrupt``).
    """
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
            if skip_corrupt:
                logger.warning("%s:%d: skipping a corrupt line (%d bytes: %s)", path, lineno, len(raw), exc)
                continue
            raise ValueError(f"{path}:{lineno}: corrupt trajectory line ({exc}).") from exc
        yield Trajectory.from_dict(record, image_root=str(path.parent))


def quarantine_path(path: str | Path) -> Path:
    """Where :func:`repair_trajectories` moves the lines it cannot read (``X.corrupt.jsonl``)."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".jsonl") + ".corrupt.jsonl")


@dataclass(frozen=True)
class Repair:
    """What :func:`repair_trajectories` found: the readable trajectories, in file order, and the lines it moved out.

    Attributes:
        trajectories: Every trajectory the file still holds.
        corrupt_lines: 1-based numbers of the lines moved to :func:`quarantine_path` (a torn final line included).
    """

    trajectories: list[Trajectory]
    corrupt_lines: list[int]


def repair_trajectories(path: str | Path) -> Repair:
    """Read ``path`` for a resumed run, moving each line that is not a readable trajectory out of it.

    A run interrupted by a crash or a full disk (or written by an older release, which did not cut a failed append
    back) can hold a torn final line or a corrupt line anywhere. Each such line is appended to
    :func:`quarantine_path` with its line number and the reason, a warning names it, and ``path`` is rewritten
    atomically without it, so appends that follow and every later reader see a clean file.

    Raises:
        OSError: The quarantine file or the rewritten file could not be written (e.g. the disk is still full);
            ``path`` is then unchanged.
    """
    path = Path(path)
    data = path.read_bytes()
    kept: list[bytes] = []
    trajectories: list[Trajectory] = []
    bad: list[tuple[int, bytes, str]] = []
    pieces = data.split(b"\n")
    for lineno, raw in enumerate(pieces, 1):
        if not raw.strip():
            continue
        try:
            trajectories.append(Trajectory.from_dict(decode_line(raw), image_root=str(path.parent)))
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            torn = lineno == len(pieces)  # no newline after it: a write cut off
            reason = "torn final line (interrupted write)" if torn else f"{type(exc).__name__}: {exc}"
            bad.append((lineno, raw, reason))
            continue
        kept.append(raw + b"\n")
    if not bad:
        return Repair(trajectories, [])
    quarantine = quarantine_path(path)
    with LineAppender(quarantine) as side_file:
        for lineno, raw, reason in bad:
            side_file.append((json.dumps({"file": path.name, "line": lineno, "reason": reason,
                                          "raw": raw.decode("utf-8", "backslashreplace")}) + "\n").encode("utf-8"))
    atomic_write_bytes(path, b"".join(kept))
    for lineno, raw, reason in bad[:_NAMED_LINES]:
        logger.warning("%s:%d: moved an unreadable line (%d bytes; %s) to %s", path, lineno, len(raw), reason,
                       quarantine)
    if len(bad) > _NAMED_LINES:
        logger.warning("%s: %d more unreadable lines moved to %s", path, len(bad) - _NAMED_LINES, quarantine)
    return Repair(trajectories, [lineno for lineno, _, _ in bad])


#: Unreadable lines that :func:`repair_trajectories` names one warning each; the rest are counted in one line.
_NAMED_LINES = 20


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
