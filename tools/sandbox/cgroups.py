"""Per-worker memory and pids cgroups (v1 or v2) for the bubblewrap backend.

Why cgroups and not only rlimits: ``RLIMIT_NPROC`` is ignored for processes whose real uid is root (the
case when bwrap runs as root, even with ``--uid 65534`` inside), and ``RLIMIT_AS`` bounds one process, not
a fork tree. A pids cgroup stops fork bombs and a memory cgroup bounds the whole sandbox; the kernel
OOM-kills inside the group instead of taking the host down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cgroup", "cgroup_support", "create_cgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Cgroup:
    """One sandbox's group: the ``cgroup.procs`` files a pid must be written to, per hierarchy."""

    dirs: tuple[Path, ...]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in f.read_text().split())
        return found

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill whatever is left in the group, then delete it (retrying while the kernel reaps)."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs:
            while d.exists():
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per controller (``"unified"`` for cgroup v2)."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["unified"]:
            paths[controller] = path
    return paths


def _v1_dirs(name: str) -> tuple[Path, Path] | None:
    own = _own_paths()
    pids_mount, mem_mount = CGROUP_ROOT / "pids", CGROUP_ROOT / "memory"
    if not (pids_mount / "cgroup.procs").exists() or not (mem_mount / "cgroup.procs").exists():
        return None
    return (pids_mount / own.get("pids", "/").lstrip("/") / "agentgym-sandbox" / name,
            mem_mount / own.get("memory", "/").lstrip("/") / "agentgym-sandbox" / name)


def _create_v1(name: str, memory_bytes: int, pids: int) -> Cgroup:
    dirs = _v1_dirs(name)
    if dirs is None:
        raise OSError("no cgroup v1 pids and memory hierarchies")
    pids_dir, mem_dir = dirs
    pids_dir.mkdir(parents=True, exist_ok=True)
    mem_dir.mkdir(parents=True, exist_ok=True)
    try:
        (pids_dir / "pids.max").write_text(str(pids))
        (mem_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
        swap = mem_dir / "memory.memsw.limit_in_bytes"
        if swap.exists():  # no escaping the memory limit through swap
            with contextlib.suppress(OSError):
                swap.write_text(str(memory_bytes))
    except OSError:
        Cgroup((pids_dir, mem_dir)).remove()
        raise
    return Cgroup((pids_dir, mem_dir))


def _create_v2(name: str, memory_bytes: int, pids: int) -> Cgroup:
    own = _own_paths().get("unified")
    if own is None or not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise OSError("no cgroup v2 hierarchy")
    parent = CGROUP_ROOT / own.lstrip("/") / "agentgym-sandbox"
    parent.mkdir(exist_ok=True)
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    if not {"pids", "memory"} <= set(enabled):
        (parent / "cgroup.subtree_control").write_text("+pids +memory")
    group = parent / name
    group.mkdir(exist_ok=True)
    try:
        (group / "pids.max").write_text(str(pids))
        (group / "memory.max").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):
            (group / "memory.swap.max").write_text("0")
    except OSError:
        Cgroup((group,)).remove()
        raise
    return Cgroup((group,))


def create_cgroup(name: str, *, memory_bytes: int, pids: int) -> Cgroup:
    """Create a group limiting memory and process count; raises ``OSError`` saying why it could not."""
    errors = []
    for create in (_create_v1, _create_v2):
        try:
            return create(name, memory_bytes, pids)
        except OSError as exc:
            errors.append(f"{create.__name__[8:]}: {exc}")
    raise OSError("; ".join(errors))


def cgroup_support() -> str | None:
    """``None`` when a pids+memory group can be created here, else the reason it cannot."""
    probe = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        create_cgroup(probe, memory_bytes=64 << 20, pids=8).remove()
    except OSError as exc:
        return str(exc)
    return None
