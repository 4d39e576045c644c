"""Build the env-server images locally, with no registry pulls: ``python docker/build.py games``.

Images cannot be pulled on these machines, so the base image is imported from a root filesystem assembled from
this machine (``docker import``): the running Python (relocated to ``/opt/python``, standard library without its
test suite), exactly the Python distributions the family needs (agentgym's core dependencies, the ``serve-env``
extra and the family's extra, resolved from the installed metadata), the host programs the family runs (bwrap,
git, stockfish, chromium) and the shared libraries all of these link against (``ldd``). Then
``docker/Dockerfile`` adds agentgym's source on top and runs ``agentgym serve-env``, so a cluster scheduler
can start as many env servers as it needs from one image. One ``docker/Dockerfile`` serves every family: the build
passes the family's Python image and its default env id as build arguments.

Usage::

    python docker/build.py games                # agentgym-python-games:local, then agentgym-env-games:local
    docker run --rm --network host agentgym-env-games:local agentgym/Maze-v0 --port 8000
    docker run --rm --network host agentgym-env-games:local --port 8000   # the family's default env

The sandboxed families (code_interpreter, swe) run model-written code in bwrap inside the container and need the
options in ``RUN_OPTIONS`` (namespaces and a writable cgroup hierarchy, no ``--privileged``)::

    docker run --rm --network host --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --security-opt systempaths=unconfined --cgroupns host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
        agentgym-env-code_interpreter:local --port 8000

The SWE image carries every pinned library's source tree and test-only dependencies (fetched here with pip once),
so no reset reaches PyPI. tests/serving/test_env_server_docker.py builds and plays the games image in the default suite and
every other family's image in the slow suite (a reference-solver episode through the container, compared with the
same episode in process).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PREFIX = "/opt/python"
#: family -> (pyproject extras beyond serve-env, host programs it runs, host folders it needs whole)
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "games": ((), (), ()),
    "babyai": (("babyai",), (), ()),
    # sandboxed families: bwrap, plus the shell that puts each sandbox in its cgroup and the `true` its probe runs
    "code_interpreter": (("code",), ("bwrap", "sh", "true"), ()),
    "search": (("search",), (), ()),
    "swe": (("swe",), ("bwrap", "sh", "true", "git"), ("/usr/lib/git-core", "/usr/share/git-core")),
    "multi_agent": (("multiagent",), ("stockfish",), ()),
    # the browser families: Chromium's own folder (the binary itself, not Debian's shell wrapper) and its fonts
    "web": (("web",), (), ("/usr/lib/chromium", "/etc/fonts", "/usr/share/fonts")),
    "gui": (("web",), (), ("/usr/lib/chromium", "/etc/fonts", "/usr/share/fonts")),
}
#: family -> the env its image serves when ``docker run`` names none
DEFAULT_ENVS: dict[str, str] = {
    "games": "agentgym/Calculator-v0",
    "babyai": "agentgym/BabyAI-v0",
    "code_interpreter": "agentgym/CodeInterpreter-v1",
    "search": "agentgym/Search-v1",
    "swe": "agentgym/SWE-v1",
    "multi_agent": "agentgym/TicTacToe-SelfPlay-v0",
    "web": "agentgym/WebShop-v1",
    "gui": "agentgym/MiniWoB-v0",
}
#: family -> environment variables of its image (the browser families launch the Chromium binary directly)
IMAGE_ENV: dict[str, dict[str, str]] = {family: {"AGENTGYM_CHROMIUM": "/usr/lib/chromium/chromium"}
                                        for family in ("web", "gui")}
#: ``docker run`` options the sandboxed families need. Their envs run model-written code in bwrap inside the
#: container, which needs namespaces (Docker's default seccomp and AppArmor profiles refuse them, and a fresh /proc
#: cannot be mounted over Docker's masked paths) and a writable cgroup hierarchy for each sandbox's memory and pids
#: limits. No ``--privileged`` and no added capability: the code itself still runs with every capability dropped, as
#: uid 65534, in its own namespaces. A scheduler that cannot grant these can run the families without containers.
SANDBOX_RUN_OPTIONS = ("--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
                       "--security-opt", "systempaths=unconfined", "--cgroupns", "host",
                       "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw")
RUN_OPTIONS: dict[str, tuple[str, ...]] = {"code_interpreter": SANDBOX_RUN_OPTIONS, "swe": SANDBOX_RUN_OPTIONS}
#: where agentgym's download cache lives in every image (``HOME=/root``, no ``AGENTGYM_CACHE_DIR``)
IMAGE_CACHE = "/root/.cache/agentgym"
DOCKERFILE = REPO / "docker" / "Dockerfile"


def _swe_caches() -> list[tuple[Path, str]]:
    """Every pinned SWE library's source tree and test-only dependencies, fetched on this machine (pip, once) and
    baked in: the image has no pip, and a reset must not depend on reaching PyPI from inside a cluster."""
    sys.path.insert(0, str(REPO))
    from agentgym.tasks.swe.libraries import cache_root, fetch_library, known_libraries, test_deps

    for name in known_libraries():
        fetch_library(name)
        test_deps(name)
    root = cache_root()
    return [(root / part, f"{IMAGE_CACHE}/swe/{root.name}/{part}") for part in ("src", "deps")]


#: family -> what it fills agentgym's cache with at reset time, prepared here: (host folder, image folder) pairs
CACHES = {"swe": _swe_caches}
_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages"}


def _docker(*args: str, stdin: bytes | None = None, timeout: float = 600) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout, check=False)


def requirement_closure(extras: Iterable[str]) -> dict[str, metadata.Distribution]:
    """Installed distributions that agentgym's core dependencies plus ``serve-env`` and ``extras`` pull in."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = list(project["dependencies"]) + list(project["optional-dependencies"]["serve-env"])
    for extra in extras:
        roots += [r for r in project["optional-dependencies"][extra] if not r.startswith("agentgym")]
    found: dict[str, metadata.Distribution] = {}
    pending = [(r, "") for r in roots]
    while pending:
        text, extra = pending.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{req.name} is not installed here; run `pip install -e '.[serve-env,{','.join(extras)}]'` "
                             "first (the image is assembled from this machine's installation)") from None
        for wanted in req.extras:  # e.g. math-verify[antlr4_13_2]
            pending += [(r, wanted) for r in dist.requires or []]
        if key in found:
            continue
        found[key] = dist
        pending += [(r, "") for r in dist.requires or []]
    return found


