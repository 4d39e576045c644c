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
import errno
import functools
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable

from agentgym.utils import procfs
from agentgym.utils.procfs import descendants, start_ticks

__all__ = ["PREFIX", "descendants", "empty_dirs", "is_stale", "kill_all_but", "kill_pinned", "parent_changes",
           "parent_doubt", "parent_state", "reap_stale_ipc_dirs", "worker_prefix"]

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


# What an episode may change in the warm parent from outside it, as the host reads it. Same-uid processes
# can write /proc/<pid>/oom_score_adj (when the uid owns the proc files), call setpriority, sched_setaffinity,
# sched_setscheduler, ioprio_set and prlimit on it; children forked later inherit every one of these.
_PROC_FILES = ("oom_score_adj", "oom_adj", "limits", "coredump_filter", "timerslack_ns", "autogroup", "comm",
               "loginuid", "sessionid", "attr/current")
_STATUS_FIELDS = ("Umask", "Uid", "Gid", "Groups", "Cpus_allowed_list", "Mems_allowed_list", "SigBlk", "SigIgn",
                  "SigCgt", "NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
_IOPRIO_GET = {"x86_64": 252, "aarch64": 30}
_IOPRIO_WHO_PROCESS = 1


def _ioprio(pid: int) -> str:
    """``ioprio_get`` of ``pid`` (no /proc file shows it); ``"?"`` where it cannot be read."""
    import ctypes
    import platform

    nr = _IOPRIO_GET.get(platform.machine())
    if nr is None:
        return "?"
    value = ctypes.CDLL(None, use_errno=True).syscall(nr, _IOPRIO_WHO_PROCESS, pid)
    return str(value) if value >= 0 else "?"


def parent_state(pid: int) -> dict[str, str]:
    """The warm parent's settings that an episode could change from outside and that later episodes would
    inherit; compared by the host against the launch baseline after every episode (any change: no reuse)."""
    state: dict[str, str] = {}
    for name in _PROC_FILES:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                state[name] = f.read(8192).decode(errors="replace")
        except OSError as exc:
            state[name] = f"<{exc.errno}>"
    status = procfs.status(pid) or {}
    for field in _STATUS_FIELDS:
        state[field] = status.get(field, "").strip()
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # stat(5) fields 18-19 (priority, nice) and 40-41 (rt_priority, policy), counted from field 3 here.
        state["sched"] = b" ".join((fields[15], fields[16], fields[37], fields[38])).decode()
    except (OSError, IndexError):
        state["sched"] = "?"
    state["ioprio"] = _ioprio(pid)
    for link in ("cwd", "root"):
        try:
            state[link] = os.readlink(f"/proc/{pid}/{link}")
        except OSError as exc:
            state[link] = f"<{exc.errno}>"
    return state


def parent_changes(pid: int, baseline: dict[str, str]) -> str | None:
    """What differs in the parent's inheritable settings from ``baseline``, or ``None``."""
    now = parent_state(pid)
    changed = sorted(k for k in baseline if now.get(k) != baseline[k])
    if not changed:
        return None
    return "the sandbox parent's " + ", ".join(changed) + " changed during the episode"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Most entries one cleanup may visit: far above what a size-capped tmpfs holds in practice, but a bound, so
#: a tree that somehow keeps changing under the cleaner ends in doubt instead of a loop.
MAX_CLEANUP_ENTRIES = 5_000_000


def _open_subdir(name: str, dir_fd: int) -> int:
    """Open a sub-directory without following links, making it searchable first if it is ``chmod 000``."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        # Only reached when the host is not root (root ignores modes): chmod through an O_PATH descriptor,
        # so a symlink swapped in by name could never redirect the chmod.
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        finally:
            os.close(path_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _as_writable(dir_fd: int, action: Callable[[], None]) -> None:
    """Run ``action`` (an unlink or rmdir in ``dir_fd``); on EACCES make the directory writable and retry once."""
    try:
        action()
    except PermissionError:
        os.fchmod(dir_fd, 0o700)
        action()


def _scan(dir_fd: int, budget: list[int]) -> list[str]:
    """Unlink every non-directory in ``dir_fd``; return the names of its sub-directories (not followed)."""
    subdirs = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            budget[0] -= 1
            if budget[0] < 0:
                raise OSError(f"more than {MAX_CLEANUP_ENTRIES} entries to delete")
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(name)
                continue
            with contextlib.suppress(FileNotFoundError):
                _as_writable(dir_fd, functools.partial(os.unlink, name, dir_fd=dir_fd))
    return subdirs


def _clear_tree(top_fd: int) -> None:
    """Delete everything below the directory ``top_fd``, iteratively, never following a link or a mount.

    Why not ``shutil.rmtree``: it recurses once per level, so a tree a few thousand levels deep (one
    ``os.makedirs`` away for sandboxed code) raises ``RecursionError`` and leaves the sandbox half-cleaned.
    Why not paths: a path through 1,200 levels of 255-byte names is far beyond ``PATH_MAX``. So this walks
    with one open descriptor at a time, going down by name and back up through ``..``, and checks on every
    way up that ``..`` is the directory it came from (same device and inode), so a tree changed under it
    cannot lead it outside the sandbox's directory. Only names of directories still to visit are kept.
    """
    fd = os.dup(top_fd)
    top = os.fstat(fd)
    budget = [MAX_CLEANUP_ENTRIES]
    # One frame per level: (inode of the directory, its sub-directories still to delete, its name in its parent).
    frames: list[tuple[int, list[str], str]] = [(top.st_ino, _scan(fd, budget), "")]
    try:
        while True:
            _, pending, _ = frames[-1]
            if pending:
                name = pending.pop()
                try:
                    _as_writable(fd, functools.partial(os.rmdir, name, dir_fd=fd))  # empty: no need to go in
                    continue
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                child = _open_subdir(name, fd)
                info = os.fstat(child)
                if info.st_dev != top.st_dev:
                    os.close(child)
                    raise OSError(f"{name!r} is a mount point inside a writable dir")
                os.close(fd)
                fd = child
                frames.append((info.st_ino, _scan(fd, budget), name))
                continue
            if len(frames) == 1:
                return
            _, _, name = frames.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            info = os.fstat(up)
            os.close(fd)
            fd = up
            if (info.st_dev, info.st_ino) != (top.st_dev, frames[-1][0]):
                raise OSError("the directory tree changed while it was being deleted")
            _as_writable(fd, functools.partial(os.rmdir, name, dir_fd=fd))
    finally:
        os.close(fd)


def _empty_dir(path: str) -> list[str]:
    """Delete everything under ``path`` without following links; returns what is still there."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        _clear_tree(fd)
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
        except (OSError, ValueError) as exc:
            return f"could not empty {path}: {exc}"
        if left:
            return f"{path} is not empty after cleaning ({sorted(left)[:5]})"
    return None
