"""How many torch threads a CPU process should use, chosen so that it does not fight the machine's other work.

Why: torch's default starts one intra-op thread per core. When other processes already keep those cores busy (a
shared 2-core machine, several trainers, a test run beside a training run), every parallel kernel waits for its
slowest thread, which waits for a core: a behaviour-cloning step of the quickstart took 12.6-13.7 s with the
default threads on a busy 2-core machine and 1.5 s with one thread. So on a CPU we pick:

1. what the user said explicitly wins: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment, or a
   ``torch.set_num_threads`` call made before ours;
2. else ``AGENTGYM_CPU_THREADS``, else the config's ``cpu_threads``;
3. else the cores this process may run on (``sched_getaffinity``), shared among the processes of the job
   (``LOCAL_WORLD_SIZE`` under torchrun), less the cores the load average (``getloadavg``, see getloadavg(3))
   says other work keeps busy; at least one per process.

:func:`apply_cpu_threads` logs the choice once, in words. :class:`SlowStepWatch` notices steps that run far slower
than they should (much slower than the fastest one, or starved of the CPU time their threads asked for) and logs a
one-line hint once.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["THREADS_ENV", "SlowStepWatch", "ThreadChoice", "apply_cpu_threads", "available_cores", "choose_threads",
           "machine_load"]

logger = logging.getLogger(__name__)

THREADS_ENV = "AGENTGYM_CPU_THREADS"
"""Environment variable that sets the torch CPU thread count of agentgym's trainers (a positive integer)."""

_USER_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of every caller
        return None
    return int(torch.get_num_threads())


#: torch's thread count when this module was first imported (agentgym's trainers and CLI import it early): a
#: different count later means the user called ``torch.set_num_threads`` themselves, which wins.
_BASELINE = _torch_threads()
_applied: int | None = None
_logged: set[tuple[int, str]] = set()


@dataclass(frozen=True)
class ThreadChoice:
    """A thread count and why it was chosen."""

    threads: int
    """The torch intra-op thread count for this process."""
    source: str
    """Who decided: ``user`` (OMP_NUM_THREADS or torch.set_num_threads), ``env`` (AGENTGYM_CPU_THREADS),
    ``config`` (cpu_threads) or ``auto``."""
    reason: str
    """The choice in words, as logged."""


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one, else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def machine_load() -> float | None:
    """The 1-minute load average (runnable processes, averaged; getloadavg(3)), or ``None`` where there is none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _own_share() -> float:
    """How much of one core this process has used since it started (0..1): its own part of the load average."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        alive = uptime - int(fields[19]) / ticks  # field 22 of stat: start time in clock ticks after boot
    except (OSError, ValueError, IndexError):
        return 1.0
    cpu = time.process_time()
    return min(1.0, cpu / alive) if alive > 0 else 1.0


def _positive(text: str, name: str) -> int:
    from agentgym.errors import ConfigError

    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer (torch CPU threads), got {text!r}.") from None
    if value < 1:
        raise ConfigError(f"{name} must be a positive integer (torch CPU threads), got {value}.")
    return value