def _python_files() -> Iterator[tuple[Path, str]]:
    """(host path, image path) of the interpreter, libpython and the standard library."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    yield Path(os.path.realpath(sys.executable)), f"{PREFIX}/bin/{version}"
    libdir = Path(sysconfig.get_config_var("LIBDIR") or prefix / "lib")
    ldlibrary = sysconfig.get_config_var("INSTSONAME") or ""
    if ldlibrary and (libdir / ldlibrary).exists():
        # Beside libc, where the loader looks with no help: sandboxes start Python with a cleared environment
        # (no LD_LIBRARY_PATH), and the interpreter's RUNPATH names this machine's prefix, not the image's.
        yield libdir / ldlibrary, f"{_loader_default_dir()}/{ldlibrary}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for root, dirs, files in os.walk(stdlib):
        rel = Path(root).relative_to(stdlib)
        dirs[:] = [d for d in dirs if not (rel == Path(".") and (d in _STDLIB_SKIP or d.startswith("config-")))]
        for name in files:
            yield Path(root) / name, f"{PREFIX}/lib/{version}/{rel / name}"


def _loader_default_dir() -> str:
    """The folder this machine's libc is in (e.g. ``/usr/lib/x86_64-linux-gnu``), under the image's merged ``/usr``."""
    result = subprocess.run(["ldd", os.path.realpath(sys.executable)], capture_output=True, text=True, check=False)
    match = re.search(r"libc\.so\.6 => (/\S+)", result.stdout)
    folder = os.path.dirname(match.group(1)) if match else "/usr/lib"
    return "/usr" + folder if folder.startswith(("/lib/", "/lib64")) else folder


def _distribution_files(dists: Iterable[metadata.Distribution]) -> Iterator[tuple[Path, str]]:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = f"{PREFIX}/lib/{version}/site-packages"
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            if ".." in file.parts or file.suffix == ".pyc" and "__pycache__" not in file.parts:
                continue
            host = base / file
            if host.is_file():
                yield host, f"{site}/{file.as_posix()}"


def _shared_libraries(binaries: Iterable[Path]) -> dict[str, Path]:
    """image path -> host file of every library ``ldd`` lists for ``binaries`` (ELF files only)."""
    out: dict[str, Path] = {}
    for binary in binaries:
        with open(binary, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
        for line in result.stdout.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match and not match.group(1).startswith((PREFIX, sys.base_prefix)):
                path = match.group(1)
                out.setdefault(path, Path(os.path.realpath(path)))
    return out


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, host: Path, name: str, added: set[str]) -> None:
    name = name.lstrip("/")
    if name in added:
        return
    added.add(name)
    info = tar.gettarinfo(str(host), arcname=name)
    if info.issym() or info.islnk():  # store what the link points at
        info = tar.gettarinfo(os.path.realpath(host), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    with open(host, "rb") as f:
        tar.addfile(info, f)


def write_rootfs(family: str, stream: io.BufferedIOBase) -> int:
    """Write the family's root filesystem as a tar stream; returns the number of files."""
    extras, programs, folders = FAMILIES[family]
    files = list(_python_files()) + list(_distribution_files(requirement_closure(extras).values()))
    for program in programs:
        host = shutil.which(program) or shutil.which(program, path="/usr/games")  # Debian puts stockfish there
        if host is None:
            raise SystemExit(f"{program} is not installed here (the {family} image copies it from this machine); "
                             "install it with apt-get first")
        files.append((Path(os.path.realpath(host)), f"/usr/bin/{program}"))
    trees = [(Path(folder), folder) for folder in folders] + (CACHES[family]() if family in CACHES else [])
    for host_root, image_root in trees:
        for root, _, names in os.walk(host_root):
            rel = Path(root).relative_to(host_root)
            files += [(Path(root) / n, f"{image_root}/{(rel / n).as_posix()}") for n in names if (Path(root) / n).is_file()]
    # Shared objects and every executable (Chromium, Playwright's node driver) bring the libraries they link.
    elf = [host for host, image in files
           if image.endswith(".so") or ".so." in image or "/bin/" in image or os.access(host, os.X_OK)]
    libraries = _shared_libraries(elf)
    added: set[str] = set()
    with tarfile.open(fileobj=stream, mode="w|") as tar:
        for directory in ("tmp", "etc", "usr", "usr/bin", "usr/lib", "usr/lib64", "opt", "work", "root"):
            _add_dir(tar, directory, 0o1777 if directory in ("tmp", "work") else 0o755)
        for text, name in ((b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/work:/bin/sh\n", "etc/passwd"),
                           (b"root:x:0:\nnogroup:x:65534:\n", "etc/group")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
        # merged /usr: a sandbox that binds only /usr (bwrap) still finds the loader through /lib64 -> usr/lib64
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), (f"{PREFIX[1:]}/bin/python3", f"python{sys.version_info.major}.{sys.version_info.minor}"),
                             (f"{PREFIX[1:]}/bin/python", "python3")):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
            added.add(link)
        for image_path, host in sorted(libraries.items()):
            target = "/usr" + image_path if image_path.startswith(("/lib/", "/lib64/")) else image_path
            _add_file(tar, host, target, added)
        for host, image_path in files:
            _add_file(tar, host, image_path, added)
    return len(added)


