"""Files that survive a full disk and a crash: atomic replacement, and JSONL appends that never leave a torn line.

Two failure shapes matter for a long run. A disk that fills (ENOSPC, or EFBIG past ``RLIMIT_FSIZE``) makes
``write(2)`` store part of a line and then fail; if nothing cuts that part back, the next successful append is glued
onto it and the file holds a corrupt line *in the middle*, which readers cannot tell from real damage. And a small
state file rewritten in place (``open("w")`` then ``write``) is empty or half-written when the disk is full or the
process dies between the truncate and the write. So:

* :func:`atomic_write_bytes` writes a temp file in the same directory, fsyncs it, ``os.replace`` s it over the
  target and fsyncs the directory (``rename(2)`` is atomic within one filesystem): readers see the old file or the
  new one, never a mix, and a failed write leaves the old file untouched and no temp file behind.
* :class:`LineAppender` appends whole lines to an ``O_APPEND`` descriptor; when a write or fsync fails it truncates
  the file back to where the line started (``ftruncate(2)`` frees space, so it works on a full disk) before the
  error propagates, so the file always ends on a line boundary.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from pathlib import Path
from types import TracebackType

__all__ = ["LineAppender", "SpaceReserve", "atomic_write_bytes", "atomic_write_text", "cut_torn_tail", "is_disk_full",
           "keep_first_lines"]

logger = logging.getLogger(__name__)

#: errno values meaning "no room to write": the disk or quota is full, or the file hit RLIMIT_FSIZE.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the filesystem (or the file size limit) has no room, rather than some other I/O fault."""
    return isinstance(exc, OSError) and exc.errno in _NO_ROOM


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (fsync(2) of the directory); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is still atomic
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` atomically (temp file + fsync + ``os.replace``).

    Raises:
        OSError: The data could not be written (e.g. ENOSPC); ``path`` is then exactly as it was before.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident():x}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str, *, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded with ``encoding``."""
    return atomic_write_bytes(path, text.encode(encoding))


def cut_torn_tail(fd: int, path: str | Path = "") -> int:
    """Truncate the bytes after the last newline of the file open at ``fd`` (a line torn by a crash or a full disk),
    so the next append starts on a fresh line; returns how many bytes were cut."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end < size:
        logger.warning("%s: removing a torn final line (%d bytes) left by an interrupted write before appending",
                       path, size - end)
        os.ftruncate(fd, end)
    return size - end


def keep_first_lines(path: str | Path, lines: int) -> int:
    """Truncate the file at ``path`` after its first ``lines`` complete lines (in place: no extra space is needed,
    so this works on a full disk); returns how many bytes were cut. A missing file is left missing."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        offset = seen = 0
        while seen < lines and offset < size:
            chunk = os.pread(fd, min(1 << 20, size - offset), offset)
            at = 0
            while seen < lines:
                newline = chunk.find(b"\n", at)
                if newline < 0:
                    break
                seen, at = seen + 1, newline + 1
            offset += at if seen == lines else len(chunk)
        if seen < lines:  # fewer lines than asked for: nothing to cut
            return 0
        end = offset
        if end < size:
            os.ftruncate(fd, end)
            os.fsync(fd)
        return size - end
    finally:
        os.close(fd)


class LineAppender:
    """Append whole lines to a file; a failed append is cut back at once, so the file always ends on a line boundary.

    One appender per file and process: the cut-back relies on nobody else appending between our write and our
    truncate. Thread-safe.

    Args:
        path: The file (created when missing; a torn tail left by an earlier crash is cut off first).
        fsync: fsync after each line, so a line that was reported written survives a power loss.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._torn = False
        try:
            cut_torn_tail(self._fd, self.path)
        except BaseException:
            os.close(self._fd)
            raise

    def append(self, line: bytes) -> None:
        """Append ``line`` (which must end with a newline) whole, or not at all.

        Raises:
            OSError: It could not be written (ENOSPC, EFBIG, EIO); the file is as it was before the call.
            ValueError: The appender is closed, or ``line`` does not end with a newline.
        """
        if not line.endswith(b"\n"):
            raise ValueError("LineAppender.append needs a line that ends with a newline.")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"The appender of {self.path} is closed.")
            if self._torn:  # an earlier cut-back failed: cut now, before this line could be glued onto the rest
                cut_torn_tail(self._fd, self.path)
                self._torn = False
            start = os.fstat(self._fd).st_size
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view):]
                if self._fsync:
                    os.fsync(self._fd)
            except OSError:
                self._cut_back(start)
                raise

    def _cut_back(self, start: int) -> None:
        assert self._fd is not None
        try:
            if os.fstat(self._fd).st_size > start:
                os.ftruncate(self._fd, start)
        except OSError:
            self._torn = True  # retried before the next append
            logger.warning("%s: could not cut a partly written line back yet; it is cut before the next append",
                           self.path, exc_info=True)

    def close(self) -> None:
        """fsync and close; idempotent."""
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                except OSError:
                    pass  # every line that was reported written was fsynced already (fsync=True)
                finally:
                    os.close(fd)

    def __enter__(self) -> LineAppender:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SpaceReserve:
    """Disk space set aside at the start of a long run and given back just before its final files are written.

    When the disk fills during the run, the run's last words (its summary: what was written, what was lost, how to
    resume) would otherwise fail to be written too. The reserve is a real allocation (``posix_fallocate(3)``), not
    a sparse file, so deleting it frees that much space on the same filesystem. Best effort: when the space cannot
    be reserved (the disk is already full, a filesystem without allocation), the run goes on without it.
    """

    def __init__(self, path: str | Path, size: int = 1 << 20) -> None:
        self.path: Path | None = Path(path)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError as exc:
            logger.info("could not reserve %d bytes at %s (%s); going on without a reserve", size, path, exc)
            self.release()

    def release(self) -> None:
        """Delete the reserve, freeing its space; idempotent."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None
