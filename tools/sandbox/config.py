"""Sandbox limits and configuration, validated up front so a bad value fails with the fix, not later."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["BACKENDS", "SandboxConfig", "SandboxLimits"]

BACKENDS = ("auto", "bwrap", "docker")
MiB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """What one episode's code may use. Per-call limits end the call; the rest bound the whole sandbox.

    Attributes:
        wall_timeout_s: Per call; on expiry the episode's interpreter is killed and restarted.
        cpu_timeout_s: Per call CPU seconds; the call gets a ``TimeoutError`` and state survives.
        episode_cpu_s: CPU seconds for the whole episode (hard ``RLIMIT_CPU``).
        memory_bytes: The sandbox's memory cgroup (or Docker ``--memory``); excess is OOM-killed.
        address_space_bytes: ``RLIMIT_AS`` per process: a huge allocation fails with ``MemoryError``.
        file_size_bytes: ``RLIMIT_FSIZE``: the largest file the code may write.
        workdir_bytes: Size of each private writable dir (tmpfs): the work dir, ``/tmp`` and ``/dev/shm``. All
            three are emptied by the host after every episode.
        open_files: ``RLIMIT_NOFILE``.
        pids: Most processes and threads in one sandbox (pids cgroup / Docker ``--pids-limit``).
        cpus: CPU share for the Docker backend (``--cpus``).
        max_output_chars: stdout and stderr are each cut to this, head and tail kept, with a marker.
    """

    wall_timeout_s: float = 10.0
    cpu_timeout_s: float = 10.0
    episode_cpu_s: int = 600
    memory_bytes: int = 1024 * MiB
    address_space_bytes: int = 4096 * MiB
    file_size_bytes: int = 16 * MiB
    workdir_bytes: int = 64 * MiB
    open_files: int = 256
    pids: int = 64
    cpus: float = 1.0
    max_output_chars: int = 8192

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"SandboxLimits.{f.name} must be a positive number, got {value!r}.")
        if self.address_space_bytes < 512 * MiB:
            raise ConfigError("SandboxLimits.address_space_bytes must be at least 512 MiB: the warm interpreter "
                              "with numpy and sympy already maps about 200 MiB.")
        if self.pids < 4:
            raise ConfigError("SandboxLimits.pids must be at least 4 (the sandbox itself uses 3 processes).")

    def for_child(self) -> dict[str, Any]:
        """The rlimits the in-sandbox parent applies to each episode's child."""
        return {"address_space_bytes": self.address_space_bytes, "file_size_bytes": self.file_size_bytes,
                "open_files": self.open_files, "episode_cpu_s": self.episode_cpu_s}