def choose_threads(configured: int | None = None, *, processes: int | None = None, cores: int | None = None,
                   load: float | None = None, own_share: float | None = None,
                   environ: Mapping[str, str] | None = None, current: int | None = None) -> ThreadChoice:
    """The thread count for this process; see the module docstring for the order of precedence.

    Args:
        configured: The config's ``cpu_threads`` (``None``: not set).
        processes: Processes of this job that share the machine (default: ``LOCAL_WORLD_SIZE``, else 1).
        cores, load, own_share, environ, current: The machine as measured (cores available, 1-minute load
            average, this process's own part of it, the environment, torch's current thread count); tests pass
            them, callers leave them out.
    """
    env = os.environ if environ is None else environ
    for name in _USER_ENV:
        if env.get(name, "").strip():
            n = _positive(env[name], name)
            return ThreadChoice(n, "user", f"{n} torch thread{'s' * (n != 1)} ({name}={env[name]} set by you)")
    current = _torch_threads() if current is None else current
    if current is not None and _BASELINE is not None and current not in (_BASELINE, _applied):
        return ThreadChoice(current, "user", f"{current} torch thread{'s' * (current != 1)} "
                                             "(torch.set_num_threads called by you)")
    if env.get(THREADS_ENV, "").strip():
        n = _positive(env[THREADS_ENV], THREADS_ENV)
        return ThreadChoice(n, "env", f"{n} torch thread{'s' * (n != 1)} ({THREADS_ENV}={env[THREADS_ENV]})")
    if configured is not None:
        n = _positive(str(configured), "cpu_threads")
        return ThreadChoice(n, "config", f"{n} torch thread{'s' * (n != 1)} (cpu_threads: {n} in the config)")
    cores = available_cores() if cores is None else cores
    if processes is None:
        processes = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    processes = max(1, processes)
    load = machine_load() if load is None else load
    share = max(1, cores // processes)
    how = f"set cpu_threads or {THREADS_ENV} to change it"
    if load is None:
        n = share
        why = f"{cores} cores" + (f" shared by {processes} processes" if processes > 1 else "")
    else:
        others = max(0.0, load - (_own_share() if own_share is None else own_share))
        free = max(0.0, cores - others)
        n = max(1, min(share, math.floor(free / processes + 1e-9)))
        busy = f"load average {load:.1f}" + (f" of which about {others:.1f} is other work" if others < load else "")
        why = f"{cores} cores, {busy}" + (f", {processes} processes" if processes > 1 else "")
        if n < share:
            why += ": fewer threads than cores so that they do not wait for busy cores"
    return ThreadChoice(n, "auto", f"{n} torch thread{'s' * (n != 1)} ({why}; {how})")


def apply_cpu_threads(configured: int | None = None, *, processes: int | None = None) -> ThreadChoice:
    """Choose (:func:`choose_threads`) and set torch's thread count; log the choice once per process and count."""
    global _applied
    import torch

    choice = choose_threads(configured, processes=processes)
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    if choice.source != "user":
        _applied = choice.threads
    key = (choice.threads, choice.source)
    if key not in _logged:
        _logged.add(key)
        logger.info("CPU: %s", choice.reason)
    return choice


class SlowStepWatch:
    """Notices a step far slower than expected and logs a one-line hint (once per watch).

    Expected means: at most ``factor`` times the fastest step seen so far, and, for pure torch work
    (``cpu_bound``), at least half the CPU time its threads could use in that wall time. A step under
    ``min_seconds`` never counts, so short steps' noise stays quiet.
    """

    def __init__(self, what: str, *, threads: int, factor: float = 4.0, min_seconds: float = 1.0) -> None:
        self.what = what
        self.threads = max(1, threads)
        self.factor = factor
        self.min_seconds = min_seconds
        self.fastest = math.inf
        self.hinted = False
        self._wall = 0.0
        self._cpu = 0.0

    def start(self) -> None:
        """Mark the start of a step."""
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, *, cpu_bound: bool = True) -> str | None:
        """Mark the end of the step begun by :meth:`start`; returns the hint when one was logged."""
        return self.observe(time.perf_counter() - self._wall, time.process_time() - self._cpu if cpu_bound else None)

    def observe(self, seconds: float, cpu_seconds: float | None = None) -> str | None:
        """Judge one step of ``seconds`` wall time (and ``cpu_seconds`` of this process's CPU time, if known)."""
        fastest, self.fastest = self.fastest, min(self.fastest, seconds)
        if self.hinted or seconds < self.min_seconds:
            return None
        cores, load = available_cores(), machine_load()
        loaded = f"{cores} cores, load average {load:.1f}" if load is not None else f"{cores} cores"
        fix = (f"try OMP_NUM_THREADS=1 (or cpu_threads: 1 / {THREADS_ENV}=1)" if self.threads > 1
               else "other processes compete for the cores; give the run a quieter machine or fewer neighbours")
        hint = None
        if cpu_seconds is not None and cpu_seconds < 0.5 * seconds * min(self.threads, cores):
            hint = (f"{self.what} took {seconds:.1f} s but got only {cpu_seconds / seconds:.1f} of the "
                    f"{min(self.threads, cores)} cores its {self.threads} torch threads ask for ({loaded}): {fix}.")
        elif math.isfinite(fastest) and seconds > self.factor * fastest:
            hint = (f"{self.what} took {seconds:.1f} s, {seconds / fastest:.0f}x the fastest one ({fastest:.2f} s; "
                    f"{loaded}, {self.threads} torch threads): {fix}.")
        if hint is not None:
            self.hinted = True
            logger.warning("%s", hint)
        return hint
