"""An asyncio event loop running forever in a daemon thread, for code that must own one loop.

Playwright's sync API is bound to the thread that started it, while the rollout engine steps envs from worker
threads. The browser pool therefore runs Playwright's async API on one loop in one thread, and every env call is
a coroutine submitted to it from whichever thread the env runs on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="agentgym-browser-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        if threading.current_thread() is self._thread:
            raise RuntimeError("BrowserPool methods must not be called from the pool's own event loop thread.")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()

