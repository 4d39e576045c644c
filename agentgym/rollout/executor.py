"""Where env calls run: worker threads that a hung env cannot pin (:class:`EnvExecutor`), and the timed call itself.

The step timeout counts only the time an env call runs, never the time it waited for a free worker. A call that runs
past it ends its episode, a fresh worker takes the stuck one's place, and a call that never returns cannot keep the
process from exiting (the workers are daemon threads). Sandboxed code has its own, shorter limit inside the sandbox,
so a stuck sandbox call still comes back; only in-process Python that never returns leaves a thread behind, and that
thread holds nothing but its abandoned env.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from agentgym.utils.coroutines import run_coroutine

__all__ = ["EnvExecutor", "call_env", "run_coroutine"]


class EnvExecutor(concurrent.futures.Executor):
    """Runs env calls on at most ``workers`` daemon threads (started as calls need them), replacing a thread stuck in
    a timed-out call.

    Why not ``ThreadPoolExecutor``: Python joins its worker threads at interpreter exit, so a single env step
    that never returns keeps the whole process alive after the rollout has ended. Daemon threads are not
    joined; a stuck one is left behind with its abandoned env, and :meth:`replace_stuck_worker` starts
    another so the pool keeps its capacity. (Threads, not processes: envs hold sandboxes, browsers and
    sockets that cannot be moved to a child process, and their slow parts already run in one.)
    """

    def __init__(self, workers: int, name: str = "agentgym-env") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._name = name
        self._workers = max(1, workers)
        self._active = 0  # threads started and not replaced as stuck: the ones that count against ``workers``
        self._threads: list[threading.Thread] = []
        self._stuck: set[threading.Thread] = set()
        # Threads start on demand (a submit that finds none idle), up to ``workers``: a rollout whose envs all step
        # inline never starts one, where it used to start and join eight per run. One token per idle thread, in a
        # SimpleQueue rather than a Semaphore: a worker never takes a Python lock after a call (see _work).
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._closed = False

    def _spawn(self) -> None:
        self._active += 1
        thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("EnvExecutor is shut down; env calls cannot be scheduled after the rollout ended.")
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._queue.put((future, fn, args, kwargs))
            try:
                self._idle.get_nowait()
            except queue.Empty:
                if self._active < self._workers:
                    self._spawn()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - delivered to the waiting episode
                    future.set_exception(exc)
            del future, fn, args, kwargs
            # Lock-free test first: taking the lock after every call made submit() wait on workers that wait on
            # the GIL (a switch interval each), about 0.4 ms a submit with 256 episodes starting at once.
            if self._stuck and threading.current_thread() in self._stuck:
                with self._lock:  # it was replaced while stuck: keep the count
                    self._stuck.discard(threading.current_thread())
                return
            if self._queue.empty():  # going idle: say so; with calls queued it takes one without a token
                self._idle.put(None)

    def replace_stuck_worker(self, thread: threading.Thread) -> None:
        """``thread`` runs a call that is past its timeout: start a replacement; ``thread`` exits when it returns."""
        with self._lock:
            if self._closed or thread in self._stuck or thread not in self._threads:
                return
            self._stuck.add(thread)
            self._active -= 1
            self._spawn()  # at once, not at the next submit: an idle token may be stale, and calls may be queued

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)
        if wait:  # a stuck thread may never return; it is a daemon and is not waited for
            for thread in self._threads:
                if thread not in self._stuck:
                    thread.join()


async def call_env(executor: concurrent.futures.Executor, timeout_s: float, fn: Callable[..., Any], *args: Any,
                   inline: bool = False, **kwargs: Any) -> Any:
    """Run an env call in a worker thread, inline for ``cheap_steps`` envs.

    ``timeout_s`` counts from the moment a worker starts the call: time spent queued behind other episodes'
    env calls is the engine's business, not the env's, and must not turn a healthy slow env into an error.

    Raises:
        TimeoutError: The call ran longer than ``timeout_s`` (its worker is replaced, see :class:`EnvExecutor`).
    """
    if inline:
        return fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    started: asyncio.Future[tuple[float, threading.Thread]] = loop.create_future()

    def job() -> Any:
        try:
            loop.call_soon_threadsafe(_resolve, started, (time.monotonic(), threading.current_thread()))
        except RuntimeError:  # the event loop is gone: the rollout ended while this call was queued
            return None
        return fn(*args, **kwargs)

    done = loop.run_in_executor(executor, job)
    await asyncio.wait((started, done), return_when=asyncio.FIRST_COMPLETED)
    if not done.done():
        start, thread = started.result()
        remaining = start + timeout_s - time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout=max(remaining, 0.0))
        except TimeoutError:
            done.cancel()
            if isinstance(executor, EnvExecutor):
                executor.replace_stuck_worker(thread)
            raise
    started.cancel()
    return done.result()


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
