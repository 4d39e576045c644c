"""The real libraries SWE tasks are built from: pinned source distributions, fetched via pip and cached.

Their code is never committed: each task records the library, version and sdist hash, and the repo state
is rebuilt from the cached sdist plus the task's mutation. Everything downloaded is verified against the
pinned SHA-256, so a changed upload on PyPI is caught instead of silently changing the tasks.

Adding a library is a declaration, not a code change: a TOML file with one ``[[library]]`` table per library
(the fields of :class:`Library`), found through ``$AGENTGYM_SWE_LIBRARIES`` (paths separated by ``:``) or at
``~/.config/agentgym/swe_libraries.toml``; or :func:`register_library` from Python. For example::

    [[library]]
    name = "funcy"                 # the PyPI name; dashed names (more-itertools) work too
    version = "2.0"
    sha256 = "3963315d59d41c6f30c04bc910e10ab50a3ac4a225868bfa96feed133df075cb"
    package_dir = "funcy"          # where bugs go, relative to the sdist root
    python_path = "."              # what goes on sys.path to import it from the repo root
    test_dir = "tests"
    test_requires = ["whatever==0.7"]   # test-only dependencies, installed into the cache, not the repo

Test-only dependencies are installed once with ``pip install --target`` into a per-library folder under the
cache root, mounted read-only into every sandbox at :data:`DEPS_MOUNT` and put on the tests' path
(:attr:`Library.test_path`), so neither the host environment nor the agent's repository changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agentgym.utils import cache
from agentgym.errors import ConfigError, TaskError, did_you_mean

__all__ = ["DEPS_MOUNT", "LIBRARIES", "LIBRARY_FILES_ENV", "Library", "cache_root", "fetch_library",
           "get_library", "known_libraries", "library_from_dict", "load_library_file", "register_library",
           "test_deps"]

CACHE_VERSION = "v1"
DEPS_MOUNT = "/opt/agentgym/deps"
LIBRARY_FILES_ENV = "AGENTGYM_SWE_LIBRARIES"
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Library:
    """One pinned library: everything needed to rebuild its tree and run its tests.

    Attributes:
        name: PyPI name (``more-itertools``); the sdist may spell it ``more_itertools``.
        version: Pinned version.
        sha256: SHA-256 of the sdist (``pip download --no-binary :all: --no-deps NAME==VERSION``, then
            ``sha256sum``): a changed upload must not silently change the tasks.
        package_dir: Directory (relative to the sdist root) whose modules get bugs.
        python_path: What must be on ``sys.path`` to import the package from the repo root.
        test_dir: The test directory.
        skip_modules: Modules never mutated (version stamps, platform glue, network code).
        skip_tests: Test files never run (need extra plugins, network or are slow benchmarks).
        test_requires: Pinned pip requirements the tests need beyond pytest (``whatever==0.7``).
    """

    name: str
    version: str
    sha256: str
    package_dir: str
    python_path: str = "."
    test_dir: str = "tests"
    skip_modules: tuple[str, ...] = ("__init__.py",)
    skip_tests: tuple[str, ...] = ()
    test_requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"SWE library {self.name!r}"
        if not _NAME.match(self.name):
            raise ConfigError(f"{where}: the name must be a PyPI project name such as 'more-itertools'.")
        if not _SHA256.match(self.sha256):
            raise ConfigError(f"{where}: sha256 must be 64 lowercase hex digits (sha256sum of the sdist).")
        for label, path in (("package_dir", self.package_dir), ("python_path", self.python_path),
                            ("test_dir", self.test_dir)):
            if Path(path).is_absolute() or ".." in Path(path).parts:
                raise ConfigError(f"{where}: {label} must be relative to the sdist root, got {path!r}.")

    @property
    def sdist_name(self) -> str:
        """The cached sdist's file name (our name for it, whatever PyPI calls the upload)."""
        return f"{self.name}-{self.version}.tar.gz"

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def test_path(self) -> tuple[str, ...]:
        """Sandbox paths the tests need on ``sys.path`` besides the repo: the test-only dependencies, if any."""
        return (DEPS_MOUNT,) if self.test_requires else ()


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (
    Library("toolz", "1.2.0", "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490",
            "toolz", ".", "toolz/tests", skip_modules=("__init__.py", "compatibility.py", "_signatures.py"),
            skip_tests=("test_serialization.py", "test_curried_doctests.py")),
    Library("cachetools", "8.0.1", "deb1d376d4d28c2f33f3e3058043b005e0af75c35c094bd54053e27d2906ad95",
            "src/cachetools", "src", "tests", skip_tests=("test_threading.py",)),
    Library("humanize", "4.17.0", "1d6a36c453dbfbb3f0b34601d2e0b4ce5d48d780305cd45714843f0068fde6ac",
            "src/humanize", "src", "tests", skip_modules=("__init__.py", "_version.py", "i18n.py"),
            skip_tests=("test_benchmarks.py", "test_i18n.py")),
    Library("boltons", "26.2.0", "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c",
            "boltons", ".", "tests",
            skip_modules=("__init__.py", "socketutils.py", "debugutils.py", "deprutils.py", "ecoutils.py",
                          "gcutils.py", "fileutils.py", "mboxutils.py", "easterutils.py"),
            skip_tests=("test_socketutils.py", "test_debugutils_trace.py", "test_ecoutils.py", "test_gcutils.py",
                        "test_fileutils.py")),
    Library("tabulate", "0.10.0", "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d",
            "tabulate", ".", "test", skip_modules=(), skip_tests=("test_cli.py",)),
)}
"""The built-in libraries (the shipped tasks use these). Users add theirs by declaration, see the module doc."""

