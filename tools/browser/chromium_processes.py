"""The Chromium processes a browser pool launched, found and handled from ``/proc``.

Playwright does not say which process is the browser it launched, yet the pool must watch that process (a
stopped or dead browser never answers, and waiting for it means waiting the whole watchdog) and clean up
after it when it is killed (its profile lock's temp dir stays behind). So each launch carries a marker of its
own on the command line, and the pool finds the browser by it.
"""

from __future__ import annotations

import os
import signal

from agentgym.utils import procfs

__all__ = ["browser_process", "kill_quietly", "singleton_dir"]


def browser_process(marker: str) -> int | None:
    """The pid of the Chromium browser process whose command line carries ``marker``, or None if none does.

    Chromium's zygotes, renderers and GPU process say ``--type=...``; but a child the browser has forked and not yet
    exec'd (a utility process starting) still shows the browser's own command line, so among the matches the browser
    is the one whose parent is not itself a match.
    """
    matches: dict[int, int] = {}  # pid -> parent pid
    for pid in procfs.all_pids():
        argv = procfs.cmdline(pid)
        if argv is None or marker not in argv or any(arg.startswith("--type=") for arg in argv):
            continue
        parent = procfs.parent_pid(pid)
        if parent is not None:  # else it has just exited
            matches[pid] = parent
    roots = [pid for pid, parent in matches.items() if parent not in matches]
    return roots[0] if len(roots) == 1 else None


def singleton_dir(pid: int) -> str | None:
    """The temp directory holding Chromium ``pid``'s profile lock socket, or None if it has none we can tell.

    Chromium makes one (``$TMPDIR/org.chromium.Chromium.XXXXXX``) per browser and removes it when it exits normally;
    a browser the pool kills (stopped, hung, or killed by a test) leaves it behind, one per kill, for the life of the
    machine. Found through the profile's ``SingletonSocket`` link, and only a directory of that name is returned.
    """
    argv = procfs.cmdline(pid) or []
    profile = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--user-data-dir=")), None)
    if profile is None:
        return None
    try:
        target = os.readlink(os.path.join(profile, "SingletonSocket"))
    except OSError:
        return None
    directory, name = os.path.split(target)
    if name != "SingletonSocket" or not os.path.basename(directory).startswith("org.chromium.Chromium."):
        return None
    return directory


def kill_quietly(pid: int) -> None:
    """SIGKILL ``pid`` if it still exists (only ever a process the pool launched, looked up while it ran)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
