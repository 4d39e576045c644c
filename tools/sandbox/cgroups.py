"""Per-worker memory and pids cgroups (v1 or v2) for the bubblewrap backend.

Why cgroups and not only rlimits: ``RLIMIT_NPROC`` is ignored for processes whose real uid is root (the
case when bwrap runs as root, even with ``--uid 65534`` inside), and ``RLIMIT_AS`` bounds one process, not
a fork tree. A pids cgroup stops fork bombs and a memory cgroup bounds the whole sandbox; the kernel
OOM-kills inside the group instead of taking the host down.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentgym.tools.sandbox.hostside import kill_pinned

__all__ = ["Cgroup", "cgroup_of", "cgroup_support", "create_cgroup", "reap_stale_cgroups"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT_NAME = "agentgym-sandbox"


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

    def kill_members(self, keep: frozenset[int] = frozenset()) -> None:
        """SIGKILL every member not in ``keep`` (pinned by pidfd, so a reused pid is never hit)."""
        kill_pinned(self.pids() - keep, self.pids)

    def _read(self, *names: str) -> str | None:
        for d in self.dirs:
            for name in names:
                with contextlib.suppress(OSError):
                    return (d / name).read_text()
        return None

    def memory_usage(self) -> int | None:
        """Bytes charged to the group (processes, tmpfs and shared memory pages, kernel objects)."""
        value = self._read("memory.usage_in_bytes", "memory.current")
        return int(value) if value is not None else None

    def pids_current(self) -> int | None:
        """Tasks counted by the pids controller; unlike ``cgroup.procs`` this includes unreaped zombies."""
        value = self._read("pids.current")
        return int(value) if value is not None else None

    def reclaim(self) -> None:
        """Ask the kernel to drop the group's reclaimable pages (page cache read by the episode)."""
        for d in self.dirs:
            for name, value in (("memory.force_empty", "0"), ("memory.reclaim", str(1 << 40))):
                with contextlib.suppress(OSError):
                    (d / name).write_text(value)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill whatever is left in the group, then delete it (retrying while the kernel reaps)."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs:
            while d.exists():
                self.kill_members()
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


def _own_paths(pid: int | str = "self") -> dict[str, str]:
    """A process's cgroup path per controller (``"unified"`` for cgroup v2)."""
    paths: dict[str, str] = {}
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
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
    return (pids_mount / own.get("pids", "/").lstrip("/") / PARENT_NAME / name,
            mem_mount / own.get("memory", "/").lstrip("/") / PARENT_NAME / name)


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
    parent = CGROUP_ROOT / own.lstrip("/") / PARENT_NAME
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


def cgroup_of(pid: int) -> Cgroup | None:
    """The pids and memory groups a process is in (a container's, made by Docker), or ``None``."""
    paths = _own_paths(pid)
    if "unified" in paths and (CGROUP_ROOT / "cgroup.controllers").exists():
        return Cgroup((CGROUP_ROOT / paths["unified"].lstrip("/"),))
    if "pids" in paths and "memory" in paths:
        return Cgroup((CGROUP_ROOT / "pids" / paths["pids"].lstrip("/"),
                       CGROUP_ROOT / "memory" / paths["memory"].lstrip("/")))
    return None


def reap_stale_cgroups(is_stale: Callable[[str], bool]) -> list[str]:
    """Kill the processes in, and delete, every sandbox group whose name ``is_stale`` (its owner died)."""
    own = _own_paths()
    parents = [CGROUP_ROOT / "pids" / own.get("pids", "/").lstrip("/") / PARENT_NAME,
               CGROUP_ROOT / "memory" / own.get("memory", "/").lstrip("/") / PARENT_NAME]
    if "unified" in own:
        parents.append(CGROUP_ROOT / own["unified"].lstrip("/") / PARENT_NAME)
    reaped = []
    for parent in parents:
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                if child.is_dir() and is_stale(child.name):
                    Cgroup((child,)).remove()
                    reaped.append(str(child))
    return reaped


def cgroup_support(probe: str) -> str | None:
    """``None`` when a pids+memory group (named ``probe``, then deleted) can be created here, else why not."""
    try:
        create_cgroup(probe, memory_bytes=64 << 20, pids=8).remove()
    except OSError as exc:
        return str(exc)
    return None
