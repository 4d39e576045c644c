"""How a sandbox process is launched: bubblewrap or a Docker container, behind one small interface.

Both backends run the same in-sandbox parent (``_zygote.py``) as PID 1 of its own pid namespace, with the
host's Python installation mounted read-only, private size-capped writable dirs (work dir, /tmp, /dev/shm),
no network, dropped capabilities and uid 65534. They differ only in who enforces memory/pids limits (our
cgroup vs. Docker) and how the process is stopped. Both are started with an explicit minimal environment:
the launcher's own variables (API keys, tokens) would otherwise show in ``/proc/*/environ`` inside.

After launch, :meth:`Backend.attach` finds the sandbox's processes from the host side (its cgroup or its
process tree), before any episode code has run; that set is what the host keeps when it cleans up.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.tools.sandbox.cgroups import (
    Cgroup,
    cgroup_of,
    cgroup_support,
    create_cgroup,
    reap_stale_cgroups,
)
from agentgym.tools.sandbox.config import SandboxConfig
from agentgym.tools.sandbox.hostside import (
    PREFIX,
    is_stale,
    parent_state,
    reap_stale_ipc_dirs,
    worker_prefix,
)
from agentgym.tools.sandbox.seccomp import build_filter
from agentgym.tools.sandbox.uids import UidLease, lease_uid
from agentgym.utils import procfs
from agentgym.utils.procfs import descendants

__all__ = ["Backend", "BwrapBackend", "DockerBackend", "Launch", "SandboxUnavailable", "ensure_docker_image",
           "private_uid_unavailable", "resolve_backend"]

log = logging.getLogger(__name__)

ZYGOTE_SOURCE = Path(__file__).with_name("_zygote.py")
ZYGOTE_PATH = "/opt/agentgym/zygote.py"
IPC_DIR = "/ipc"
WORK_DIR = "/work"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMEXPR_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
              "HOME": WORK_DIR, "MPLBACKEND": "Agg",
              # `python` in a shell inside the sandbox is the interpreter the sandbox runs.
              "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"}


class SandboxUnavailable(RuntimeError):
    """No isolation mechanism works here; the message says what to install. Code is never run unsandboxed."""


@dataclass
class Launch:
    """A started sandbox process, how to tear it down, and what the host saw of it right after launch.

    Attributes:
        process: The host-side process (bwrap's monitor, or the ``docker run`` client).
        cgroup: The group this backend created (deleted on stop).
        container: The container name (Docker).
        parent_pid: Host pid of the warm parent (the sandbox's PID 1).
        observed: The group holding every process of the sandbox (ours, or the container's).
        known_pids: Host pids of the sandbox itself, found before any episode ran; the rest is episode.
        baseline_memory: Bytes charged to ``observed`` with the parent idle; cleanup must return near it.
        baseline_tasks: ``pids.current`` with the parent idle (zombies count until reaped).
        verifiable: Whether the host can check and clean this sandbox itself; if not it is never reused.
        reusable: False for a sandbox that keeps what an episode wrote where the host cannot empty it (a
            writable image root): it is never marked verifiable, so it serves one session only.
        baseline_parent: The warm parent's settings an episode could change from outside it (oom score,
            rlimits, nice, affinity, ...), read from the host at launch; any change later means no reuse.
        uid_lease: The private host uid the sandbox runs as (bwrap), released once it is stopped.
    """

    process: subprocess.Popen[bytes]
    cgroup: Cgroup | None = None
    container: str | None = None
    parent_pid: int | None = None
    observed: Cgroup | None = None
    known_pids: frozenset[int] = field(default_factory=frozenset)
    baseline_memory: int | None = None
    baseline_tasks: int | None = None
    verifiable: bool = False
    reusable: bool = True
    baseline_parent: dict[str, str] | None = None
    uid_lease: UidLease | None = None


def minimal_env(*keep: str) -> dict[str, str]:
    """The environment a sandbox launcher (bwrap, the docker CLI) gets: PATH plus ``keep`` if set, no secrets."""
    env = {"PATH": HOST_PATH}
    env.update({k: os.environ[k] for k in keep if k in os.environ})
    return env


def python_roots() -> list[str]:
    """Directories holding the Python installation and its packages (a venv's symlinks need the base too)."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                  str(Path(sys.executable).resolve().parent.parent)}
    roots: list[str] = []
    for path in sorted(candidates, key=len):
        if path.startswith("/usr/") or path == "/usr":
            continue  # /usr is mounted whole anyway
        if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots) and os.path.isdir(path):
            roots.append(path)
    return roots


def _zygote_argv(preload: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-I", ZYGOTE_PATH, f"{IPC_DIR}/host.sock", WORK_DIR, ",".join(preload)]


class Backend:
    """Interface: ``unavailable()`` says why it cannot run here (``None`` when it can); ``launch`` starts one."""

    name = "?"
    #: The sandbox's writable dirs: emptied by the host after every episode.
    writable_dirs: tuple[str, ...] = (WORK_DIR, "/tmp", "/dev/shm")

    def unavailable(self, config: SandboxConfig) -> str | None:
        raise NotImplementedError

    def launch(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> Launch:
        raise NotImplementedError

    def attach(self, launch: Launch) -> None:
        """Record the sandbox's own host pids and baselines (called once the parent said hello)."""
        raise NotImplementedError

    def members(self, launch: Launch) -> set[int]:
        """Host pids of every live process in the sandbox, as the host sees them."""
        if launch.observed is not None:
            return launch.observed.pids()
        return descendants(launch.process.pid)

    def reap_stale(self) -> None:
        """Delete what sandboxes of host processes that died (SIGKILL, OOM) left behind."""
        reap_stale_ipc_dirs()

    def _record_baseline(self, launch: Launch) -> None:
        launch.known_pids = frozenset(self.members(launch))
        if launch.observed is not None:
            launch.baseline_memory = launch.observed.memory_usage()
            launch.baseline_tasks = launch.observed.pids_current()
        if launch.parent_pid is not None:
            launch.baseline_parent = parent_state(launch.parent_pid)

    def stop(self, launch: Launch) -> None:
        """Kill the sandbox and everything in it."""
        if launch.process.poll() is None:
            try:
                os.killpg(launch.process.pid, 9)
            except (ProcessLookupError, PermissionError):
                launch.process.kill()
        try:
            launch.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if launch.cgroup is not None:
            launch.cgroup.remove()
        if launch.uid_lease is not None:
            # Last: the uid is free for another sandbox only once nothing of this one runs as it.
            launch.uid_lease.release()


# bwrap started by root maps the sandbox user to host uid 0. Without capabilities that is still the owner
# of root's 0644/0400 proc files: host sysctls (kernel.core_pattern runs a program as host root) would be
# writable and physical page maps readable. So /proc/sys and /proc/fs are read-only and the rest masked.
_PROC_GUARDS = ["--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/fs", "/proc/fs",
                *(arg for name in ("sysrq-trigger", "kpagecount", "kpageflags", "kpagecgroup", "slabinfo",
                                   "vmallocinfo", "pagetypeinfo", "mtrr", "kcore", "kmsg")
                  if os.path.exists(f"/proc/{name}")  # a mount point cannot be created in procfs
                  for arg in ("--ro-bind", "/dev/null", f"/proc/{name}"))]
# Kernel keys the sandbox possesses through the launcher's session keyring would be listed here.
_PROC_GUARDS += [arg for name in ("keys", "key-users") if os.path.exists(f"/proc/{name}")
                 for arg in ("--ro-bind", "/dev/null", f"/proc/{name}")]


class BwrapBackend(Backend):
    """bubblewrap: all namespaces unshared, caps dropped, uid 65534, read-only Python, tmpfs work dir."""

    name = "bwrap"

    def unavailable(self, config: SandboxConfig) -> str | None:
        try:
            build_filter()
        except OSError as exc:  # never a bwrap sandbox without its seccomp filter
            return f"{exc}; use backend='docker'"
        return _bwrap_unavailable(config.allow_no_cgroups)

    def command(self, ipc_dir: str, config: SandboxConfig, *, seccomp_fd: int | None = None,
                staged: dict[str, str] | None = None) -> list[str]:
        """bwrap's argv. ``seccomp_fd``: a descriptor holding :func:`seccomp.build_filter`'s program.
        ``staged``: host paths that bwrap, running as a private uid, cannot reach (under ``/root``, 0700),
        mapped to where the launcher bind-mounted them in its own mount namespace (see :func:`_stage`)."""
        size = str(config.limits.workdir_bytes)
        sources = staged or {}

        def ro_bind(host_path: str, target: str) -> list[str]:
            return ["--ro-bind", sources.get(host_path, host_path), target]

        # --as-pid-1: the warm parent is the namespace's init, so signals from inside cannot stop or kill it.
        # /dev is bwrap's tmpfs owned by the sandbox user: remounted read-only after a capped /dev/shm.
        cmd = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
               "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL",
               "--uid", "65534", "--gid", "65534",
               "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
               "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
               "--proc", "/proc", *_PROC_GUARDS, "--dev", "/dev",
               "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
               "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
               "--perms", "0777", "--size", size, "--tmpfs", WORK_DIR]
        for root in python_roots():
            cmd += ro_bind(root, root)
        for host_path, target in config.mounts:
            cmd += ro_bind(host_path, target)
        for path in config.hidden_paths:
            if os.path.isdir(path):
                cmd += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
            elif os.path.exists(path):
                cmd += ["--ro-bind", "/dev/null", path]
        cmd += [*ro_bind(str(ZYGOTE_SOURCE), ZYGOTE_PATH), *ro_bind(ipc_dir, IPC_DIR),
                "--remount-ro", "/", "--chdir", WORK_DIR, "--clearenv"]
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
        for key, value in THREAD_ENV.items():
            cmd += ["--setenv", key, value]
        return cmd + _zygote_argv(config.preload)

    def launch(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> Launch:
        lease = self._private_uid(config)
        cgroup = None
        fds: list[int] = []
        try:
            try:
                cgroup = create_cgroup(worker_id, memory_bytes=config.limits.memory_bytes, pids=config.limits.pids)
            except OSError:
                if not config.allow_no_cgroups:
                    raise
            seccomp_fd = _memfd("agentgym-seccomp", build_filter())
            fds.append(seccomp_fd)
            staged: dict[str, str] = {}
            if lease is not None:
                paths = [*python_roots(), *(h for h, _ in config.mounts), str(ZYGOTE_SOURCE), ipc_dir]
                staged = _stage_targets([p for p in dict.fromkeys(paths) if not _reachable_by_anyone(p)])
            argv = [*_setpriv(lease.uid), *self.command(ipc_dir, config, seccomp_fd=seccomp_fd, staged=staged)] \
                if lease is not None else self.command(ipc_dir, config, seccomp_fd=seccomp_fd)
            if staged:
                argv = _stage(staged, argv)
            if cgroup is not None:
                # The shell joins the group before exec'ing bwrap, so no sandbox process ever runs outside it.
                joins = "".join(f'echo $$ > "{f}" && ' for f in cgroup.procs_files)
                argv = ["/bin/sh", "-c", joins + 'exec "$@"', "sh", *argv]
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, start_new_session=True, env=minimal_env(),
                                       pass_fds=tuple(fds))
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            if lease is not None:
                lease.release()
            raise
        finally:
            for fd in fds:  # bwrap has its own copies (and closes them before the sandbox runs)
                os.close(fd)
        return Launch(process, cgroup=cgroup, observed=cgroup, uid_lease=lease)

    @staticmethod
    def _private_uid(config: SandboxConfig) -> UidLease | None:
        """A private host uid for this sandbox, or ``None`` (with the reason logged once) when not possible."""
        reason = (private_uid_unavailable() if config.bwrap_private_uid
                  else "turned off by SandboxConfig.bwrap_private_uid=False")
        if reason is None:
            try:
                return lease_uid()
            except OSError as exc:
                reason = str(exc)
        _log_shared_uid(reason)
        return None

    def attach(self, launch: Launch) -> None:
        """The parent is bwrap's only child; the sandbox is then exactly {bwrap, parent} (or its cgroup's)."""
        monitor = launch.process.pid
        children = procfs.children(monitor)
        if len(children) != 1 or _ns_pid(children[0]) != 1:
            raise OSError(f"expected bwrap ({monitor}) to have one child, the sandbox's PID 1; found {children}")
        launch.parent_pid = children[0]
        self._record_baseline(launch)
        if launch.known_pids != {monitor, launch.parent_pid}:
            raise OSError(f"unexpected processes in a fresh sandbox: {sorted(launch.known_pids)}")
        # A host that is not root cannot enter the (undumpable) parent's root to clean: never reuse then.
        launch.verifiable = os.access(f"/proc/{launch.parent_pid}/root{WORK_DIR}", os.W_OK)

    def reap_stale(self) -> None:
        super().reap_stale()
        reap_stale_cgroups(is_stale)


def _ns_pid(pid: int) -> int | None:
    """A process's pid inside its innermost pid namespace (1 for a namespace's init)."""
    nspid = (procfs.status(pid) or {}).get("NSpid")
    return None if nspid is None else int(nspid.split()[-1])


def _memfd(name: str, data: bytes) -> int:
    """An anonymous file holding ``data``, positioned at its start (how bwrap reads ``--seccomp FD``)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


STAGE_DIR = "/run/agentgym-sandbox-stage"


def _reachable_by_anyone(path: str) -> bool:
    """Whether a process with no relation to the owners can reach ``path`` (every ancestor searchable by
    others, the path itself readable, and searchable if a directory)."""
    real = os.path.realpath(path)
    try:
        info = os.stat(real)
    except OSError:
        return True  # missing: let bwrap report it as it would anyway
    need = 0o005 if stat.S_ISDIR(info.st_mode) else 0o004
    if info.st_mode & need != need:
        return False
    parent = os.path.dirname(real)
    while True:
        if not os.stat(parent).st_mode & 0o001:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def _stage_targets(paths: list[str]) -> dict[str, str]:
    """Mount points under :data:`STAGE_DIR` (root's, 0755, empty on the host) for ``paths``: one per path."""
    if not paths:
        return {}
    os.makedirs(STAGE_DIR, mode=0o755, exist_ok=True)
    info = os.lstat(STAGE_DIR)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise OSError(f"{STAGE_DIR} must be a directory owned by root and writable only by it")
    targets = {}
    for index, path in enumerate(paths):
        is_dir = os.path.isdir(path)
        target = os.path.join(STAGE_DIR, f"{'d' if is_dir else 'f'}{index}")
        if is_dir:
            os.makedirs(target, mode=0o755, exist_ok=True)
        elif not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        targets[path] = target
    return targets


def _stage(staged: dict[str, str], argv: list[str]) -> list[str]:
    """Run ``argv`` in a private mount namespace of the launcher where each staged path is bind-mounted on
    its stage target: bwrap, already a private uid, then binds from there. Host mounts never change."""
    script = 'set -e; while [ "$1" != "--" ]; do mount --bind "$1" "$2"; shift 2; done; shift; exec "$@"'
    pairs = [arg for source, target in staged.items() for arg in (os.path.realpath(source), target)]
    return [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script,
            "sh", *pairs, "--", *argv]


def _setpriv(uid: int) -> list[str]:
    """Become ``uid:uid`` with no supplementary groups and no capabilities before exec'ing bwrap."""
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--"]


@functools.lru_cache(maxsize=8)
def _log_shared_uid(reason: str) -> None:
    log.warning("bwrap sandboxes run as this process's uid %d, sharing its per-user kernel quotas (inotify, "
                "keys, processes): a private uid is not possible here: %s", os.geteuid(), reason)


@functools.lru_cache(maxsize=1)
def private_uid_unavailable() -> str | None:
    """Why bwrap cannot run as a private unprivileged uid here (``None`` when it can): probed once."""
    if os.geteuid() != 0:
        return "the host process is not root, so it cannot switch to another uid"
    if shutil.which("setpriv") is None:
        return "setpriv is not installed (util-linux)"
    try:
        lease = lease_uid()
    except OSError as exc:
        return str(exc)
    try:
        probe = subprocess.run([*_setpriv(lease.uid), shutil.which("bwrap") or "bwrap", "--unshare-all",
                                "--unshare-user", "--uid", "65534", "--gid", "65534", "--die-with-parent",
                                "--as-pid-1", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr",
                                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                                "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "true"],
                               capture_output=True, text=True, timeout=30, env=minimal_env(), check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"probe failed: {exc}"
    finally:
        lease.release()
    if probe.returncode != 0:
        return (f"unprivileged user namespaces are not allowed ({probe.stderr.strip()[:200]}); allow them "
                "(sysctl user.max_user_namespaces>0, kernel.apparmor_restrict_unprivileged_userns=0)")
    return None


@functools.lru_cache(maxsize=4)
def _bwrap_unavailable(allow_no_cgroups: bool) -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = subprocess.run([shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--die-with-parent",
                            "--as-pid-1", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr",
                            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc",
                            "--dev", "/dev", "true"],
                           capture_output=True, text=True, timeout=30, env=minimal_env(), check=False)
    if probe.returncode != 0:
        return (f"bwrap cannot create namespaces here ({probe.stderr.strip()}); enable unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root")
    if not allow_no_cgroups:
        reason = cgroup_support(f"{worker_prefix()}-probe")
        if reason is not None:
            return (f"no writable pids+memory cgroup for bwrap sandboxes ({reason}); run as root on a host with "
                    "cgroups, use backend='docker', or pass allow_no_cgroups=True to accept rlimits only")
    return None


class DockerBackend(Backend):
    """A container per sandbox: ``--network none`` (unless ``SandboxConfig.docker_network`` names one),
    memory/pids/CPU limits, read-only root, uid 65534."""

    name = "docker"

    def unavailable(self, config: SandboxConfig) -> str | None:
        if shutil.which("docker") is None:
            return "the docker CLI is not installed (apt-get install docker.io)"
        probe = _docker("version", "--format", "{{.Server.Version}}", timeout=60)
        if probe.returncode != 0:
            return f"no Docker daemon answers ({probe.stderr.strip()[:200]}); start dockerd or set DOCKER_HOST"
        return None

    def command(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> list[str]:
        lim = config.limits
        tmpfs_size = f"size={lim.workdir_bytes}"
        cmd = [shutil.which("docker") or "docker", "run", "--rm", "-i", "--name", worker_id, "--network", config.docker_network,
               "--memory", str(lim.memory_bytes), "--memory-swap", str(lim.memory_bytes),
               "--pids-limit", str(lim.pids), "--cpus", str(lim.cpus), "--user", config.docker_user,
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               *(() if config.docker_writable_root else ("--read-only",)), "--ipc", "none", "--tmpfs", f"/tmp:{tmpfs_size},mode=1777", "--tmpfs", f"{WORK_DIR}:{tmpfs_size},mode=0777",
               "--tmpfs", f"/dev/shm:{tmpfs_size},mode=1777",
               "--workdir", WORK_DIR, "-v", "/usr:/usr:ro", "-v", f"{ZYGOTE_SOURCE}:{ZYGOTE_PATH}:ro",
               "-v", f"{ipc_dir}:{IPC_DIR}:ro"]
        for root in python_roots():
            cmd += ["-v", f"{root}:{root}:ro"]
        for host_path, target in config.mounts:
            cmd += ["-v", f"{host_path}:{target}:ro"]
        for path in config.hidden_paths:
            if os.path.isdir(path):
                cmd += ["--tmpfs", f"{path}:ro,size=4k"]
            elif os.path.exists(path):
                cmd += ["-v", f"/dev/null:{path}:ro"]
        for key, value in THREAD_ENV.items():
            cmd += ["-e", f"{key}={value}"]
        return cmd + [config.docker_image] + _zygote_argv(config.preload)

    def launch(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> Launch:
        ensure_docker_image(config.docker_image)
        process = subprocess.Popen(self.command(worker_id, ipc_dir, config), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                   env=minimal_env(*DOCKER_ENV))
        return Launch(process, container=worker_id, reusable=not config.docker_writable_root)

    def attach(self, launch: Launch) -> None:
        """The container's init is the parent; from the host (as root) its cgroup holds exactly that pid.

        A host that cannot see into the container (not root, a remote daemon) cannot verify cleanup, so the
        sandbox is marked unverifiable and the pool then starts a fresh container for every episode.
        """
        assert launch.container is not None
        if not launch.reusable:
            return
        inspect = _docker("inspect", "--format", "{{.State.Pid}}", launch.container, timeout=60)
        pid = int(inspect.stdout.strip() or 0) if inspect.returncode == 0 else 0
        launch.parent_pid = pid or None
        observed = cgroup_of(pid) if pid else None
        if observed is None or pid not in observed.pids() or not os.access(f"/proc/{pid}/root{WORK_DIR}", os.W_OK):
            return
        launch.observed = observed
        self._record_baseline(launch)
        if launch.known_pids != {pid}:
            raise OSError(f"unexpected processes in a fresh container: {sorted(launch.known_pids)}")
        launch.verifiable = True

    def stop(self, launch: Launch) -> None:
        if launch.container is not None:
            _docker("rm", "-f", launch.container, timeout=60)
        super().stop(launch)

    def reap_stale(self) -> None:
        super().reap_stale()
        listing = _docker("ps", "-a", "--filter", f"name=^{PREFIX}", "--format", "{{.Names}}", timeout=60)
        for name in listing.stdout.split() if listing.returncode == 0 else []:
            if is_stale(name):
                _docker("rm", "-f", name, timeout=60)


DOCKER_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")


def _docker(*args: str, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess[Any]:
    """Run the docker CLI with a minimal environment (only how to reach the daemon)."""
    return subprocess.run([shutil.which("docker") or "docker", *args], capture_output=True, text=stdin is None,
                          input=stdin, timeout=timeout, env=minimal_env(*DOCKER_ENV), check=False)


def ensure_docker_image(image: str) -> None:
    """Build the sandbox base image locally if missing: an empty root with /usr symlinks (no pull needed).

    The host's /usr and Python installation are mounted read-only at run time, exactly as with bwrap, so
    the image itself holds only the directory skeleton. Equivalent shell command::

        mkdir -p root/{tmp,work,opt,ipc,etc} && chmod 1777 root/tmp root/work && ln -s usr/bin root/bin && ln -s usr/lib root/lib \\
          && ln -s usr/lib64 root/lib64 && tar -C root -c . | docker import - agentgym-sandbox:2
    """
    if _docker("image", "inspect", image, timeout=60).returncode == 0:
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("tmp", "work", "opt", "opt/agentgym", "ipc", "etc", "usr"):
            info = tarfile.TarInfo(directory)
            # Docker copies a directory's mode onto a tmpfs mounted over it: /tmp and /work must be writable.
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory in ("tmp", "work") else 0o755
            tar.addfile(info)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/work:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    result = _docker("import", "-", image, stdin=buffer.getvalue(), timeout=120)
    if result.returncode != 0:
        raise SandboxUnavailable(f"could not build the Docker sandbox image {image}: "
                                 f"{result.stderr.decode(errors='replace').strip()}")


def resolve_backend(config: SandboxConfig) -> Backend:
    """The backend to use; raises :class:`SandboxUnavailable` with what to install when none works."""
    order: list[Backend] = {"bwrap": [BwrapBackend()], "docker": [DockerBackend()],
                            "auto": [BwrapBackend(), DockerBackend()]}[config.backend]
    reasons = []
    for backend in order:
        reason = backend.unavailable(config)
        if reason is None:
            return backend
        reasons.append(f"{backend.name}: {reason}")
    raise SandboxUnavailable("No sandbox isolation is available, so model-written code will not run. "
                             + "; ".join(reasons) + ". Install bubblewrap (apt-get install bubblewrap) or start a "
                             "Docker daemon.")
