"""How a sandbox process is launched: bubblewrap or a Docker container, behind one small interface.

Both backends run the same in-sandbox parent (``_zygote.py``) with the host's Python installation mounted
read-only, a private writable work dir, no network, dropped capabilities and uid 65534. They differ only in
who enforces memory/pids limits (our cgroup vs. Docker) and how the process is stopped.
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

from agentgym.tools.sandbox.cgroups import Cgroup, cgroup_support, create_cgroup
from agentgym.tools.sandbox.config import SandboxConfig

__all__ = ["Backend", "BwrapBackend", "DockerBackend", "Launch", "SandboxUnavailable", "ensure_docker_image",
           "resolve_backend"]

ZYGOTE_SOURCE = Path(__file__).with_name("_zygote.py")
ZYGOTE_PATH = "/opt/agentgym/zygote.py"
IPC_DIR = "/ipc"
WORK_DIR = "/work"
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMEXPR_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
              "HOME": WORK_DIR, "MPLBACKEND": "Agg",
              # `python` in a shell inside the sandbox is the interpreter the sandbox runs.
              "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"}


class SandboxUnavailable(RuntimeError):
    """No isolation mechanism works here; the message says what to install. Code is never run unsandboxed."""


@dataclass
class Launch:
    """A started sandbox process and how to tear it down."""

    process: subprocess.Popen[bytes]
    cgroup: Cgroup | None = None
    container: str | None = None


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

    def unavailable(self, config: SandboxConfig) -> str | None:
        raise NotImplementedError

    def launch(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> Launch:
        raise NotImplementedError

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


class BwrapBackend(Backend):
    """bubblewrap: all namespaces unshared, caps dropped, uid 65534, read-only Python, tmpfs work dir."""

    name = "bwrap"

    def unavailable(self, config: SandboxConfig) -> str | None:
        return _bwrap_unavailable(config.allow_no_cgroups)

    def command(self, ipc_dir: str, config: SandboxConfig) -> list[str]:
        size = str(config.limits.workdir_bytes)
        cmd = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
               "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534",
               "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
               "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
               "--proc", "/proc", "--dev", "/dev",
               "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
               "--perms", "0777", "--size", size, "--tmpfs", WORK_DIR]
        for root in python_roots():
            cmd += ["--ro-bind", root, root]
        for host_path, target in config.mounts:
            cmd += ["--ro-bind", host_path, target]
        cmd += ["--ro-bind", str(ZYGOTE_SOURCE), ZYGOTE_PATH, "--ro-bind", ipc_dir, IPC_DIR,
                "--remount-ro", "/", "--chdir", WORK_DIR, "--clearenv"]
        for key, value in THREAD_ENV.items():
            cmd += ["--setenv", key, value]
        return cmd + _zygote_argv(config.preload)

    def launch(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> Launch:
        cgroup = None
        argv = self.command(ipc_dir, config)
        try:
            cgroup = create_cgroup(worker_id, memory_bytes=config.limits.memory_bytes, pids=config.limits.pids)
        except OSError:
            if not config.allow_no_cgroups:
                raise
        if cgroup is not None:
            # The shell joins the group before exec'ing bwrap, so no sandbox process ever runs outside it.
            joins = "".join(f'echo $$ > "{f}" && ' for f in cgroup.procs_files)
            argv = ["/bin/sh", "-c", joins + 'exec "$@"', "sh", *argv]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True)
        return Launch(process, cgroup=cgroup)


@functools.lru_cache(maxsize=4)
def _bwrap_unavailable(allow_no_cgroups: bool) -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--cap-drop", "ALL",
                            "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64",
                            "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return (f"bwrap cannot create namespaces here ({probe.stderr.strip()}); enable unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root")
    if not allow_no_cgroups:
        reason = cgroup_support()
        if reason is not None:
            return (f"no writable pids+memory cgroup for bwrap sandboxes ({reason}); run as root on a host with "
                    "cgroups, use backend='docker', or pass allow_no_cgroups=True to accept rlimits only")
    return None


class DockerBackend(Backend):
    """A container per sandbox: ``--network none``, memory/pids/CPU limits, read-only root, uid 65534."""

    name = "docker"

    def unavailable(self, config: SandboxConfig) -> str | None:
        if shutil.which("docker") is None:
            return "the docker CLI is not installed (apt-get install docker.io)"
        probe = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                               text=True, timeout=60)
        if probe.returncode != 0:
            return f"no Docker daemon answers ({probe.stderr.strip()[:200]}); start dockerd or set DOCKER_HOST"
        return None

    def command(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> list[str]:
        lim = config.limits
        tmpfs_size = f"size={lim.workdir_bytes}"
        cmd = ["docker", "run", "--rm", "-i", "--name", worker_id, "--network", "none",
               "--memory", str(lim.memory_bytes), "--memory-swap", str(lim.memory_bytes),
               "--pids-limit", str(lim.pids), "--cpus", str(lim.cpus), "--user", "65534:65534",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
               "--ipc", "none", "--tmpfs", f"/tmp:{tmpfs_size},mode=1777", "--tmpfs", f"{WORK_DIR}:{tmpfs_size},mode=0777",
               "--workdir", WORK_DIR, "-v", "/usr:/usr:ro", "-v", f"{ZYGOTE_SOURCE}:{ZYGOTE_PATH}:ro",
               "-v", f"{ipc_dir}:{IPC_DIR}:ro"]
        for root in python_roots():
            cmd += ["-v", f"{root}:{root}:ro"]
        for host_path, target in config.mounts:
            cmd += ["-v", f"{host_path}:{target}:ro"]
        for key, value in THREAD_ENV.items():
            cmd += ["-e", f"{key}={value}"]
        return cmd + [config.docker_image] + _zygote_argv(config.preload)

    def launch(self, worker_id: str, ipc_dir: str, config: SandboxConfig) -> Launch:
        ensure_docker_image(config.docker_image)
        process = subprocess.Popen(self.command(worker_id, ipc_dir, config), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        return Launch(process, container=worker_id)

    def stop(self, launch: Launch) -> None:
        if launch.container is not None:
            subprocess.run(["docker", "rm", "-f", launch.container], capture_output=True, timeout=60)
        super().stop(launch)


def ensure_docker_image(image: str) -> None:
    """Build the sandbox base image locally if missing: an empty root with /usr symlinks (no pull needed).

    The host's /usr and Python installation are mounted read-only at run time, exactly as with bwrap, so
    the image itself holds only the directory skeleton. Equivalent shell command::

        mkdir -p root/{tmp,work,opt,ipc,etc} && chmod 1777 root/tmp root/work && ln -s usr/bin root/bin && ln -s usr/lib root/lib \\
          && ln -s usr/lib64 root/lib64 && tar -C root -c . | docker import - agentgym-sandbox:2
    """
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
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
    result = subprocess.run(["docker", "import", "-", image], input=buffer.getvalue(), capture_output=True,
                            timeout=120)
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
