"""What the host does itself around a sandbox, trusting nothing that runs inside it.

An episode's code is hostile: it may answer in place of the warm parent, hide processes, park files or
shared memory. So between episodes the host kills from outside (pids from the cgroup or from its own
``/proc``, pinned with pidfds), empties the writable dirs itself through ``/proc/<parent>/root``, and
checks the parent's state and the cgroup's counters against what it measured right after launch. Any
doubt means the sandbox is destroyed and a fresh one started, never reused.

Names of ipc dirs, cgroups and containers carry their owner (pid namespace, pid, start time), so a later
process can tell the leftovers of a host process that died with SIGKILL and reap them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterable

from agentgym.utils import procfs
from agentgym.utils.procfs import descendants, start_ticks

__all__ = ["PREFIX", "descendants", "empty_dirs", "is_stale", "kill_all_but", "kill_pinned", "parent_doubt",
           "reap_stale_ipc_dirs", "worker_prefix"]

PREFIX = "agentgym-sbx-"
_OWNER = re.compile(r"^agentgym-sbx-(\d+)\.(\d+)\.(\d+)-")
_LEGACY_OWNER = re.compile(r"^agentgym-sbx-(\d+)-\d+(?:-|$)")  # before owners carried a start time
_PREFIX_CACHE: dict[int, str] = {}


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def worker_prefix() -> str:
    """``agentgym-sbx-<pid namespace>.<pid>.<start time>``: who owns a sandbox's dirs, cgroups, containers."""
    pid = os.getpid()
    if pid not in _PREFIX_CACHE:
        _PREFIX_CACHE[pid] = f"{PREFIX}{_pid_namespace()}.{pid}.{start_ticks(pid)}"
    return _PREFIX_CACHE[pid]


def is_stale(name: str) -> bool:
    """Whether ``name`` belongs to a host process (of our pid namespace) that no longer exists."""
    match = _OWNER.match(name)
    if match is None:
        legacy = _LEGACY_OWNER.match(name)
        return legacy is not None and not os.path.exists(f"/proc/{legacy.group(1)}")
    if int(match.group(1)) != _pid_namespace():
        return False
    return start_ticks(int(match.group(2))) != int(match.group(3))


def reap_stale_ipc_dirs(root: str | None = None) -> list[str]:
    """Delete the ipc dirs (host end of the control socket) of sandboxes whose owner died."""
    root = root or tempfile.gettempdir()
    reaped = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.startswith(PREFIX) and is_stale(name):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                reaped.append(name)
    return reaped


def kill_pinned(pids: Iterable[int], members: Callable[[], set[int]]) -> None:
    """SIGKILL each of ``pids`` that is still a member after being pinned with a pidfd.

    Pinning first means a pid that exited and was reused by an unrelated host process is never hit.
    """
    pinned: dict[int, int] = {}
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                pinned[pid] = os.pidfd_open(pid)
        if not pinned:
            return
        still = members()
        for pid, fd in pinned.items():
            if pid in still:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        for fd in pinned.values():
            os.close(fd)


def kill_all_but(keep: frozenset[int], members: Callable[[], set[int]], timeout_s: float = 2.0) -> str | None:
    """Kill every member but ``keep`` until none is left; the reason for doubt if that does not happen."""
    deadline = time.monotonic() + timeout_s
    while True:
        extra = members() - keep
        if not extra:
            return None
        if time.monotonic() > deadline:
            return f"{len(extra)} episode processes survived SIGKILL for {timeout_s:g} s"
        kill_pinned(extra, members)
        time.sleep(0.0005)


def parent_doubt(pid: int) -> str | None:
    """Why the warm parent (host pid) can no longer be trusted: gone, stopped, traced, or dumpable."""
    status = procfs.status(pid)
    if status is None:
        return "the sandbox parent is gone"
    state = status.get("State", "").split()
    if not state or state[0] not in ("S", "R"):
        return f"the sandbox parent is in state {status.get('State', '?').strip()}"
    if status.get("TracerPid", "0").strip() != "0":
        return "the sandbox parent is being traced"
    return None


def _empty_dir(path: str) -> list[str]:
    """Delete everything under ``path`` without following links; returns what is still there."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in os.listdir(fd):
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
        return os.listdir(fd)
    finally:
        os.close(fd)


def empty_dirs(parent_pid: int, paths: Iterable[str]) -> str | None:
    """Empty the sandbox's writable dirs from the host, through the parent's root; the doubt, if any."""
    root = f"/proc/{parent_pid}/root"
    for path in paths:
        full = root + path
        try:
            left = _empty_dir(full)
        except OSError as exc:
            return f"could not empty {path}: {exc}"
        if left:
            return f"{path} is not empty after cleaning ({sorted(left)[:5]})"
    return None
