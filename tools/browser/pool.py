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
import concurrent.futures
import logging
import os
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeVar
from urllib.parse import urljoin

from agentgym.tools.browser.chromium_processes import browser_process, kill_quietly, singleton_dir
from agentgym.tools.browser.config import BrowserConfig, find_chromium
from agentgym.tools.browser.errors import BrowserCrashed
from agentgym.tools.browser.guard import UrlGuard
from agentgym.tools.browser.loop_thread import LoopThread
from agentgym.tools.browser.page_session import STILL_CSS, BrowserSession, PageView

from agentgym.errors import DependencyNotInstalled
from agentgym.utils import procfs
from agentgym.utils.singletons import ProcessSingletons

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


def _import_playwright() -> Any:
    try:
        from playwright import async_api
    except ImportError as exc:
        raise DependencyNotInstalled("playwright", "web", "browser environments") from exc
    return async_api


@dataclass(eq=False)
class Lease:
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
        self._loop = LoopThread()
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
        self._idle: dict[Viewport, list[Lease]] = {}
        self._leases: set[Lease] = set()
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
            if (procfs.state(pid) or "Z") not in "ZX":
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

    def _run(self, coro: Awaitable[T], lease: Lease | None = None) -> T:
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
        kill_quietly(pid)
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
        state = procfs.state(pid)
        if state is None or state in "ZX":
            return "the browser process died"
        if state in "Tt":
            kill_quietly(pid)
            return f"the browser process (pid {pid}) was stopped (SIGSTOP) and did not answer; it was killed"
        for child in procfs.descendants(pid) - {pid}:
            if procfs.state(child) in ("T", "t"):
                kill_quietly(child)
        return None

    def _is_crash(self, lease: Lease, exc: BaseException) -> bool:
        if lease.broken:
            return True
        if not lease.browser.is_connected() or lease.page.is_closed():
            return True
        return _names_a_crash(exc)

    async def _answers(self, lease: Lease) -> bool:
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

    def _crashed(self, lease: Lease, exc: BaseException) -> BrowserCrashed:
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
        pid = browser_process(marker)
        if pid is None:  # a Chromium that hides its command line: only the watchdog and the connection watch it
            logger.warning("could not find the process of the Chromium just launched (%s); a stopped (SIGSTOP) browser "
                           "will be noticed only by the %.0f s watchdog", self.executable, self.config.watchdog_s)
        else:
            self._browser_pids[browser] = pid
            self._launched_pids.append(pid)
            singleton = singleton_dir(pid)
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

    async def _acquire(self, key: Viewport) -> Lease:
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
        lease = Lease(key=key, context=context, page=page, browser=browser)
        self._leases.add(lease)
        await context.route("**/*", lambda route: self._route(lease, route))
        await context.route_web_socket("**/*", lambda ws: self._route_websocket(lease, ws))
        page.on("crash", lambda _page: self._mark(lease, "the page's renderer process crashed"))
        context.on("page", lambda extra: self._on_new_page(lease, extra))
        self.stats["contexts_created"] += 1
        return lease

    @staticmethod
    def _mark(lease: Lease, reason: str) -> None:
        lease.broken = lease.broken or reason

    def _on_new_page(self, lease: Lease, page: Any) -> None:
        if page is not lease.page:
            lease.notices.append("The page tried to open a new window or tab; it was blocked.")
            asyncio.ensure_future(page.close())

    async def _route(self, lease: Lease, route: Any) -> None:
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

    async def _route_websocket(self, lease: Lease, ws: Any) -> None:
        if lease.guard is not None and lease.guard.allows(ws.url.replace("ws", "http", 1)):
            ws.connect_to_server()
        else:
            lease.refused.append((ws.url, False))
            await ws.close()

    async def _clean(self, lease: Lease) -> None:
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

    async def _dispose(self, lease: Lease) -> None:
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

    async def _release(self, lease: Lease) -> None:
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


#: The process-wide pools, one per config; a forked child makes its own (the loop thread and the browser stay
#: with the parent).
_DEFAULT_POOLS: ProcessSingletons[BrowserConfig, BrowserPool] = ProcessSingletons(
    BrowserPool, reusable=lambda pool: not pool.closed and pool._pid == os.getpid())


def default_pool(config: BrowserConfig | None = None) -> BrowserPool:
    """The process-wide pool for ``config``: envs share one browser and reuse each other's contexts."""
    return _DEFAULT_POOLS.get(config or BrowserConfig())


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


# Names this module held before its parts moved to their own modules.
_browser_process = browser_process
_singleton_dir = singleton_dir


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Chromium's zygotes, renderers, GPU and utility processes)."""
    return sorted(procfs.descendants(pid) - {pid})
