"""The settings a run directory was made with, and the check that a resume into it uses the same ones.

Resuming with other settings mixed two runs without a word: a training run resumed with a new ``group_size`` used
it while its restored scheduler kept the first run's learning rate, and its ``config.json`` still described the
first run; an evaluation resumed with another temperature appended episodes to the old ones and reported a success
rate that belonged to neither. So a run directory stores its full settings (atomically, so a crash leaves the old
file or the new one), and a resume compares against them: a difference is refused with the list of changed fields
and both ways out (``--force``, or another output directory). A forced resume appends what changed, and when, to
``resume_changes.jsonl`` in the run directory and then stores the new settings, so the directory says what it holds.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.utils.durable import LineAppender, atomic_write_text

__all__ = ["CHANGES_FILE", "SettingChange", "check_resume_settings", "format_changes", "record_changes",
           "settings_changes", "write_settings"]

#: Forced resumes, one JSON line each: when, which settings file, and every field's old and new value.
CHANGES_FILE = "resume_changes.jsonl"

SettingChange = tuple[str, Any, Any]


def _plain(value: Any) -> Any:
    """The JSON form of ``value`` (tuples as lists, paths as strings), so a value compares equal to its stored copy."""
    return json.loads(json.dumps(value, default=str))


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


_MISSING = object()


def settings_changes(old: Mapping[str, Any], new: Mapping[str, Any], *,
                     ignore: Iterable[str] = ()) -> list[SettingChange]:
    """Each field (nested mappings as ``a.b``) whose value differs between ``old`` and ``new``, in ``new``'s order
    then fields only ``old`` has; ``ignore`` names top-level fields that may change between resumes.

    A field ``old`` lacks is not compared: ``old`` was stored by a release that did not record it, and nothing says
    what it was."""
    skipped = set(ignore)
    before, after = _flatten(_plain(dict(old))), _flatten(_plain(dict(new)))
    changes: list[SettingChange] = []
    for key in [*after, *(k for k in before if k not in after)]:
        if key.split(".", 1)[0] in skipped:
            continue
        was, now = before.get(key, _MISSING), after.get(key, _MISSING)
        if was is _MISSING and key.split(".", 1)[0] not in before:
            continue
        if was != now:
            changes.append((key, "(unset)" if was is _MISSING else was, "(unset)" if now is _MISSING else now))
    return changes


def format_changes(changes: Iterable[SettingChange]) -> str:
    """One ``field: old -> new`` line per change, indented, values as JSON (so ``"3"`` and ``3`` differ visibly)."""
    def show(value: Any) -> str:
        return value if value == "(unset)" else json.dumps(value, default=str)

    return "\n".join(f"  {key}: {show(was)} -> {show(now)}" for key, was, now in changes)


def write_settings(path: str | Path, settings: Mapping[str, Any]) -> Path:
    """Store ``settings`` as indented JSON at ``path``, atomically."""
    return atomic_write_text(path, json.dumps(_plain(dict(settings)), indent=2) + "\n")


def check_resume_settings(path: str | Path, settings: Mapping[str, Any], *, force: bool, what: str,
                          force_flag: str = "--force", new_dir_hint: str = "choose a new output directory",
                          ignore: Iterable[str] = ()) -> list[SettingChange]:
    """Compare ``settings`` with those stored at ``path`` before a resume; returns the changes (empty when equal).

    Args:
        path: The run directory's settings file (absent for a run made before settings were stored: then nothing
            can be compared, and the file is written now).
        settings: This invocation's full settings.
        force: Proceed despite changes: they are appended to ``resume_changes.jsonl`` beside ``path`` and ``path``
            is rewritten with ``settings``.
        what: What is being resumed, for the message (e.g. ``"the training run in runs/x"``).
        force_flag: How the user forces it (a flag, or a config field for the Python API).
        new_dir_hint: How the user starts a separate run instead.
        ignore: Top-level fields that may change between resumes (how a run is displayed, not what it computes).

    Raises:
        ConfigError: The settings differ and ``force`` is false; the message lists each ``field: old -> new``.
    """
    path = Path(path)
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        write_settings(path, settings)
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {path} to check that resuming {what} uses the same settings ({exc}). "
                          f"Repair or delete that file (deleting it skips the check), or {new_dir_hint}.") from None
    if not isinstance(stored, Mapping):
        raise ConfigError(f"{path} does not hold a JSON object of settings. Delete it to resume {what} without the "
                          f"check, or {new_dir_hint}.")
    changes = settings_changes(stored, settings, ignore=ignore)
    if not changes:
        return []
    listing = format_changes(changes)
    if not force:
        raise ConfigError(
            f"Resuming {what} with different settings would mix two runs in one directory. Changed "
            f"(stored -> now):\n{listing}\nTo continue anyway with the new settings, add {force_flag} (the change "
            f"is recorded in {path.parent / CHANGES_FILE}); to keep the runs apart, {new_dir_hint}; or run with the "
            f"stored settings ({path}).")
    record_changes(path, settings, changes)
    return changes


def record_changes(path: str | Path, settings: Mapping[str, Any], changes: Iterable[SettingChange]) -> None:
    """Append ``changes`` (with the time) to ``resume_changes.jsonl`` beside the settings file ``path``, then store
    ``settings`` there: the directory says what it holds and how it came to."""
    path = Path(path)
    record = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "settings_file": path.name,
              "changes": [{"field": key, "old": was, "new": now} for key, was, now in changes]}
    with LineAppender(path.parent / CHANGES_FILE) as out:
        out.append((json.dumps(record, default=str) + "\n").encode("utf-8"))
    write_settings(path, settings)
