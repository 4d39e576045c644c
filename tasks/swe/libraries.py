"""The real libraries SWE tasks are built from: pinned source distributions, fetched via pip and cached.

Their code is never committed: each task records the library, version and sdist hash, and the repo state
is rebuilt from the cached sdist plus the task's mutation. Everything downloaded is verified against the
pinned SHA-256, so a changed upload on PyPI is caught instead of silently changing the tasks.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agentgym.errors import ConfigError, TaskError, did_you_mean

__all__ = ["LIBRARIES", "Library", "cache_root", "fetch_library", "get_library"]

CACHE_VERSION = "v1"


@dataclass(frozen=True)
class Library:
    """One pinned library.

    Attributes:
        name: PyPI name.
        version: Pinned version.
        sha256: SHA-256 of the sdist.
        package_dir: Directory (relative to the sdist root) whose modules get bugs.
        python_path: What must be on ``sys.path`` to import the package from the repo root.
        test_dir: The test directory.
        skip_modules: Modules never mutated (version stamps, platform glue, network code).
        skip_tests: Test files never run (need extra plugins, network or are slow benchmarks).
    """

    name: str
    version: str
    sha256: str
    package_dir: str
    python_path: str
    test_dir: str
    skip_modules: tuple[str, ...] = ("__init__.py",)
    skip_tests: tuple[str, ...] = ()

    @property
    def sdist_name(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


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


def get_library(name: str) -> Library:
    if name not in LIBRARIES:
        raise ConfigError(f"Unknown SWE library {name!r}.{did_you_mean(name, LIBRARIES)} "
                          f"Known: {', '.join(LIBRARIES)}.")
    return LIBRARIES[name]


def cache_root() -> Path:
    """``$AGENTGYM_CACHE`` or ``~/.cache/agentgym``, plus the SWE cache version."""
    base = Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym"))
    return base / "swe" / CACHE_VERSION


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_library(name: str) -> Path:
    """The pristine source tree of a pinned library (downloaded once with pip, verified, cached)."""
    lib = get_library(name)
    root = cache_root()
    tree = root / "src" / lib.key
    if (tree / ".agentgym-complete").exists():
        return tree
    sdist = root / "sdists" / lib.sdist_name
    if not sdist.exists() or _sha256(sdist) != lib.sha256:
        sdist.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                   "-q", "-d", tmp, f"{lib.name}=={lib.version}"],
                                  capture_output=True, text=True, check=False)
            found = list(Path(tmp).glob("*.tar.gz"))
            if proc.returncode != 0 or not found:
                raise TaskError(f"Could not download {lib.name}=={lib.version} from PyPI ({proc.stderr.strip()[-300:]}). "
                                "Check network access to PyPI, or place the sdist at " + str(sdist))
            shutil.move(str(found[0]), sdist)
    actual = _sha256(sdist)
    if actual != lib.sha256:
        raise TaskError(f"{sdist} has SHA-256 {actual}, expected {lib.sha256}: the upload changed. "
                        "Delete the file to re-download, or re-pin the library version.")
    staging = Path(tempfile.mkdtemp(prefix=f"{lib.key}-", dir=root))
    with tarfile.open(sdist) as tar:
        tar.extractall(staging, filter="data")
    inner = staging / lib.key
    if not inner.is_dir():
        raise TaskError(f"{sdist} does not contain the folder {lib.key}/.")
    (inner / ".agentgym-complete").write_text(lib.sha256)
    tree.parent.mkdir(parents=True, exist_ok=True)
    if tree.exists():
        shutil.rmtree(tree)
    inner.rename(tree)
    shutil.rmtree(staging, ignore_errors=True)
    return tree