_REGISTERED: dict[str, Library] = {}
_loaded_files: set[Path] = set()


def library_from_dict(data: Mapping[str, Any], *, source: str = "a library declaration") -> Library:
    """A :class:`Library` from one declaration (a TOML ``[[library]]`` table or a dict)."""
    known = {f.name for f in fields(Library)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {unknown}; a library declares {sorted(known)}.")
    missing = [k for k in ("name", "version", "sha256", "package_dir") if k not in data]
    if missing:
        raise ConfigError(f"{source}: missing {missing}; name, version, sha256 and package_dir are required.")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    for k in ("skip_modules", "skip_tests", "test_requires"):
        if k in values and not (isinstance(values[k], tuple) and all(isinstance(x, str) for x in values[k])):
            raise ConfigError(f"{source}: {k} must be a list of strings.")
    return Library(**values)


def register_library(lib: Library, *, replace: bool = False) -> Library:
    """Make ``lib`` known to the builder, the env and verification in this process.

    A built-in name cannot be re-declared with other settings (its shipped tasks pin those); ``replace``
    allows re-registering a user library with a new version.
    """
    current = LIBRARIES.get(lib.name) or _REGISTERED.get(lib.name)
    if current is not None and current != lib and (lib.name in LIBRARIES or not replace):
        raise ConfigError(f"SWE library {lib.name!r} is already declared as {current.key} with other settings; "
                          "use another name, or pass replace=True for a library you declared yourself.")
    _REGISTERED[lib.name] = lib
    return lib


def load_library_file(path: Path | str) -> list[Library]:
    """Register every ``[[library]]`` table of a TOML file; returns them."""
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"Cannot read SWE library file {path}: {exc}. Fix the path in ${LIBRARY_FILES_ENV}.") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"SWE library file {path} is not valid TOML: {exc}.") from exc
    tables = data.get("library")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"SWE library file {path} must hold [[library]] tables (see agentgym.tasks.swe.libraries).")
    found = [register_library(library_from_dict(t, source=f"{path} [[library]] #{i + 1}"), replace=True)
             for i, t in enumerate(tables)]
    _loaded_files.add(path.resolve())
    return found