def build_python_image(family: str, tag: str | None = None) -> str:
    """``docker import`` the family's root filesystem as ``agentgym-python-<family>:local`` (or ``tag``)."""
    tag = tag or f"agentgym-python-{family}:local"
    changes = [f"ENV PATH={PREFIX}/bin:/usr/bin", "ENV LANG=C.UTF-8",
               *(f"ENV {key}={value}" for key, value in IMAGE_ENV.get(family, {}).items())]
    process = subprocess.Popen(["docker", "import", *(arg for change in changes for arg in ("--change", change)),
                                "-", tag],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stderr is not None
    try:
        write_rootfs(family, process.stdin)  # type: ignore[arg-type]
    finally:
        process.stdin.close()
    process.wait(timeout=600)
    err = process.stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"docker import failed: {err.decode(errors='replace').strip()}")
    return tag


def build_env_image(family: str, tag: str | None = None) -> str:
    """Build ``docker/Dockerfile`` (agentgym's source over the family's Python image) as ``agentgym-env-<family>:local``."""
    if family not in FAMILIES:
        raise SystemExit(f"unknown family {family!r}; families: {', '.join(sorted(FAMILIES))}")
    tag = tag or f"agentgym-env-{family}:local"
    result = _docker("build", "--network", "none", "-f", str(DOCKERFILE), "--build-arg", f"FAMILY={family}",
                     "--build-arg", f"ENV_ID={DEFAULT_ENVS[family]}", "-t", tag, str(REPO))
    if result.returncode != 0:
        raise SystemExit(f"docker build failed: {result.stderr.decode(errors='replace')[-3000:]}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    args = parser.parse_args(argv)
    base = build_python_image(args.family)
    image = build_env_image(args.family)
    print(f"built {base} and {image}; run: docker run --rm --network host {image} --port 8000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