@dataclass(frozen=True)
class SandboxConfig:
    """How sandboxes are started.

    Attributes:
        backend: ``"bwrap"`` (bubblewrap, default where installed), ``"docker"``, or ``"auto"`` (bwrap if it
            works here, else Docker; never unsandboxed).
        limits: Resource limits, see :class:`SandboxLimits`.
        preload: Modules the warm parent imports once so every episode gets them for free.
        max_workers: Most sandboxes alive at once (one per concurrent episode).
        start_timeout_s: How long a new sandbox may take to come up.
        docker_image: Image for the Docker backend (built locally by :func:`ensure_docker_image`).
        allow_no_cgroups: Run bwrap with rlimits only when no pids/memory cgroup can be created. Off by
            default because a fork bomb is then bounded only by the host.
        mounts: Extra read-only mounts ``(host_path, sandbox_path)``, e.g. a pristine repository that each
            episode copies into its work dir (the SWE env). Sandbox paths must be absolute and may not
            shadow the sandbox's own directories.
        hidden_paths: Host paths inside the mounted Python installation that the sandbox must see as empty (a
            directory) or as an empty file. Why: the host's site-packages are mounted read-only, so a package
            installed there (tabulate comes with reasoning-gym) would hand an SWE agent the unmutated upstream
            source of the library it is asked to fix.
        docker_user: ``uid:gid`` the Docker backend runs the sandbox as. Task images whose files belong to root
            (Harbor-format tasks) need ``"0:0"``; capabilities stay dropped either way.
        docker_writable_root: Let the Docker sandbox write anywhere in its image's filesystem (not only the work
            dir, ``/tmp`` and ``/dev/shm``), as a task environment built from a Dockerfile expects. The host cannot
            empty such a root, so these containers are never reused: every session gets a fresh one.
        docker_network: The Docker network of the Docker backend's containers: ``"none"`` (the default: no network
            at all) or the name of a network on the daemon (``"bridge"`` is Docker's default, with the host's
            internet through NAT). Only for tasks that ask for a network (Harbor's ``allow_internet``); the bwrap
            backend always runs without one.
        bwrap_private_uid: Run each bwrap sandbox as its own otherwise unused host uid (bwrap then builds an
            unprivileged user namespace), so per-user kernel quotas and file ownership are never host root's.
            Needs a root host that allows unprivileged user namespaces; elsewhere the sandbox runs as the
            launcher's uid and the reason is logged. Turn off only when mounts must be read with the
            launcher's own permissions (files only it may read); the sandbox then shares its quotas.
    """

    backend: str = "auto"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    preload: tuple[str, ...] = ("numpy", "sympy")
    max_workers: int = 64
    start_timeout_s: float = 30.0
    docker_image: str = "agentgym-sandbox:2"
    allow_no_cgroups: bool = False
    mounts: tuple[tuple[str, str], ...] = ()
    hidden_paths: tuple[str, ...] = ()
    docker_user: str = "65534:65534"
    docker_writable_root: bool = False
    bwrap_private_uid: bool = True
    docker_network: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.docker_network, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}",
                                                                        self.docker_network):
            raise ConfigError(f"SandboxConfig.docker_network must be 'none' or a Docker network name such as "
                              f"'bridge', got {self.docker_network!r}.")
        if self.docker_network != "none" and self.backend != "docker":
            raise ConfigError(f"SandboxConfig.docker_network={self.docker_network!r} needs backend='docker': bwrap "
                              "sandboxes never have a network.")
        if not isinstance(self.bwrap_private_uid, bool):
            raise ConfigError(f"SandboxConfig.bwrap_private_uid must be True or False, got {self.bwrap_private_uid!r}.")
        if not isinstance(self.docker_user, str) or not re.fullmatch(r"\d+:\d+", self.docker_user):
            raise ConfigError(f"SandboxConfig.docker_user must be 'uid:gid' in digits (e.g. '65534:65534'), "
                              f"got {self.docker_user!r}.")
        if self.backend not in BACKENDS:
            raise ConfigError(f"Unknown sandbox backend {self.backend!r}; choose one of {', '.join(BACKENDS)}.")
        if not isinstance(self.limits, SandboxLimits):
            raise ConfigError("SandboxConfig.limits must be a SandboxLimits instance.")
        if isinstance(self.preload, str) or not all(
                isinstance(m, str) and all(part.isidentifier() for part in m.split(".")) for m in self.preload):
            raise ConfigError(f"SandboxConfig.preload must be a tuple of module names, got {self.preload!r}.")
        if not isinstance(self.max_workers, int) or self.max_workers < 1:
            raise ConfigError(f"SandboxConfig.max_workers must be a positive integer, got {self.max_workers!r}.")
        if self.start_timeout_s <= 0:
            raise ConfigError("SandboxConfig.start_timeout_s must be positive.")
        reserved = ("/work", "/tmp", "/ipc", "/proc", "/dev", "/usr")
        for mount in self.mounts:
            if (not isinstance(mount, tuple) or len(mount) != 2 or not all(isinstance(p, str) for p in mount)
                    or not mount[1].startswith("/") or mount[1].rstrip("/") in ("", *reserved)
                    or any(mount[1].startswith(r + "/") for r in reserved if r != "/opt")):
                raise ConfigError(f"SandboxConfig.mounts entries must be (host_path, absolute sandbox path) "
                                  f"outside {', '.join(reserved)}; got {mount!r}. Use e.g. /opt/data.")
        if isinstance(self.hidden_paths, str) or not all(
                isinstance(p, str) and p.startswith("/") and p.rstrip("/") not in ("", *reserved)
                for p in self.hidden_paths):
            raise ConfigError(f"SandboxConfig.hidden_paths must be a tuple of absolute host paths (not a sandbox "
                              f"directory such as {', '.join(reserved)}); got {self.hidden_paths!r}.")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SandboxConfig:
        """Build from flat keyword arguments (env kwargs, YAML): limit names go to :class:`SandboxLimits`."""
        limit_names = {f.name for f in fields(SandboxLimits)}
        own_names = {f.name for f in fields(cls)} - {"limits"}
        unknown = set(kwargs) - limit_names - own_names
        if unknown:
            raise ConfigError(f"Unknown sandbox option(s) {sorted(unknown)}; valid: "
                              f"{', '.join(sorted(limit_names | own_names))}.")
        limits = SandboxLimits(**{k: v for k, v in kwargs.items() if k in limit_names})
        if "preload" in kwargs:
            kwargs["preload"] = tuple(kwargs["preload"])
        return cls(limits=limits, **{k: v for k, v in kwargs.items() if k in own_names})
