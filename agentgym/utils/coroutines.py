"""Running a coroutine from synchronous code, with Ctrl-C landing cleanly wherever it lands.

Why a module of its own: the rollout engines, the judges, the envs that query a policy (an opponent, a simulated
search engine) all run coroutines from synchronous code. Done with a bare ``asyncio.run``, a Ctrl-C between any two
bytecodes of the main thread can leave a half-built event loop (its finalizer prints a traceback at exit) or a
coroutine never started ("coroutine ... was never awaited"), and a call from a thread whose own loop runs fails.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import signal
import threading
from collections.abc import Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

__all__ = ["interrupts_held", "run_blocking", "run_coroutine"]


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """A short region during which Ctrl-C waits; on leaving it, a Ctrl-C received meanwhile is raised again to
    whatever handler was in place (so the caller sees exactly what it would have seen, only later).

    Off the main thread, where Python cannot change signal handlers and never runs them, it holds nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGINT, record)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)


_Result = TypeVar("_Result")


def run_coroutine(coroutine: Coroutine[Any, Any, _Result]) -> _Result:
    """``asyncio.run(coroutine)`` for a coroutine with a large result, without Python formatting that result.

    Why: on the main thread ``asyncio.run`` puts back its Ctrl-C handler on the way out, and on CPython 3.11
    reading the handler formats ``repr`` of the finished main task, result included: for a list of trajectories,
    every turn of the first six in full, about 8 ms for 256 episodes of 20 turns with token ids, per run.
    A Ctrl-C at any moment raises ``KeyboardInterrupt`` and leaves nothing that complains at exit: no half-built
    loop (its finalizer prints a traceback) and no coroutine that was never started (a "never awaited" warning).
    """
    results: list[_Result] = []

    async def main() -> None:
        results.append(await coroutine)

    runner, first = asyncio.Runner(), main()
    try:
        with interrupts_held():  # a Ctrl-C inside would leave a half-built loop behind
            runner.get_loop()
        with runner:
            runner.run(first)
    except BaseException:
        for unstarted in (first, coroutine):  # cut before the loop ran them: closing says they are not forgotten
            if inspect.iscoroutine(unstarted) and inspect.getcoroutinestate(unstarted) == inspect.CORO_CREATED:
                unstarted.close()
        runner.close()
        raise
    return results[0]


def run_blocking(coroutine: Coroutine[Any, Any, _Result]) -> _Result:
    """:func:`run_coroutine`, also from a thread whose event loop is running (an env that the rollout engine steps
    inline): there it runs on a helper thread, since a loop cannot wait on a second loop in its own thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_coroutine(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentgym-blocking") as pool:
        return pool.submit(run_coroutine, coroutine).result()
