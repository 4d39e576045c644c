"""One cache root for everything agentgym downloads or builds, and one safe way to build into it.

Why this module exists: SWE sources, the search corpus, dense embeddings and Docker build contexts used to
pick their own roots (``AGENTGYM_CACHE`` here, ``AGENTGYM_CACHE_DIR`` there) and to build in place, so a
second process building the same entry deleted the tree under the first one's feet. Every cache now lives
under :func:`cache_root` and is built by :func:`build_once`: under an exclusive file lock, into a
temporary sibling, then renamed into place atomically. Readers therefore see either nothing or a complete
entry, never half of one, however many processes start at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["CACHE_ENV", "build_once", "cache_root", "file_lock", "is_built"]

log = logging.getLogger(__name__)

CACHE_ENV = "AGENTGYM_CACHE_DIR"
_LEGACY_ENV = "AGENTGYM_CACHE"
_COMPLETE = ".agentgym-complete"
_warned_legacy = False


def cache_root() -> Path:
    """``$AGENTGYM_CACHE_DIR``, else ``$XDG_CACHE_HOME/agentgym``, else ``~/.cache/agentgym``.

    The older SWE-only variable ``AGENTGYM_CACHE`` is still honoured when ``AGENTGYM_CACHE_DIR`` is unset, with
    a warning (once per process) that names its replacement, so existing set-ups keep their downloads. The
    path is made absolute, so subprocesses started in another directory agree on it.
    """
    global _warned_legacy
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser().absolute()
    legacy = os.environ.get(_LEGACY_ENV)
    if legacy:
        if not _warned_legacy:
            _warned_legacy = True
            log.warning("%s is deprecated; set %s=%s instead (one cache root for every family).",
                        _LEGACY_ENV, CACHE_ENV, legacy)
        return Path(legacy).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser().absolute() if xdg else Path.home() / ".cache") / "agentgym"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the duration of the block.

    ``flock`` locks die with their process, so a builder killed with SIGKILL never leaves a stale lock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def is_built(target: Path, *, directory: bool = True) -> bool:
    """Whether :func:`build_once` has a complete entry at ``target`` (it would return without building)."""
    return (Path(target) / _COMPLETE).is_file() if directory else Path(target).is_file()


def _is_complete(target: Path, directory: bool) -> bool:
    return is_built(target, directory=directory)


def _remove(path: Path) -> None:
    """Delete a file, a link or a whole tree, whichever ``path`` is."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def build_once(target: Path, build: Callable[[Path], None], *, directory: bool = True) -> Path:
    """Return ``target``, building it first if it is missing; safe with any number of concurrent processes.

    Args:
        target: The cache entry (a directory, or a file when ``directory`` is false).
        build: Called with a temporary path next to ``target`` and must create the entry there (for a
            directory: fill the already-created directory; for a file: write the file). It runs only in the
            process holding the lock, and only when no complete entry exists.
        directory: Whether the entry is a directory (marked complete by a ``.agentgym-complete`` file) or a
            single file.

    A failed or killed build leaves no entry behind: the next caller starts over. Temporaries left by a
    builder that was killed are removed by the next builder (they are recognisable by their prefix), and its
    lock dies with it (``flock``). A complete entry is never modified, so it is safe to read without a lock.
    """
    target = Path(target)
    if _is_complete(target, directory):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if _is_complete(target, directory):
            return target
        prefix = f".{target.name}.building-"
        for stale in target.parent.glob(glob.escape(prefix) + "*"):  # from a builder killed mid-way
            _remove(stale)
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, dir=target.parent)
            os.close(fd)
            tmp = Path(name)
        try:
            build(tmp)
            if directory:
                (tmp / _COMPLETE).write_text("ok\n")
                os.chmod(tmp, 0o755)  # mkdtemp makes 0700; caches are read by sandboxes (uid 65534) too
            else:
                os.chmod(tmp, 0o644)
            if target.exists() or target.is_symlink():  # an incomplete entry from an older, non-atomic version
                _remove(target)
            os.replace(tmp, target)
        except BaseException:
            _remove(tmp)
            raise
    return target
