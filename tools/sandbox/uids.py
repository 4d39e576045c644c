"""A private host uid per bwrap sandbox, leased with a file lock so no two live sandboxes share one.

Why: bwrap started by root maps the sandbox user onto host uid 0, and the kernel keeps several quotas and
objects *per user*, not per namespace: inotify instances and watches (``fs.inotify.max_user_*``), the user
keyring and key quotas, ``RLIMIT_NPROC``, and the owner of every file and proc entry. Sharing host root's
uid lets an episode exhaust root's inotify instances for the whole host, or own root's proc files. Running
bwrap itself as an otherwise unused uid (it then creates an unprivileged user namespace) charges all of that
to a uid nobody else has, one per sandbox, so concurrent sandboxes do not share quotas either.

Leases: ``flock`` on ``<lock dir>/<uid>``. The kernel drops the lock when its descriptor closes, including
when the host process dies, so a crashed host never strands a uid. The lock dir belongs to root with mode
0700; a dir that does not is refused (someone else could hold or fake leases).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import stat
from dataclasses import dataclass

__all__ = ["UID_BASE", "UID_SLOTS", "UidLease", "lease_uid", "lock_dir"]

#: Host uids ``UID_BASE .. UID_BASE + UID_SLOTS - 1`` are reserved for sandboxes: far above the ranges that
#: distributions give to users (< 60000), systemd's dynamic users (61184-65519) and the usual subordinate
#: uid ranges handed out from 100000 in steps of 65536 (which reach this only after ~23,000 users).
UID_BASE = 1_600_000_000
UID_SLOTS = 1 << 16
LOCK_DIRS = ("/run/agentgym-sandbox-uids", "/var/lock/agentgym-sandbox-uids")


@dataclass
class UidLease:
    """A host uid (and the gid with the same number) held by one sandbox until :meth:`release`."""

    uid: int
    fd: int | None

    def release(self) -> None:
        """Give the uid back (idempotent). Call only once nothing runs as it any more."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_dir() -> str:
    """The directory of lease locks, created if needed; raises ``OSError`` saying why it cannot be used."""
    errors = []
    for path in LOCK_DIRS:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.lstat(path)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror}")
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
            errors.append(f"{path} is not a directory owned by root with mode 0700")
            continue
        return path
    raise OSError("no lock dir for sandbox uids (" + "; ".join(errors) + ")")


def lease_uid(directory: str | None = None) -> UidLease:
    """Lease a free sandbox uid; raises ``OSError`` when none is free or leases cannot be taken here."""
    directory = directory or lock_dir()
    start = random.randrange(UID_SLOTS)  # noqa: S311 - spreads concurrent host processes, not a secret
    for step in range(UID_SLOTS):
        uid = UID_BASE + (start + step) % UID_SLOTS
        fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError:
            os.close(fd)
            raise
        return UidLease(uid, fd)
    raise OSError(f"all {UID_SLOTS} sandbox uids are in use")
