"""Reading processes from Linux's ``/proc``: the one place that parses ``stat``, ``status`` and ``cmdline``.

The browser pool watches the Chromium it launched (is it stopped, which processes are its own) and the sandbox
host finds, pins and kills a sandbox's processes from outside it. Both need the same few facts about a pid, and
``/proc`` has traps that each reader would otherwise meet on its own: a command name in ``stat`` may hold
spaces and ``)``, a process may exit between listing and reading, and a pid alone may name a later,
unrelated process (its start time tells them apart).

Every reader returns an empty or ``None`` result for a process that is gone instead of raising, because a
process can exit at any moment between two reads.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["all_pids", "children", "cmdline", "cpu_flags", "descendants", "parent_pid", "start_ticks", "stat_fields",
           "state", "status"]


def all_pids() -> list[int]:
    """The pid of every process this pid namespace's ``/proc`` lists."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...); empty if it is gone.

    The name is cut at the *last* ``)``: it sits in parentheses and may itself hold spaces and ``)``.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    _name, sep, rest = raw.rpartition(b")")
    return rest.decode("ascii", "replace").split() if sep else []


def state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (R, S, T, Z, ...), or None if it is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def parent_pid(pid: int) -> int | None:
    """The pid of ``pid``'s parent, or None if it is gone."""
    fields = stat_fields(pid)
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if it is gone.

    With the pid it names one process: a pid reused by a later process comes with another start time.
    """
    fields = stat_fields(pid)
    try:
        return int(fields[19])  # field 22 of stat, counted from the state (field 3)
    except (IndexError, ValueError):
        return None


def status(pid: int) -> dict[str, str] | None:
    """``/proc/PID/status`` as ``{key: raw value}`` (values keep their whitespace), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")  # the Name line holds whatever bytes the process chose
    except OSError:
        return None
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid`` (its argv), or None if it is gone or unreadable.

    Arguments are decoded as the file system decodes names (undecodable bytes survive), so one that is a path
    can be opened as given.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    args = raw.split(b"\x00")
    if args and args[-1] == b"":  # each argument ends with a NUL, the last one too
        args.pop()
    return [os.fsdecode(arg) for arg in args]


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from its threads' ``children`` files (no scan of all of ``/proc``).

    Empty if ``pid`` is gone; a thread that exits while being read ends the reading with what was found so far.
    """
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                found.extend(int(child) for child in fh.read().split())
    return found


def descendants(root_pid: int) -> set[int]:
    """``root_pid`` and every process below it.

    Built from every process's parent pid in one scan of ``/proc``, not by following ``children`` files: a
    process is found whatever its parent's threads record, and orphans in a pid namespace are re-parented
    to its init, so nothing below ``root_pid`` escapes the walk.
    """
    below: dict[int, list[int]] = {}
    for pid in all_pids():
        parent = parent_pid(pid)
        if parent is not None:  # else it has just exited
            below.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(below.get(pid, ()))
    return found


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of the first CPU in ``/proc/cpuinfo`` (``avx512_bf16``, ``amx_bf16`` ...); empty
    where there is no such file (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()
