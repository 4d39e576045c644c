"""What the viewer shows of a run, read from disk: episodes, their token data, settings, summary and metrics.

A run is any of:

* an eval directory (``trajectories.jsonl``, ``run.json``, ``summary.json``);
* a training output directory (``config.json``, ``summary.json``, ``metrics.jsonl`` and, with ``save_rollouts``,
  ``rollouts/step-NNNNNN.jsonl`` with their ``.tokens.jsonl`` sidecars);
* one trajectories JSONL file (a ``.tokens.jsonl`` beside it and the directory's ``run.json``/``config.json`` and
  ``summary.json`` are read too).

Every file but the trajectories is optional, and one that cannot be read (a run still being written, a disk that
filled up) is left out with a note in :attr:`ViewerRun.notes` rather than failing the page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.trajectory import Trajectory

__all__ = ["Episode", "ViewerRun", "check_trajectory_file", "load_run"]

_STEP_FILE = re.compile(r"step-(\d+)(?:-rank\d+)?\.jsonl$")


@dataclass
class Episode:
    """One trajectory with where it came from and its token data.

    Attributes:
        trajectory: The stored trajectory (its images resolve against its file's folder).
        source: The file it was read from, relative to the run (``trajectories.jsonl``, ``rollouts/step-000010.jsonl``).
        train_step: The training step that sampled it (``None`` for eval episodes).
        tokens: Its ``.tokens.jsonl`` record (token texts, loss mask, log-probs, advantages), when one was saved.
    """

    trajectory: Trajectory
    source: str
    train_step: int | None = None
    tokens: dict[str, Any] | None = None


@dataclass
class ViewerRun:
    """Everything the page shows.

    Attributes:
        title: The page title (the path viewed).
        kind: ``eval``, ``train`` or ``file``.
        episodes: In file order; training steps in step order.
        settings: The run's settings (eval's ``run.json``, a trainer's ``config.json``).
        summary: ``summary.json``.
        metrics: ``metrics.jsonl`` records (a training run), in order.
        notes: Files that were there but could not be read, and why.
    """

    title: str
    kind: str
    episodes: list[Episode] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_run(path: str | Path, *, limit: int | None = None) -> ViewerRun:
    """Read the run at ``path`` (see the module docstring); at most ``limit`` episodes.

    Raises:
        ConfigError: Nothing viewable is there, or a trajectories file is not one (with what to pass instead).
    """
    path = Path(path)
    if path.is_file():
        run = ViewerRun(title=str(path), kind="file")
        _read_trajectory_file(run, path, path.name, limit)
        _read_side_files(run, path.parent)
        return run
    if not path.is_dir():
        raise ConfigError(f"No trajectory file or run directory at {path}; pass the trajectories.jsonl or the output "
                          "directory written by 'agentgym eval' or 'agentgym train'.")
    files = list(_run_files(path))
    if not files and not (path / "metrics.jsonl").is_file():
        raise ConfigError(f"{path} holds no trajectories.jsonl, rollouts/ or metrics.jsonl: pass the output directory "
                          "of 'agentgym eval', or of 'agentgym train' (set save_rollouts: N in its config to keep the "
                          "training episodes).")
    run = ViewerRun(title=str(path), kind="train" if (path / "config.json").is_file() else "eval")
    for file in files:
        remaining = None if limit is None else limit - len(run.episodes)
        if remaining is not None and remaining <= 0:
            break
        _read_trajectory_file(run, file, file.relative_to(path).as_posix(), remaining)
    _read_side_files(run, path)
    return run


def _run_files(folder: Path) -> Iterator[Path]:
    if (folder / "trajectories.jsonl").is_file():
        yield folder / "trajectories.jsonl"
    rollouts = folder / "rollouts"
    if rollouts.is_dir():
        steps = [(int(m.group(1)), p.name, p) for p in rollouts.iterdir() if (m := _STEP_FILE.match(p.name))]
        yield from (p for _, _, p in sorted(steps))


def check_trajectory_file(path: Path) -> None:
    """Fail with the fix when the first line of ``path`` is not a trajectory record: a summary.json or a metrics
    file passed by mistake is a wrong argument, not a file of corrupt lines to warn about one by one.

    Raises:
        ConfigError: The first non-empty line is not a trajectory.
    """
    from agentgym.storage import decode_line

    with path.open("rb") as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None or not first.endswith(b"\n"):  # empty, or one torn line: the reader's own checks say so
        return
    try:
        record = decode_line(first)
        Trajectory.from_dict(record)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(_not_a_trajectory_file(path, 1, exc)) from None


def _read_trajectory_file(run: ViewerRun, path: Path, source: str, limit: int | None) -> None:
    from agentgym.storage import read_trajectories

    check_trajectory_file(path)
    tokens = _read_tokens(run, path.with_name(path.name.removesuffix(".jsonl") + ".tokens.jsonl"))
    match = _STEP_FILE.match(path.name)
    file_step = int(match.group(1)) if match else None
    records = read_trajectories(path, skip_corrupt=True)  # a torn last line (a run being written) is skipped
    read = 0
    while limit is None or read < limit:
        try:
            traj = next(records, None)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not a trajectory record
            raise ConfigError(_not_a_trajectory_file(path, read + 1, exc)) from None
        if traj is None:
            if read == 0 and path.stat().st_size and path.read_bytes().strip():
                raise ConfigError(_not_a_trajectory_file(path, 1, ValueError("no complete JSON line")))
            break
        read += 1
        step = traj.metadata.get("train_step", file_step)
        run.episodes.append(Episode(traj, source, step if isinstance(step, int) else None,
                                    tokens.get(traj.traj_id) if traj.traj_id else None))


def _read_tokens(run: ViewerRun, path: Path) -> dict[str, dict[str, Any]]:
    """traj_id -> its token record; records that do not hold the fields the token view needs are left out."""
    from agentgym.storage import decode_line

    if not path.is_file():
        return {}
    found: dict[str, dict[str, Any]] = {}
    skipped = 0
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        run.notes.append(f"{path.name}: {exc}")
        return {}
    for raw in lines:
        try:
            record = decode_line(raw)
        except ValueError:
            continue  # a torn line of a file being written
        if _is_token_record(record):
            found[record["traj_id"]] = record
        elif raw.strip():
            skipped += 1
    if skipped:
        run.notes.append(f"{path.name}: {skipped} line(s) are not token records and are not shown")
    return found


def _is_token_record(record: Any) -> bool:
    """Whether ``record`` has the shape the token view draws (so a hand-edited or foreign line cannot break the
    page): token texts, per-token log-prob numbers, ``[value, count]`` runs covering every token, and for an
    episode in segments their lengths adding up to its tokens."""
    if not (isinstance(record, dict) and isinstance(record.get("traj_id"), str)):
        return False
    tokens, logprob = record.get("tokens"), record.get("logprob")
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        return False
    if not (isinstance(logprob, list) and len(logprob) == len(tokens) and all(_is_number(x) for x in logprob)):
        return False
    for key in ("mask", "advantage"):
        runs = record.get(key)
        if not (isinstance(runs, list) and all(isinstance(r, list) and len(r) == 2 and _is_number(r[0])
                                               and isinstance(r[1], int) and r[1] > 0 for r in runs)):
            return False
        if sum(r[1] for r in runs) != len(tokens):
            return False
    segments = record.get("segments")  # an episode in segments: their lengths, in order
    if segments is not None and not (isinstance(segments, list) and segments
                                     and all(type(n) is int and n > 0 for n in segments)
                                     and sum(segments) == len(tokens)):
        return False
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_side_files(run: ViewerRun, folder: Path) -> None:
    for name in ("run.json", "config.json"):
        settings = _read_json(run, folder / name)
        if isinstance(settings, dict):
            run.settings = {**settings, **run.settings}
    summary = _read_json(run, folder / "summary.json")
    if isinstance(summary, dict):
        run.summary = summary
    metrics = folder / "metrics.jsonl"
    if metrics.is_file():
        try:
            lines = metrics.read_bytes().splitlines()
        except OSError as exc:
            run.notes.append(f"metrics.jsonl: {exc}")
            lines = []
        for raw in lines:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
                run.metrics.append(record)


def _read_json(run: ViewerRun, path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        run.notes.append(f"{path.name} could not be read ({exc})")
        return None


def _not_a_trajectory_file(path: Path, record: int, exc: Exception) -> str:
    """The message for a file the viewer cannot read: where it failed, why, and what to pass instead."""
    why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
    return (f"{path} is not a trajectories file (record {record}: {why}). Pass the trajectories.jsonl that "
            "'agentgym eval' or a trainer wrote (one JSON trajectory per line).")
