"""One env's window into the browser pool: a leased context and its page, driven by web and GUI actions.

A :class:`BrowserSession` turns each action into a coroutine on the pool's event loop and back into a result or
an error a model can read: a model's mistake (a hidden element, a refused URL) raises :class:`ActionError`, a
dead or hung browser :class:`BrowserCrashed`. Navigation the page starts by itself is checked against the
episode's :class:`UrlGuard` after every action and undone when refused.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypeVar

import numpy as np
from agentgym.tools.browser.errors import ActionError, BrowserCrashed
from agentgym.tools.browser.guard import UrlGuard
from agentgym.tools.browser.snapshot import (
    SELECT_ROLES,
    TEXT_ROLES,
    Snapshot,
    match_option,
    normalize_refs,
)
from agentgym.utils.images import decode_png

if TYPE_CHECKING:
    from agentgym.tools.browser.pool import BrowserPool, Lease, Viewport

__all__ = ["STILL_CSS", "BrowserSession", "PageView"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A style that keeps a page's pixels still between two looks: no blinking caret, no CSS animation or
#: transition mid-way. :meth:`BrowserSession.observe` captures pixels as they are (one CDP call, no per-shot
#: stilling as ``page.screenshot(animations="disabled", caret="hide")`` does with its extra round trips), so an
#: env that hashes or compares screenshots adds this style once per page.
STILL_CSS = ("*, *::before, *::after { caret-color: transparent !important; animation: none !important; "
             "transition: none !important; }")
#: ``Page.captureScreenshot`` parameters: lossless PNG, fast zlib level, the viewport only.
_CAPTURE = {"format": "png", "optimizeForSpeed": True, "captureBeyondViewport": False}


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
        self._lease: Lease | None = None
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

    async def _begin(self, lease: Lease, guard: UrlGuard, cookies: list[dict[str, Any]], url: str,
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
    def _active(self) -> Lease:
        lease = self._lease
        if lease is None or lease.guard is None:
            raise ActionError("Error: no page is open; the episode has not started (call reset()).")
        if lease.broken:
            raise BrowserCrashed(lease.broken)
        return lease

    def _do(self, action: Callable[[Lease], Awaitable[T]], *, settle: bool = True) -> T:
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

    async def _settle(self, lease: Lease) -> None:
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

    async def _restore(self, lease: Lease) -> None:
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

        async def take(lease: Lease) -> Snapshot:
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

        async def shoot(lease: Lease) -> bytes:
            kwargs: dict[str, Any] = {"type": "png", "animations": "disabled", "caret": "hide"}
            if clip is not None:
                x, y, w, h = clip
                kwargs["clip"] = {"x": x, "y": y, "width": w, "height": h}
            return await lease.page.screenshot(**kwargs)

        return decode_png(self._do(shoot, settle=False), rgb=True)

    def observe(self, script: str | None = None, arg: Any = None, *, aria: bool = False) -> PageView:
        """Everything an env shows after an action, in one call to the browser's thread: the value of
        ``script`` (run with ``arg``), the viewport's pixels and, with ``aria``, the accessibility tree.

        The three are asked for at once (they only read the page), and the pixels come from one CDP
        ``Page.captureScreenshot`` instead of Playwright's ``page.screenshot``, which stills the page with
        several extra round trips per shot. Add :data:`STILL_CSS` to the page once if the pixels must be
        reproducible (a caret blinks, animations run). Measured in ``benchmarks/browser.py``.
        """

        async def look(lease: Lease) -> tuple[Any, bytes, str | None]:
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
        return PageView(value, decode_png(png, rgb=True), tree)

    def evaluate(self, expression: str, arg: Any = None) -> Any:
        """Run JavaScript in the page (for envs reading task state, never for model text)."""
        return self._do(lambda lease: lease.page.evaluate(expression, arg), settle=False)

    # ---- web actions (by ref) ---------------------------------------------------------------------------------
    def _locator(self, lease: Lease, ref: object, *, roles: tuple[str, ...] = (), action: str = "") -> Any:
        shown = self._snapshot.require(ref, roles=roles, action=action)
        return lease.page.locator(f"aria-ref={self._snapshot.refs[shown]}")

    def click(self, ref: str) -> None:
        """Click the element ``ref`` (links navigate, buttons submit their form)."""

        async def act(lease: Lease) -> None:
            await self._locator(lease, ref).click()

        self._do(act)

    def type(self, ref: str, text: str, *, submit: bool = False) -> None:
        """Replace the text of the text field ``ref`` with ``text``; ``submit`` presses Enter after it."""

        async def act(lease: Lease) -> None:
            locator = self._locator(lease, ref, roles=TEXT_ROLES, action="type")
            await locator.fill(text)
            if submit:
                await locator.press("Enter")

        self._do(act)

    def select(self, ref: str, option: str) -> None:
        """Choose ``option`` (its visible label, or its value) in the drop-down ``ref``."""

        async def act(lease: Lease) -> None:
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

        async def act(lease: Lease) -> None:
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

        async def act(lease: Lease) -> None:
            await lease.page.goto(target, wait_until="load")

        self._do(act)

    def back(self) -> None:
        """Go back one page in this episode's history."""

        async def act(lease: Lease) -> None:
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
        async def act(lease: Lease) -> None:
            await lease.page.mouse.move(x, y)
            await lease.page.mouse.wheel(0, dy)

        self._do(act)

    def drag(self, x1: float, y1: float, x2: float, y2: float) -> None:
        async def act(lease: Lease) -> None:
            mouse = lease.page.mouse
            await mouse.move(x1, y1)
            await mouse.down()
            await mouse.move(x2, y2, steps=8)
            await mouse.up()

        self._do(act)


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