def _declaration_files() -> list[Path]:
    listed = os.environ.get(LIBRARY_FILES_ENV)
    if listed:
        return [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "agentgym" / "swe_libraries.toml"
    return [config] if config.is_file() else []


def known_libraries() -> dict[str, Library]:
    """Built-in libraries plus those declared by the user (files read once per process)."""
    for path in _declaration_files():
        if path.resolve() not in _loaded_files:
            load_library_file(path)
    return {**LIBRARIES, **_REGISTERED}


def get_library(name: str) -> Library:
    libraries = known_libraries()
    if name not in libraries:
        raise ConfigError(f"Unknown SWE library {name!r}.{did_you_mean(name, libraries)} Known: {', '.join(libraries)}. "
                          f"Declare a new one in a TOML file named by ${LIBRARY_FILES_ENV} (see "
                          "agentgym.tasks.swe.libraries).")
    return libraries[name]


def cache_root() -> Path:
    """Where SWE sources live: ``agentgym.utils.cache.cache_root()/swe/v1``."""
    return cache.cache_root() / "swe" / CACHE_VERSION


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip(args: list[str], what: str, fix: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise TaskError(f"Could not {what} ({proc.stderr.strip()[-300:]}). {fix}")


def _download_sdist(lib: Library) -> Path:
    """The verified sdist in the cache (downloaded with pip at most once, even with concurrent callers)."""
    sdist = cache_root() / "sdists" / lib.sdist_name

    def download(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(dir=tmp.parent, prefix=f".{lib.key}-download-") as folder:
            _pip(["download", "--no-deps", "--no-binary", ":all:", "-q", "-d", folder, f"{lib.name}=={lib.version}"],
                 f"download {lib.name}=={lib.version} from PyPI", f"Check network access to PyPI, or place the "
                 f"sdist at {sdist}")
            found = [p for p in Path(folder).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
            if not found:
                raise TaskError(f"PyPI has no sdist for {lib.name}=={lib.version}; SWE tasks need the source tree.")
            shutil.move(str(found[0]), tmp)

    cache.build_once(sdist, download, directory=False)
    actual = _sha256(sdist)
    if actual != lib.sha256:
        raise TaskError(f"{sdist} has SHA-256 {actual}, expected {lib.sha256}: the upload changed. "
                        "Delete the file to re-download, or re-pin the library version.")
    return sdist


def _sdist_root(staging: Path, lib: Library) -> Path:
    """The sdist's single top folder: ``more-itertools-10.0`` or ``more_itertools-10.0`` alike."""
    tops = [p for p in staging.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise TaskError(f"The sdist of {lib.key} should hold one top folder, found {[p.name for p in tops]}.")
    return tops[0]


def fetch_library(name: str) -> Path:
    """The pristine source tree of a pinned library (downloaded once with pip, verified, cached).

    Built with :func:`agentgym.utils.cache.build_once`, so any number of processes may ask at once.
    """
    lib = get_library(name)
    target = cache_root() / "src" / lib.key

    def extract(tmp: Path) -> None:
        sdist = _download_sdist(lib)
        with tempfile.TemporaryDirectory(dir=tmp, prefix=".extract-") as staging:
            if sdist.read_bytes()[:2] == b"PK":
                shutil.unpack_archive(sdist, staging, format="zip")
            else:
                with tarfile.open(sdist) as tar:
                    tar.extractall(staging, filter="data")
            root = _sdist_root(Path(staging), lib)
            for item in root.iterdir():
                shutil.move(str(item), tmp / item.name)
        if not (tmp / lib.package_dir).is_dir():
            raise TaskError(f"{lib.key}: package_dir {lib.package_dir!r} is not in the sdist; fix the declaration.")
        _make_shareable(tmp)

    tree = cache.build_once(target, extract)
    if not (tree / _SHAREABLE_MARK).is_file():  # a tree unpacked before the mark existed
        with cache.file_lock(target.parent / f".{target.name}.lock"):
            if not (tree / _SHAREABLE_MARK).is_file():
                _make_shareable(tree)
    return tree


#: Written into a library tree once it holds no byte code and every sandbox user may read it.
_SHAREABLE_MARK = ".agentgym-shareable"


def _make_shareable(root: Path) -> None:
    """Drop shipped byte code and make the tree readable by every user.

    Sandboxes mount the tree read-only and run as a private, unprivileged uid, so a file the sdist packed with
    mode 0600 (funcy 2.0 ships ``tests/__pycache__/*.pyc`` that way) would be unreadable there and break the
    copy that sets up every episode. Byte code compiled by whoever built the sdist (PyPy 2.7, in funcy's case)
    is never what the sandbox's Python would run anyway.
    """
    for cached in sorted(root.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cached, ignore_errors=True)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0)
        if wanted != mode:
            path.chmod(wanted)
    (root / _SHAREABLE_MARK).touch()


def test_deps(name: str) -> Path | None:
    """The folder holding the library's test-only dependencies (``pip install --target``, once), or None.

    Mounted read-only at :data:`DEPS_MOUNT` in sandboxes: the tests import from it, nobody writes to it.
    """
    lib = get_library(name)
    if not lib.test_requires:
        return None
    digest = hashlib.sha256("\n".join(sorted(lib.test_requires)).encode()).hexdigest()[:12]
    target = cache_root() / "deps" / f"{lib.key}-{digest}"

    def install(tmp: Path) -> None:
        _pip(["install", "-q", "--no-compile", "--target", str(tmp), *lib.test_requires],
             f"install the test dependencies of {lib.key} {list(lib.test_requires)}",
             "Check network access to PyPI and the pins in the library's test_requires.")

    return cache.build_once(target, install)
