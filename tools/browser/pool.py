"""A pool of Playwright browser contexts on one system Chromium, leased one per episode.

Why this shape:

* **One event loop thread owns Playwright.** Playwright's sync API is bound to the thread that started it,
  while the rollout engine steps envs from worker threads. So one daemon thread runs an asyncio loop with
  the async API, and every env call is a coroutine submitted to it (``run_coroutine_threadsafe``). Calls
  from different envs interleave on the loop, so four contexts really work concurrently (Chromium renders
  each in its own process) instead of queueing behind one another as a sync-API worker thread would.
* **One browser, many contexts.** A context is an isolated profile (cookies, storage) that costs tens of
  milliseconds once the browser runs, against ~0.5-1.5 s to launch a browser. A :class:`BrowserSession`
  keeps its context across episodes and cleans it on ``start`` (cookies, web storage, permissions, extra
  pages; ``about:blank``); after ``recycle_after`` episodes the context is replaced to bound leaks.
* **Crashes are contained.** A killed browser, a crashed renderer or an operation that hangs past the
  watchdog marks only the affected leases broken: their current step raises :class:`BrowserCrashed` (the
  episode ends with ``end_reason="error"``), and the next ``start`` relaunches the browser if needed.
* **A dead or stopped browser is seen in about a second, not at the watchdog.** A CDP call to a frozen
  (SIGSTOPped) Chromium never answers, so waiting for it means waiting the whole watchdog. While a call
  is pending the pool checks, every :data:`LIVENESS_POLL_S`, the state of the processes it launched (the
  browser and its renderers, read from ``/proc``): one that is gone, a zombie or stopped ends the call at
  once with :class:`BrowserCrashed`, and a stopped one is killed so that the next ``start`` launches a
  fresh browser instead of hanging on the frozen one.
* **Nothing leaves 127.0.0.1.** Every context routes every request through the :class:`UrlGuard` of the
  episode (refused requests are aborted and reported), checks the first hop of redirects before the
  browser follows them, blocks service workers, and, as a second wall, the browser sends all
  non-loopback traffic to a dead proxy.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import concurrent.futures
import io
import logging
import os
import shutil
import signal
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeVar
from urllib.parse import urljoin

import numpy as np
from agentgym.tools.browser.config import BrowserConfig, find_chromium
from agentgym.tools.browser.errors import ActionError, BrowserCrashed
from agentgym.tools.browser.guard import UrlGuard
from agentgym.tools.browser.snapshot import (
    SELECT_ROLES,
    TEXT_ROLES,
    Snapshot,
    match_option,
    normalize_refs,
)

from agentgym.errors import DependencyNotInstalled

__all__ = ["STILL_CSS", "BrowserPool", "BrowserSession", "PageView", "default_pool", "resolve_pool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Viewport = tuple[int, int]

#: Substrings of Playwright errors that mean the page, context or browser is gone (not a model mistake).
_CRASH_MARKERS = ("Target crashed", "has been closed", "Browser closed", "Connection closed", "Target closed",
                  "browser has disconnected", "Page crashed")


def _names_a_crash(exc: BaseException) -> bool:
    """Whether a Playwright error says the page, context or browser is gone (not a model's mistake)."""
    message = str(exc)
    return any(marker in message for marker in _CRASH_MARKERS)


MAX_REDIRECT_HOPS = 10
#: How often a pending browser call checks that the pool's Chromium processes still run (first check after
#: this long, so quick calls never pay for it).
LIVENESS_POLL_S = 0.5
_DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, so proxied requests fail at once
#: A style that keeps a page's pixels still between two looks: no blinking caret, no CSS animation or
#: transition mid-way. :meth:`BrowserSession.observe` captures pixels as they are (one CDP call, no per-shot
#: stilling as ``page.screenshot(animations="disabled", caret="hide")`` does with its extra round trips), so an
#: env that hashes or compares screenshots adds this style once per page.
STILL_CSS = ("*, *::before, *::after { caret-color: transparent !important; animation: none !important; "
             "transition: none !important; }")
#: ``Page.captureScreenshot`` parameters: lossless PNG, fast zlib level, the viewport only.
_CAPTURE = {"format": "png", "optimizeForSpeed": True, "captureBeyondViewport": False}


def _import_playwright() -> Any:
    try:
        from playwright import async_api
    except ImportError as exc:
        raise DependencyNotInstalled("playwright", "web", "browser environments") from exc
    return async_api


class _LoopThread:
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


@dataclass(eq=False)
class _Lease:
    """One browser context with its page, owned by one session at a time."""

    key: Viewport
    context: Any
    page: Any
    browser: Any
    guard: UrlGuard | None = None
    refused: list[tuple[str, bool]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    broken: str | None = None
    episodes: int = 0
    cdp: Any = None  # a CDP session on ``page``, opened by the first observe()


class BrowserPool:
    """Playwright contexts on one system Chromium, shared by many envs in one process (thread-safe).

    Args:
        config: Launch flags, timeouts and the binary; defaults work on Debian with ``apt-get install chromium``.
        recycle_after: Replace a session's context with a new one after this many episodes.
        isolation: ``"context"`` (default): one browser, a pooled context per episode. ``"browser"``: a
            fresh browser process for every episode, closed after it (the strongest isolation, at the cost
            of a browser launch per episode; ``benchmarks/browser.py`` measures the difference).

    Raises:
        BrowserUnavailable: No Chromium binary (says what to install).
        DependencyNotInstalled: The ``playwright`` package is missing (``pip install 'agentgym[web]'``).
    """

    def __init__(self, config: BrowserConfig | None = None, *, recycle_after: int = 100,
                 isolation: Literal["context", "browser"] = "context") -> None:
        if isolation not in ("context", "browser"):
            raise ValueError(f"isolation must be 'context' or 'browser', got {isolation!r}.")
        self.isolation = isolation
        self.config = config or BrowserConfig()
        self.executable = find_chromium(self.config.executable_path)
        self._api = _import_playwright()
        if recycle_after < 1:
            raise ValueError(f"recycle_after must be >= 1, got {recycle_after}.")
        self.recycle_after = recycle_after
        self._marker = f"--agentgym-browser-pool={uuid.uuid4().hex}"
        self._pid = os.getpid()
        self._loop = _LoopThread()
        self._playwright: Any = None
        self._browser: Any = None
        self._browser_lock: asyncio.Lock | None = None
        # browser -> pid of the Chromium browser process we launched (keyed by the object, never by id(): an id is
        # reused once its object is freed); read and written on the loop thread only
        self._browser_pids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._launched_pids: list[int] = []  # the same pids in launch order, for browser_pid() on any thread
        self._singleton_dirs: dict[int, str] = {}  # pid -> the temp dir of its profile lock (see _singleton_dir)
        self._launches_started = 0
        # browsers killed after a hang: until their disconnect arrives they still look connected and alive
        self._killed: weakref.WeakSet[Any] = weakref.WeakSet()
        self._launching = 0  # launches in progress (the watchdog waits for them)
        self._idle: dict[Viewport, list[_Lease]] = {}
        self._leases: set[_Lease] = set()
        self._closed = False
        self._close_lock = threading.Lock()
        #: Counters for benchmarks and tests: browser launches, contexts created/reused, crashes seen.
        self.stats: dict[str, int] = {"launches": 0, "contexts_created": 0, "contexts_reused": 0, "crashes": 0}

    # ---- public API --------------------------------------------------------------------------------
    def session(self, *, viewport: Viewport = (1280, 720)) -> BrowserSession:
        """A session (one per env) that leases a context of this ``(width, height)`` on its first ``start``."""
        self._check_open()
        width, height = viewport
        if not (isinstance(width, int) and isinstance(height, int) and 16 <= width <= 4096 and 16 <= height <= 4096):
            raise ValueError(f"viewport must be (width, height) in pixels between 16 and 4096, got {viewport!r}.")
        return BrowserSession(self, (width, height))

    def prewarm(self, n: int, *, viewport: Viewport = (1280, 720)) -> None:
        """Launch the browser and park ``n`` idle contexts, so the first episodes do not pay for them."""
        self._check_open()

        async def warm() -> None:
            leases = [await self._acquire(viewport) for _ in range(n)]
            for lease in leases:
                self._idle.setdefault(viewport, []).append(lease)

        self._run(warm())

    def browser_pid(self) -> int | None:
        """Process id of this pool's Chromium browser process (not a renderer), or None if none runs.

        The newest one this pool launched that still runs (with ``isolation="browser"`` several may).
        """
        for pid in reversed(self._launched_pids[:]):
            if (_process_state(pid) or "Z") not in "ZX":
                return pid
        return None

    def close(self) -> None:
        """Close every context, the browser and Playwright; idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._pid != os.getpid():  # a forked child: the loop thread and the browser belong to the parent
            return
        try:
            self._loop.run(self._shutdown(), timeout=30)
        except Exception:
            logger.debug("browser pool shutdown failed", exc_info=True)
        self._loop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- running coroutines from other threads -----------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise BrowserCrashed("the browser pool is closed; create a new BrowserPool")

    def _run(self, coro: Awaitable[T], lease: _Lease | None = None) -> T:
        """Run ``coro`` on the loop; a hang past the watchdog or a dead browser becomes BrowserCrashed."""
        if self._closed:
            if asyncio.iscoroutine(coro):
                coro.close()
            raise BrowserCrashed("the browser pool is closed")
        future = self._loop.submit(coro)
        deadline = time.monotonic() + self.config.watchdog_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                return future.result(max(0.0, min(LIVENESS_POLL_S, remaining)))
            except concurrent.futures.TimeoutError:
                pass
            if self._launching:  # Chromium starting up (slow on a loaded machine) is not a hung browser
                deadline = max(deadline, time.monotonic() + self.config.watchdog_s)
                continue
            browser = lease.browser if lease is not None else self._browser
            problem = self._process_problem(browser) if browser is not None else None
            if problem is None and time.monotonic() < deadline:
                continue
            future.cancel()
            reason = problem or f"the browser did not answer within {self.config.watchdog_s:g} s (hung)"
            if lease is not None:
                lease.broken = lease.broken or reason
            if lease is None and browser is not None and problem is None:
                # No page is involved here (launch, new context, new page): the browser process itself stopped
                # answering (seen once on a loaded CI host right after a relaunch). Kill it: kept, it would hang
                # every later start of every env. A hang inside one page (a script that spins) only ends that
                # page's episode: the lease is broken above, and other pages on the browser go on.
                reason = self._kill_hung(browser, reason)
                problem = reason
            if browser is not None and problem is not None:
                self._drop_browser_leases(browser, reason)
            self.stats["crashes"] += 1
            raise BrowserCrashed(reason) from None

    def _kill_hung(self, browser: Any, reason: str) -> str:
        """Kill ``browser``'s process after a watchdog hang (its disconnect then makes the next start relaunch);
        returns the reason its episodes end with."""
        pid = self._browser_pids.get(browser)
        if pid is None:  # its process was not found at launch: its connection alone decides whether it is reused
            return reason
        self._killed.add(browser)
        _kill_quietly(pid)
        return f"{reason}; it was killed and the next episode gets a new browser"

    def _process_problem(self, browser: Any) -> str | None:
        """Why ``browser``'s processes cannot answer (gone, zombie, stopped), or None if they all run.

        A stopped process is killed here (the pool launched it): a frozen Chromium would otherwise stay
        connected and hang every later call, including the next episode's ``start``. A stopped renderer is
        killed too but is not this call's problem by itself: its pages get Chromium's crash event, which
        ends exactly the episodes that used it (a renderer may serve another env's page).
        """
        if browser in self._killed:
            return "the browser process stopped answering and was killed"
        pid = self._browser_pids.get(browser)
        if pid is None:
            return None
        state = _process_state(pid)
        if state is None or state in "ZX":
            return "the browser process died"
        if state in "Tt":
            _kill_quietly(pid)
            return f"the browser process (pid {pid}) was stopped (SIGSTOP) and did not answer; it was killed"
        for child in _descendants(pid):
            if (_process_state(child) or "") in "Tt" and _process_state(child) is not None:
                _kill_quietly(child)
        return None

    def _is_crash(self, lease: _Lease, exc: BaseException) -> bool:
        if lease.broken:
            return True
        if not lease.browser.is_connected() or lease.page.is_closed():
            return True
        return _names_a_crash(exc)

    async def _answers(self, lease: _Lease) -> bool:
        """Whether ``lease``'s page still runs a trivial script within the action timeout.

        Asked only after a Playwright timeout, to tell a model's mistake (a hidden element: the page answers)
        from a renderer that is gone or frozen without Chromium's crash event, which some hosts deliver late
        or never while a crash dump is written. Any answer, even an error, means the renderer is alive.
        """
        try:
            await asyncio.wait_for(lease.page.evaluate("1"), timeout=self.config.action_timeout_s)
        except asyncio.TimeoutError:
            return False
        except Exception as exc:  # noqa: BLE001 - an error reply (e.g. a navigation under way) is still a reply
            return not self._is_crash(lease, exc)
        return True

    def _crashed(self, lease: _Lease, exc: BaseException) -> BrowserCrashed:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        lease.broken = lease.broken or f"the browser page died ({first_line})"
        self.stats["crashes"] += 1
        return BrowserCrashed(lease.broken)

    # ---- loop-side internals (run on the loop thread only) -------------------------------------------
    async def _ensure_browser(self) -> Any:
        if self._browser_lock is None:
            self._browser_lock = asyncio.Lock()
        async with self._browser_lock:
            if (self._browser is not None and self._browser.is_connected()
                    and self._process_problem(self._browser) is None):
                return self._browser
            if self._browser is not None:  # it died: forget its idle contexts
                self._drop_browser_leases(self._browser, "the browser process died")
                self._browser = None
            for attempt in range(2):
                try:
                    if self._playwright is None:
                        self._playwright = await self._api.async_playwright().start()
                    self._browser = await self._launch()
                    break
                except Exception as exc:
                    logger.warning("launching Chromium failed (attempt %d): %s", attempt + 1, exc)
                    await self._stop_playwright()
                    if attempt:
                        raise BrowserCrashed(f"could not launch Chromium at {self.executable}: {exc}") from exc
            self.stats["launches"] += 1
            browser = self._browser
            browser.on("disconnected", lambda b: self._drop_browser_leases(b, "the browser process died"))
            return browser

    async def _ensure_playwright_and_launch(self) -> Any:
        """A dedicated browser for one lease (``isolation="browser"``)."""
        if self._browser_lock is None:
            self._browser_lock = asyncio.Lock()
        async with self._browser_lock:
            if self._playwright is None:
                self._playwright = await self._api.async_playwright().start()
        try:
            browser = await self._launch()
        except Exception as exc:
            raise BrowserCrashed(f"could not launch Chromium at {self.executable}: {exc}") from exc
        self.stats["launches"] += 1
        browser.on("disconnected", lambda b: self._drop_browser_leases(b, "the browser process died"))
        return browser

    async def _launch(self) -> Any:
        kwargs: dict[str, Any] = {
            "executable_path": self.executable,
            "headless": self.config.headless,
            "handle_sigint": False,
            "handle_sigterm": False,
            "handle_sighup": False,
        }
        if self.config.block_non_loopback:
            # Loopback bypasses proxies implicitly; everything else goes to a port where nothing listens.
            kwargs["proxy"] = {"server": _DEAD_PROXY, "bypass": "127.0.0.1,localhost,[::1]"}
        self._launches_started += 1
        marker = f"{self._marker}.{self._launches_started}"  # this launch's own: no race with another launch
        kwargs["args"] = [*self.config.launch_args, marker]
        self._launching += 1
        try:  # bounded by Playwright's own launch timeout (30 s), not by the watchdog
            browser = await self._playwright.chromium.launch(**kwargs)
        finally:
            self._launching -= 1
        pid = _browser_process(marker)
        if pid is None:  # a Chromium that hides its command line: only the watchdog and the connection watch it
            logger.warning("could not find the process of the Chromium just launched (%s); a stopped (SIGSTOP) browser "
                           "will be noticed only by the %.0f s watchdog", self.executable, self.config.watchdog_s)
        else:
            self._browser_pids[browser] = pid
            self._launched_pids.append(pid)
            singleton = _singleton_dir(pid)
            if singleton is not None:
                self._singleton_dirs[pid] = singleton
            # once it is gone its pid may be reused by an unrelated process, which must never be killed for it
            browser.on("disconnected", self._forget_pid)
        return browser

    def _forget_pid(self, browser: Any) -> None:
        pid = self._browser_pids.pop(browser, None)
        if pid is None:
            return
        if pid in self._launched_pids:
            self._launched_pids.remove(pid)
        singleton = self._singleton_dirs.pop(pid, None)
        if singleton is not None:  # a killed Chromium cannot remove it; one closed normally already has
            shutil.rmtree(singleton, ignore_errors=True)

    async def _stop_playwright(self) -> None:
        if self._playwright is not None:
            try:
                await self._playwright.stop()
            except Exception:
                logger.debug("stopping playwright failed", exc_info=True)
            self._playwright = None

    def _drop_browser_leases(self, browser: Any, reason: str) -> None:
        for lease in list(self._leases):
            if lease.browser is browser and not lease.broken:
                lease.broken = reason
        for key, idle in self._idle.items():
            self._idle[key] = [lease for lease in idle if lease.browser is not browser]

    async def _acquire(self, key: Viewport) -> _Lease:
        idle = self._idle.get(key, [])
        while idle:
            lease = idle.pop()
            if not lease.broken and lease.browser.is_connected() and not lease.page.is_closed():
                self.stats["contexts_reused"] += 1
                return lease
            await self._dispose(lease)
        if self.isolation == "browser":
            browser = await self._ensure_playwright_and_launch()
        else:
            browser = await self._ensure_browser()
        try:
            context = await browser.new_context(
                viewport={"width": key[0], "height": key[1]}, device_scale_factor=1, accept_downloads=False,
                service_workers="block",
            )
            context.set_default_timeout(self.config.action_timeout_s * 1000)
            context.set_default_navigation_timeout(self.config.navigation_timeout_s * 1000)
            page = await context.new_page()
        except Exception as exc:  # the browser died under us: a crash the session retries, not a raw Playwright error
            if not _names_a_crash(exc):
                raise
            self._drop_browser_leases(browser, "the browser process died")
            raise BrowserCrashed(f"the browser died while a page was being opened ({str(exc).splitlines()[0][:200]})") from exc
        lease = _Lease(key=key, context=context, page=page, browser=browser)
        self._leases.add(lease)
        await context.route("**/*", lambda route: self._route(lease, route))
        await context.route_web_socket("**/*", lambda ws: self._route_websocket(lease, ws))
        page.on("crash", lambda _page: self._mark(lease, "the page's renderer process crashed"))
        context.on("page", lambda extra: self._on_new_page(lease, extra))
        self.stats["contexts_created"] += 1
        return lease

    @staticmethod
    def _mark(lease: _Lease, reason: str) -> None:
        lease.broken = lease.broken or reason

    def _on_new_page(self, lease: _Lease, page: Any) -> None:
        if page is not lease.page:
            lease.notices.append("The page tried to open a new window or tab; it was blocked.")
            asyncio.ensure_future(page.close())

    async def _route(self, lease: _Lease, route: Any) -> None:
        request = route.request
        guard = lease.guard
        try:
            if guard is None or not guard.allows(request.url):
                lease.refused.append((request.url, request.is_navigation_request()))
                await route.abort("blockedbyclient")
                return
            if request.is_navigation_request():
                # The router never sees redirect hops, so fetch the response here and check the whole chain.
                response = await route.fetch(max_redirects=0, timeout=self.config.navigation_timeout_s * 1000)
                refused = await self._redirect_refusal(route, request, response, guard)
                if refused is not None:
                    lease.refused.append((refused, True))
                    await route.abort("blockedbyclient")
                    return
                await route.fulfill(response=response)
                return
            await route.continue_()
        except Exception:
            logger.debug("routing %s failed", request.url, exc_info=True)
            try:
                await route.abort("failed")
            except Exception:
                logger.debug("aborting %s failed (the page is gone)", request.url, exc_info=True)

    async def _redirect_refusal(self, route: Any, request: Any, response: Any, guard: UrlGuard) -> str | None:
        """The first refused URL of a redirect chain, or None when every hop stays on allowed origins.

        Chromium follows a fulfilled redirect itself without routing the next hop, so each hop is fetched
        here first (with the browser's method rules: 301/302/303 turn a POST into a GET) and checked. The
        hops are then requested twice (here and by the browser): harmless for the idempotent GETs that
        redirects lead to.
        """
        url, method, status, headers = request.url, request.method, response.status, response.headers
        for _ in range(MAX_REDIRECT_HOPS):
            location = headers.get("location")
            if not (300 <= status < 400 and location):
                return None
            target = urljoin(url, location)
            if not guard.allows(target):
                return target
            if status == 303 or (status in (301, 302) and method == "POST"):
                method = "GET"
            hop = await route.fetch(url=target, method=method, max_redirects=0,
                                    post_data=None if method == "GET" else request.post_data_buffer,
                                    timeout=self.config.navigation_timeout_s * 1000)
            url, status, headers = target, hop.status, hop.headers
        return url  # too many redirects: treat the chain as refused

    async def _route_websocket(self, lease: _Lease, ws: Any) -> None:
        if lease.guard is not None and lease.guard.allows(ws.url.replace("ws", "http", 1)):
            ws.connect_to_server()
        else:
            lease.refused.append((ws.url, False))
            await ws.close()

    async def _clean(self, lease: _Lease) -> None:
        """Make a used context look new: one blank page, no cookies, storage or permissions."""
        for page in list(lease.context.pages):
            if page is not lease.page:
                await page.close()
        page = lease.page
        if lease.guard is not None and lease.guard.allows(page.url):
            await page.evaluate("() => { try { localStorage.clear(); sessionStorage.clear(); } catch (e) {} }")
        lease.guard = None
        await lease.context.clear_cookies()
        await lease.context.clear_permissions()
        await page.goto("about:blank")
        lease.refused.clear()
        lease.notices.clear()

    async def _dispose(self, lease: _Lease) -> None:
        self._leases.discard(lease)
        try:
            await asyncio.wait_for(lease.context.close(), timeout=5)
        except Exception:
            logger.debug("closing a context failed", exc_info=True)
        if self.isolation == "browser":
            try:
                await asyncio.wait_for(lease.browser.close(), timeout=10)
            except Exception:
                logger.debug("closing a per-episode browser failed", exc_info=True)

    async def _release(self, lease: _Lease) -> None:
        if (lease.broken or not lease.browser.is_connected() or lease.episodes >= self.recycle_after
                or self.isolation == "browser"):
            await self._dispose(lease)
            return
        try:  # bounded: a frozen page must not hold the release (and its caller) until the watchdog
            await asyncio.wait_for(self._clean(lease), timeout=self.config.navigation_timeout_s)
        except Exception:  # noqa: BLE001 - a context that cannot be cleaned is not reused
            await self._dispose(lease)
            return
        self._idle.setdefault(lease.key, []).append(lease)

    async def _shutdown(self) -> None:
        for lease in list(self._leases):
            await self._dispose(lease)
        self._idle.clear()
        if self._browser is not None:
            try:
                await asyncio.wait_for(self._browser.close(), timeout=10)
            except Exception:
                logger.debug("closing the browser failed", exc_info=True)
            self._browser = None
        await self._stop_playwright()


@dataclass(frozen=True)
class PageView:
    """What :meth:`BrowserSession.observe` saw: the script's value, the pixels and the accessibility tree.

    Attributes:
        value: What the script returned (None without a script).
        image: The viewport as ``uint8[H, W, 3]`` RGB pixels.
        aria: The page's accessibility tree as YAML without refs, or None when not asked for.
    """

    value: Any
    image: np.ndarray
    aria: str | None = None


class BrowserSession:
    """One env's window into the pool: a leased context, its page and the current episode's URL guard.

    Every method is synchronous and safe to call from any one thread at a time. Model mistakes raise
    :class:`ActionError`; a dead or hung browser raises :class:`BrowserCrashed` (the env's episode ends),
    after which :meth:`start` gets a fresh context (relaunching the browser if it died).
    """

    def __init__(self, pool: BrowserPool, viewport: Viewport) -> None:
        self.pool = pool
        self.viewport = viewport
        self._lease: _Lease | None = None
        self._snapshot = Snapshot("")
        self._home = ""
        self._closed = False

    # ---- episode lifecycle ----------------------------------------------------------------------------
    def start(self, url: str, *, allowed_origins: Sequence[str], cookies: Iterable[dict[str, Any]] = ()) -> None:
        """Begin an episode: a clean context, the guard for ``allowed_origins``, ``cookies`` set, ``url`` open.

        A context whose browser died since the last episode is replaced (and the browser relaunched) here,
        so one crash costs one episode, not the env.
        """
        if self._closed:
            raise BrowserCrashed("this browser session is closed")
        guard = UrlGuard(allowed_origins)
        target = guard.resolve(url)
        if not guard.allows(target):
            raise ValueError(f"start url {url!r} is not inside the allowed origins {list(guard.origins)}.")
        cookie_list = [dict(c) for c in cookies]
        last_error: BrowserCrashed | None = None
        for _attempt in range(3):  # a dead browser, then a hung relaunch, still leave one clean try
            lease = self._lease
            try:
                fresh = self.pool.isolation == "browser" or lease is None or lease.broken
                if fresh or lease.episodes >= self.pool.recycle_after:
                    self._give_back()
                    lease = self._lease = self.pool._run(self.pool._acquire(self.viewport))
                    self.pool._run(self._begin(lease, guard, cookie_list, target, clean=False), lease)
                else:
                    self.pool._run(self._begin(lease, guard, cookie_list, target, clean=True), lease)
                lease.episodes += 1
                self._home = target
                self._snapshot = Snapshot("")
                return
            except BrowserCrashed as exc:
                last_error = exc
                if self._lease is not None:
                    self._lease.broken = self._lease.broken or str(exc)
            except ActionError as exc:  # the env's own start page failed to load: infrastructure
                last_error = BrowserCrashed(f"the start page {target} did not load: {exc}")
                if self._lease is not None:
                    self._lease.broken = str(last_error)
        assert last_error is not None
        raise last_error

    async def _begin(self, lease: _Lease, guard: UrlGuard, cookies: list[dict[str, Any]], url: str,
                     *, clean: bool) -> None:
        try:
            if clean:
                await self.pool._clean(lease)
            lease.guard = guard
            if cookies:
                await lease.context.add_cookies([{**c, "url": c.get("url", guard.home)} for c in cookies])
            await lease.page.goto(url, wait_until="load")
        except self.pool._api.Error as exc:
            if self.pool._is_crash(lease, exc):
                raise self.pool._crashed(lease, exc) from exc
            raise ActionError(str(exc).splitlines()[0]) from exc

    def close(self) -> None:
        """Give the context back to the pool (cleaned for the next user); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._give_back()

    def _give_back(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None or self.pool.closed:
            return
        try:
            self.pool._run(self.pool._release(lease))
        except BrowserCrashed:
            logger.debug("releasing a context failed", exc_info=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- running one action ---------------------------------------------------------------------------
    def _active(self) -> _Lease:
        lease = self._lease
        if lease is None or lease.guard is None:
            raise ActionError("Error: no page is open; the episode has not started (call reset()).")
        if lease.broken:
            raise BrowserCrashed(lease.broken)
        return lease

    def _do(self, action: Callable[[_Lease], Awaitable[T]], *, settle: bool = True) -> T:
        """Run one action on the loop; Playwright errors become ActionError or, for dead pages, BrowserCrashed."""
        lease = self._active()
        api_error = self.pool._api.Error

        async def run() -> T:
            lease.refused.clear()
            try:
                if lease.guard is not None and not lease.guard.allows(lease.page.url):
                    await self._restore(lease)  # a refused navigation's error page that committed after we looked
                result = await action(lease)
                if settle:
                    await self._settle(lease)
                return result
            except ActionError:
                raise
            except api_error as exc:
                if self.pool._is_crash(lease, exc):
                    raise self.pool._crashed(lease, exc) from exc
                if isinstance(exc, self.pool._api.TimeoutError) and not await self.pool._answers(lease):
                    lease.broken = lease.broken or "the page stopped answering (its renderer hung or died)"
                    self.pool.stats["crashes"] += 1
                    raise BrowserCrashed(lease.broken) from exc
                raise ActionError(_playwright_message(exc)) from exc

        return self.pool._run(run(), lease)

    async def _settle(self, lease: _Lease) -> None:
        """Wait for a navigation the action started; undo one the guard refused and tell the model."""
        page = lease.page
        try:
            await page.wait_for_load_state("load", timeout=self.pool.config.navigation_timeout_s * 1000)
        except self.pool._api.Error as exc:
            if self.pool._is_crash(lease, exc):
                raise
        refused = [url for url, navigation in lease.refused if navigation]
        if refused and lease.guard is not None:
            # Chromium commits its "blocked" error page a moment after the abort (longer on a loaded machine); wait
            # for it, then undo it. One that commits later still is undone before the next action.
            for _ in range(75):
                if not lease.guard.allows(page.url):
                    break
                await asyncio.sleep(0.02)
            try:
                await page.wait_for_load_state("load", timeout=self.pool.config.navigation_timeout_s * 1000)
            except self.pool._api.Error as exc:
                if self.pool._is_crash(lease, exc):
                    raise
        if lease.guard is not None and not lease.guard.allows(page.url):
            refused = refused or [page.url]
            await self._restore(lease)
        if refused:
            reason = lease.guard.refusal(refused[0]) if lease.guard is not None else None
            raise ActionError(f"Error: navigation refused: {reason or refused[0]}. You are still on "
                              f"{_path_of(lease.page.url)}.")

    async def _restore(self, lease: _Lease) -> None:
        page = lease.page
        try:
            await page.go_back(wait_until="load")
        except self.pool._api.Error:
            pass
        if lease.guard is not None and not lease.guard.allows(page.url):
            await page.goto(self._home, wait_until="load")

    def notices(self) -> list[str]:
        """Things the page did on its own since the last call (blocked pop-ups); cleared when read."""
        lease = self._lease
        if lease is None:
            return []
        notes, lease.notices[:] = list(lease.notices), []
        return notes

    # ---- reading the page ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        lease = self._active()
        return lease.page.url

    def title(self) -> str:
        return self._do(lambda lease: lease.page.title(), settle=False)

    def snapshot(self) -> Snapshot:
        """The page's accessibility snapshot with stable refs; later ref actions resolve against it."""

        async def take(lease: _Lease) -> Snapshot:
            raw = await lease.page.aria_snapshot(mode="ai", timeout=self.pool.config.navigation_timeout_s * 1000)
            return normalize_refs(raw)

        self._snapshot = self._do(take, settle=False)
        return self._snapshot

    def aria_text(self) -> str:
        """The page's accessibility tree as YAML without refs (for GUI envs' optional text)."""
        return self._do(lambda lease: lease.page.aria_snapshot(timeout=self.pool.config.navigation_timeout_s * 1000),
                        settle=False)

    def screenshot(self, *, clip: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """The viewport (or ``clip`` = x, y, width, height) as ``uint8[H, W, 3]`` RGB pixels."""

        async def shoot(lease: _Lease) -> bytes:
            kwargs: dict[str, Any] = {"type": "png", "animations": "disabled", "caret": "hide"}
            if clip is not None:
                x, y, w, h = clip
                kwargs["clip"] = {"x": x, "y": y, "width": w, "height": h}
            return await lease.page.screenshot(**kwargs)

        return decode_png(self._do(shoot, settle=False))

    def observe(self, script: str | None = None, arg: Any = None, *, aria: bool = False) -> PageView:
        """Everything an env shows after an action, in one call to the browser's thread: the value of
        ``script`` (run with ``arg``), the viewport's pixels and, with ``aria``, the accessibility tree.

        The three are asked for at once (they only read the page), and the pixels come from one CDP
        ``Page.captureScreenshot`` instead of Playwright's ``page.screenshot``, which stills the page with
        several extra round trips per shot. Add :data:`STILL_CSS` to the page once if the pixels must be
        reproducible (a caret blinks, animations run). Measured in ``benchmarks/browser.py``.
        """

        async def look(lease: _Lease) -> tuple[Any, bytes, str | None]:
            if lease.cdp is None:
                lease.cdp = await lease.context.new_cdp_session(lease.page)
            jobs: list[Awaitable[Any]] = [lease.cdp.send("Page.captureScreenshot", _CAPTURE)]
            if script is not None:
                jobs.append(lease.page.evaluate(script, arg))
            if aria:
                jobs.append(lease.page.aria_snapshot(timeout=self.pool.config.navigation_timeout_s * 1000))
            results = await asyncio.gather(*jobs, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            shot = results[0]
            value = results[1] if script is not None else None
            tree = results[-1] if aria else None
            return value, base64.b64decode(shot["data"]), tree

        value, png, tree = self._do(look, settle=False)
        return PageView(value, decode_png(png), tree)

    def evaluate(self, expression: str, arg: Any = None) -> Any:
        """Run JavaScript in the page (for envs reading task state, never for model text)."""
        return self._do(lambda lease: lease.page.evaluate(expression, arg), settle=False)

    # ---- web actions (by ref) ---------------------------------------------------------------------------------
    def _locator(self, lease: _Lease, ref: object, *, roles: tuple[str, ...] = (), action: str = "") -> Any:
        shown = self._snapshot.require(ref, roles=roles, action=action)
        return lease.page.locator(f"aria-ref={self._snapshot.refs[shown]}")

    def click(self, ref: str) -> None:
        """Click the element ``ref`` (links navigate, buttons submit their form)."""

        async def act(lease: _Lease) -> None:
            await self._locator(lease, ref).click()

        self._do(act)

    def type(self, ref: str, text: str, *, submit: bool = False) -> None:
        """Replace the text of the text field ``ref`` with ``text``; ``submit`` presses Enter after it."""

        async def act(lease: _Lease) -> None:
            locator = self._locator(lease, ref, roles=TEXT_ROLES, action="type")
            await locator.fill(text)
            if submit:
                await locator.press("Enter")

        self._do(act)

    def select(self, ref: str, option: str) -> None:
        """Choose ``option`` (its visible label, or its value) in the drop-down ``ref``."""

        async def act(lease: _Lease) -> None:
            locator = self._locator(lease, ref, roles=SELECT_ROLES, action="select")
            options: list[list[str]] = await locator.evaluate(
                "e => Array.from(e.options || []).map(o => [o.label, o.value])")
            label = match_option(option, [(label, value) for label, value in options], ref)
            await locator.select_option(label=label)

        self._do(act)

    def scroll(self, direction: str) -> None:
        """Scroll the page by most of a screen ``up``, ``down``, ``left`` or ``right``."""
        steps = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
        if direction not in steps:
            raise ActionError(f"Error: scroll direction must be one of {', '.join(steps)}, got "
                              f"{str(direction)[:40]!r}.")
        dx, dy = steps[direction]
        width, height = self.viewport

        async def act(lease: _Lease) -> None:
            delta = [dx * int(width * 0.8), dy * int(height * 0.8)]
            await lease.page.evaluate("([x, y]) => window.scrollBy(x, y)", delta)

        self._do(act)

    def goto(self, url: str) -> None:
        """Open ``url`` (absolute, or a path such as ``/cart``) if the guard allows it."""
        lease = self._active()
        guard = lease.guard
        assert guard is not None
        if not isinstance(url, str) or not url.strip():
            raise ActionError("Error: goto needs a URL such as '/' or a full http://127.0.0.1:PORT/... address.")
        target = guard.resolve(url, lease.page.url)
        refusal = guard.refusal(target)
        if refusal:
            raise ActionError(f"Error: navigation refused: {refusal}.")

        async def act(lease: _Lease) -> None:
            await lease.page.goto(target, wait_until="load")

        self._do(act)

    def back(self) -> None:
        """Go back one page in this episode's history."""

        async def act(lease: _Lease) -> None:
            page = lease.page
            await page.go_back(wait_until="load")
            if lease.guard is not None and not lease.guard.allows(page.url):
                await page.go_forward(wait_until="load")
                raise ActionError("Error: there is no previous page to go back to.")

        self._do(act)

    # ---- GUI actions (by pixel) ---------------------------------------------------------------------------------
    def mouse_click(self, x: float, y: float) -> None:
        self._do(lambda lease: lease.page.mouse.click(x, y))

    def keyboard_type(self, text: str) -> None:
        self._do(lambda lease: lease.page.keyboard.type(text))

    def press(self, key: str) -> None:
        self._do(lambda lease: lease.page.keyboard.press(key))

    def wheel(self, x: float, y: float, dy: float) -> None:
        async def act(lease: _Lease) -> None:
            await lease.page.mouse.move(x, y)
            await lease.page.mouse.wheel(0, dy)

        self._do(act)

    def drag(self, x1: float, y1: float, x2: float, y2: float) -> None:
        async def act(lease: _Lease) -> None:
            mouse = lease.page.mouse
            await mouse.move(x1, y1)
            await mouse.down()
            await mouse.move(x2, y2, steps=8)
            await mouse.up()

        self._do(act)


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...); empty if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split()  # the name, in parentheses, may itself hold spaces and ')'


def _process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (R, S, T, Z, ...), or None if it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _singleton_dir(pid: int) -> str | None:
    """The temp directory holding Chromium ``pid``'s profile lock socket, or None if it has none we can tell.

    Chromium makes one (``$TMPDIR/org.chromium.Chromium.XXXXXX``) per browser and removes it when it exits normally;
    a browser the pool kills (stopped, hung, or killed by a test) leaves it behind, one per kill, for the life of the
    machine. Found through the profile's ``SingletonSocket`` link, and only a directory of that name is returned.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().decode(errors="replace").split("\x00")
        profile = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--user-data-dir="))
        target = os.readlink(os.path.join(profile, "SingletonSocket"))
    except (OSError, StopIteration):
        return None
    directory, name = os.path.split(target)
    if name != "SingletonSocket" or not os.path.basename(directory).startswith("org.chromium.Chromium."):
        return None
    return directory


def _browser_process(marker: str) -> int | None:
    """The pid of the Chromium browser process whose command line carries ``marker``, or None if none does.

    Chromium's zygotes, renderers and GPU process say ``--type=...``; but a child the browser has forked and not yet
    exec'd (a utility process starting) still shows the browser's own command line, so among the matches the browser
    is the one whose parent is not itself a match.
    """
    wanted = marker.encode()
    matches: dict[int, int] = {}  # pid -> parent pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\x00")
        except OSError:
            continue
        if wanted not in argv or any(arg.startswith(b"--type=") for arg in argv):
            continue
        fields = _stat_fields(int(entry))
        if len(fields) > 1:  # else it has just exited
            matches[int(entry)] = int(fields[1])
    roots = [pid for pid, parent in matches.items() if parent not in matches]
    return roots[0] if len(roots) == 1 else None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Chromium's zygotes, renderers, GPU and utility processes)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as fh:
                    children = [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            todo.extend(children)
    return found


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _path_of(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _playwright_message(exc: BaseException) -> str:
    """A short, model-readable version of a Playwright error (its call log is noise to a model)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = lines[0] if lines else type(exc).__name__
    for prefix in ("Locator.", "Page.", "Mouse.", "Keyboard."):
        if head.startswith(prefix):
            head = head.split(":", 1)[-1].strip()
    if "Timeout" in head and "exceeded" in head:
        return ("Error: the element could not be acted on in time (it may be hidden, disabled or gone). Take "
                "a fresh look at the page and use a ref from the latest snapshot.")
    if "not an <input>" in head or "Element is not" in head:
        return f"Error: {head} Use type() on text fields and select() on drop-down lists."
    return f"Error: {head[:300]}"


def decode_png(data: bytes) -> np.ndarray:
    """PNG bytes -> ``uint8[H, W, 3]`` RGB (Pillow, which Playwright's screenshots need anyway)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()


_DEFAULT_POOLS: dict[BrowserConfig, BrowserPool] = {}
_DEFAULT_LOCK = threading.Lock()


def default_pool(config: BrowserConfig | None = None) -> BrowserPool:
    """The process-wide pool for ``config``: envs share one browser and reuse each other's contexts."""
    config = config or BrowserConfig()
    with _DEFAULT_LOCK:
        pool = _DEFAULT_POOLS.get(config)
        if pool is None or pool.closed or pool._pid != os.getpid():  # a forked child needs its own loop thread
            pool = _DEFAULT_POOLS[config] = BrowserPool(config)
        return pool


@atexit.register
def _close_default_pools() -> None:
    for pool in list(_DEFAULT_POOLS.values()):
        pool.close()


def resolve_pool(browser: Any = None) -> BrowserPool:
    """The pool an env should use for its ``browser`` argument: a pool, a config, a dict of config, or None."""
    from collections.abc import Mapping

    from agentgym.errors import ConfigError

    if isinstance(browser, BrowserPool):
        return browser
    if isinstance(browser, BrowserConfig):
        return default_pool(browser)
    if browser is None or isinstance(browser, Mapping):
        try:
            return default_pool(BrowserConfig(**dict(browser or {})))
        except TypeError as exc:
            raise ConfigError(f"Unknown browser option in {dict(browser or {})!r}: {exc}. See BrowserConfig's "
                              "fields (executable_path, launch_args, headless, action_timeout_s, ...).") from None
    raise ConfigError(f"browser must be a dict of BrowserConfig options, a BrowserConfig or a BrowserPool, got "
                      f"{type(browser).__name__}.")
