"""WebShop-v1 (real Chromium) and WebShop-text-v1 (in-process text browser): buy what the instruction asks.

Both envs run the same shop app, the same tools, the same reference solver and the same reward; they differ
only in the browser. ``WebShop-v1`` drives the system Chromium through the shared :class:`BrowserPool`
(the app is served on 127.0.0.1 by a background HTTP server); ``WebShop-text-v1`` renders the very same
pages with :class:`TextBrowser` in a few milliseconds, for RL on many episodes. Observations are the page's
accessibility snapshot in Playwright's format in both, so a policy trained on one runs on the other.

An episode ends when the agent places an order (reward: WebShop's attribute/option/price/type score of
the order on the server; success: a full match), calls ``answer`` (giving up), or runs out of turns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from agentgym.envs.web.app import SESSION_COOKIE, ShopApp
from agentgym.envs.web.goals import Goal, generate_tasks
from agentgym.envs.web.reward import check_protocol
from agentgym.tools.browser.errors import ActionError
from agentgym.tools.browser.snapshot import Snapshot, truncate_snapshot

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import AgentGymError, ConfigError
from agentgym.parsers import (
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    ToolCallParser,
)
from agentgym.suite import Task
from agentgym.toolset import ToolCall, ToolResult, ToolSet, tool

__all__ = ["ShopBrowser", "WebShopEnv", "WebShopTextEnv", "shop_solver"]

TOOL_NAMES = ("click", "type", "select", "scroll", "goto", "back", "answer")
TEXT_ORIGIN = "http://127.0.0.1:8000"  # the text browser's virtual origin (no server listens there)
_URL_LINE = re.compile(r"^URL: (\S+)", re.MULTILINE)


class ShopBrowser(Protocol):
    """What the shop env needs from a browser; :class:`BrowserSession` and :class:`TextBrowser` both fit."""

    @property
    def url(self) -> str: ...

    def start(self, url: str, *, allowed_origins: Sequence[str], cookies: Iterable[dict[str, Any]] = ()) -> None: ...

    def snapshot(self) -> Snapshot: ...

    def click(self, ref: str) -> None: ...

    def type(self, ref: str, text: str, *, submit: bool = False) -> None: ...

    def select(self, ref: str, option: str) -> None: ...

    def scroll(self, direction: str) -> None: ...

    def goto(self, url: str) -> None: ...

    def back(self) -> None: ...

    def notices(self) -> list[str]: ...

    def close(self) -> None: ...


class _ShopEnv(AgentEnv):
    """Tools, observations, reward and solver shared by the browser and the text shop."""

    native_format_hint: ClassVar[str] = (
        'You may also write actions as function calls, one or more per reply, e.g. click("e12"), '
        'type("e5", "organic milk"), select("e20", "6-pack"), scroll("down"), goto("/cart"), back() or '
        'answer("done").'
    )
    _browser: ShopBrowser

    def __init__(self, *, max_turns: int, tasks: Sequence[Task] | None, max_snapshot_chars: int,
                 max_action_chars: int, render_mode: str | None, protocol: str = "strict") -> None:
        if not isinstance(max_snapshot_chars, int) or max_snapshot_chars < 500:
            raise ConfigError(f"max_snapshot_chars must be an integer >= 500, got {max_snapshot_chars!r}.")
        self.protocol = check_protocol(protocol)
        self.max_snapshot_chars = max_snapshot_chars
        self._token = ""
        self._goal: Goal | None = None
        self._orders_seen = 0
        self._page_key = ""  # the latest page as state_key() reports it (set whenever the page is read)
        self._app: ShopApp = self._make_app()
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=4,
                         render_mode=render_mode)

    def _make_app(self) -> ShopApp:
        raise NotImplementedError

    def _origin(self) -> str:
        raise NotImplementedError

    # ---- tools --------------------------------------------------------------------------------------------
    def _act(self, action: Any, *args: Any, **kwargs: Any) -> ToolResult:
        try:
            action(*args, **kwargs)
        except ActionError as exc:
            return ToolResult.error(str(exc))
        self._check_order()
        return ToolResult("")

    @tool
    def click(self, ref: str) -> ToolResult:
        """Click an element of the page: a link, a button, a text field.

        Args:
            ref: The element's ref from the page snapshot, e.g. "e12".
        """
        return self._act(self._browser.click, ref)

    @tool(name="type")
    def type_text(self, ref: str, text: str, submit: bool = False) -> ToolResult:
        """Replace the text in a text field.

        Args:
            ref: The text field's ref, e.g. "e5".
            text: What to type.
            submit: Press Enter afterwards (submits the field's form).
        """
        from agentgym.tools.browser.actions import check_text

        try:
            text = check_text(text)
        except ActionError as exc:
            return ToolResult.error(str(exc))
        return self._act(self._browser.type, ref, text, submit=submit)

    @tool
    def select(self, ref: str, option: str) -> ToolResult:
        """Choose an option of a drop-down list.

        Args:
            ref: The drop-down's ref (a combobox), e.g. "e20".
            option: The option's text as shown, e.g. "6-pack".
        """
        return self._act(self._browser.select, ref, option)

    @tool
    def scroll(self, direction: Literal["up", "down", "left", "right"]) -> ToolResult:
        """Scroll the page (the snapshot always shows the whole page, so this is rarely needed).

        Args:
            direction: up, down, left or right.
        """
        return self._act(self._browser.scroll, direction)

    @tool
    def goto(self, url: str) -> ToolResult:
        """Open a page of this shop by path, e.g. "/" or "/cart" (other sites are refused).

        Args:
            url: A path such as "/cart", or a full URL of this shop.
        """
        return self._act(self._browser.goto, url)

    @tool
    def back(self) -> ToolResult:
        """Go back to the previous page."""
        return self._act(self._browser.back)

    @tool
    def answer(self, text: str) -> ToolResult:
        """Stop shopping and end the episode (only an order placed before counts).

        Args:
            text: A short final note, e.g. "done" or why you stopped.
        """
        self.mark_answer()
        score = self._best_score()
        self.finish(success=score >= 1.0 - 1e-9, score=score, reason="answered")
        return ToolResult(f"Episode ended: {str(text)[:200]}")

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.click, self.type_text, self.select, self.scroll, self.goto, self.back, self.answer])

    def _build_parser(self) -> ToolCallParser:
        raw = {"goto": "url", "scroll": "direction", "answer": "text"}
        return CompositeParser([HermesParser(), FunctionCallParser(TOOL_NAMES, raw)])

    # ---- reward -------------------------------------------------------------------------------------------
    def _check_order(self) -> None:
        """End the episode when the server has a new order; its WebShop score is the reward."""
        session = self._app.session(self._token)
        if session is None or self._goal is None or len(session.orders) <= self._orders_seen or self._finished:
            return
        self._orders_seen = len(session.orders)
        score, _ = self._app.score_order(session.orders[-1], self._goal, self.protocol)
        success = score >= 1.0 - 1e-9
        self.add_reward("purchase", score)
        self.finish(success=success, score=score, reason="solved" if success else "failed")

    def _best_score(self) -> float:
        session = self._app.session(self._token)
        if session is None or self._goal is None or not session.orders:
            return 0.0
        return max(self._app.score_order(order, self._goal, self.protocol)[0] for order in session.orders)

    # ---- observations ---------------------------------------------------------------------------------------
    def _page_text(self) -> str:
        url = self._browser.url
        path = url.split("://", 1)[-1]
        path = path[path.find("/"):] if "/" in path else "/"
        snapshot = self._browser.snapshot().text
        # Focus is not state (every action names its element), so the key drops the [active] marker.
        self._page_key = f"URL: {path}\n" + snapshot.replace(" [active]", "")
        return f"URL: {path}\n{truncate_snapshot(snapshot, self.max_snapshot_chars)}"

    def state_key(self) -> str:
        """The page: its URL (path and query) and its whole accessibility snapshot, which holds the form values
        (typed text, chosen options) and the cart count, without the action's messages or the focus marker.
        Reaching the same product page by a link or by ``goto`` is the same state. It is recorded when the page is
        read for the observation, so asking for it costs no browser call."""
        if self._finished:
            return f"orders placed: {self._orders_seen}"
        return self._page_key

    def _format_results(self, results: Sequence[tuple[ToolCall, ToolResult]], notes: Sequence[str]) -> str:
        lines = [r.content for _, r in results if r.content]
        return "\n".join(lines + list(notes) + self._browser.notices())

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        observation, kind = super()._run_action(action, turn_info)
        if self._finished:
            note = "The order was placed; the episode is over." if self._orders_seen else ""
            return "\n".join(x for x in (observation, note) if x), kind
        page = self._page_text()
        return (f"{observation}\n{page}" if observation else page), kind

    # ---- episodes ---------------------------------------------------------------------------------------------
    def _sample_task(self, rng: np.random.Generator) -> Task:
        import random

        # The generator takes random.Random (suites are reproducible without numpy); seed it from the env's RNG.
        return generate_tasks(random.Random(int(rng.integers(0, 2**63 - 1))), 1, holdout="exclude")[0]

    def _begin_episode(self, task: Task) -> str:
        goal = Goal.from_task(task)
        if self._token:
            self._app.end_session(self._token)
        self._token = self._app.new_session(goal)
        self._goal = goal
        self._orders_seen = 0
        self._browser.start("/", allowed_origins=[self._origin()],
                            cookies=[{"name": SESSION_COOKIE, "value": self._token}])
        return self._page_text()

    def _task_instructions(self) -> str:
        return (
            "You are shopping in an online grocery store. The instruction at the top of every page says what to "
            "buy: a product with some features, options (size, pack, flavour or scent) and a price limit. Each "
            "observation shows the page URL and an accessibility snapshot of the page; every element you can act "
            "on has a ref such as [ref=e12]. Search for the product, open it, pick the options, add it to the "
            "cart, go to checkout and place the order. Placing the order ends the episode and is scored by how "
            "well the order matches the instruction (1.0 = every feature, option and the price limit met). Only "
            f"this shop's pages can be visited. You have {self.max_turns} turns."
        )

    def reference_solver(self) -> ReferenceSolver:
        if self._goal is None:
            raise AgentGymError("reset() the env before asking for its reference solver.")
        return shop_solver(self._goal)

    def close(self) -> None:
        if not self._closed:
            if self._token:
                self._app.end_session(self._token)
                self._token = ""
            self._browser.close()
        super().close()


def _find(lines: list[str], pattern: str) -> str | None:
    regex = re.compile(pattern)
    for line in lines:
        if regex.search(line):
            found = re.search(r"\[ref=([^\]]+)\]", line)
            if found:
                return found.group(1)
    return None


def _call(name: str, *args: object) -> str:
    return f"{name}({', '.join(json.dumps(a, ensure_ascii=False) for a in args)})"


def shop_solver(goal: Goal) -> ReferenceSolver:
    """Shop like a careful person: search the product, open it, set each option, add, check out, order.

    It reads only the observation (the URL line and the snapshot's refs) plus the goal, so it proves the
    task solvable through the UI in either browser.
    """
    state = {"typed": False}

    def solve(observation: Any) -> str:
        text = observation["text"] if isinstance(observation, Mapping) else str(observation)
        match = _URL_LINE.search(text)
        path = match.group(1) if match else "/"
        lines = text.splitlines()
        route = path.split("?", 1)[0]
        if route in ("/", "/search"):
            for index, line in enumerate(lines):
                if re.search(rf"- /url: \"?/product/{goal.product_id}\?", line) and index > 0:
                    ref = _find([lines[index - 1]], r"link ")
                    if ref:
                        return _call("click", ref)
            if route == "/":
                if not state["typed"]:
                    state["typed"] = True
                    return _call("type", _find(lines, r'textbox "Search products"') or "e0", goal.query)
                state["typed"] = False
                return _call("click", _find(lines, r'button "Search"') or "e0")
            next_page = _find(lines, r'link "Next page"')
            return _call("click", next_page) if next_page else _call("goto", "/")
        if route == f"/product/{goal.product_id}":
            for kind, wanted in goal.options.items():
                start = next((i for i, line in enumerate(lines) if f'combobox "{kind.capitalize()}"' in line), None)
                if start is None:
                    continue
                selected = next((line for line in lines[start + 1:start + 12] if "[selected]" in line), "")
                if f'option "{wanted}"' not in selected:
                    return _call("select", _find([lines[start]], "combobox") or "e0", wanted)
            return _call("click", _find(lines, r'button "Add to cart"') or "e0")
        if route == "/cart":
            return _call("click", _find(lines, r'link "Proceed to checkout"') or "e0")
        if route == "/checkout":
            return _call("click", _find(lines, r'button "Place order"') or "e0")
        return _call("goto", "/")

    return solve


class WebShopTextEnv(_ShopEnv):
    """The WebShop grocery shop without a browser: the same pages rendered in-process as accessibility snapshots.

    ## Description

    Buy what a WebShop-style instruction asks ("a 6-pack of sparkling water under $20") in a local grocery shop.
    This env renders the shop's pages in-process with `TextBrowser` in a few milliseconds, for RL on many episodes;
    `agentgym/WebShop-v1` runs the same shop app, tools, reference solver and reward in a real Chromium.
    Observations are the page's accessibility snapshot in Playwright's format in both, so a policy trained on one
    runs on the other. Without `tasks`, a goal is generated from the reset seed.

    ## Tools

    - `click(ref)`: click an element of the page (a link, a button, a text field) by its snapshot ref, e.g. `e12`.
    - `type(ref, text, submit)`: replace the text in a text field; `submit=True` presses Enter afterwards.
    - `select(ref, option)`: choose an option of a drop-down list by its text.
    - `scroll(direction)`: scroll the page up, down, left or right (rarely needed: the snapshot shows the whole
      page).
    - `goto(url)`: open a page of this shop by path, e.g. `/` or `/cart` (other sites are refused).
    - `back()`: go back to the previous page.
    - `answer(text)`: stop shopping and end the episode (only an order placed before counts).

    ## Reward

    WebShop's score of the order (Yao et al., 2022), computed on the server: `r_type * (matched attributes + matched
    options + [price <= limit]) / (goal attributes + goal options + 1)`, where `r_type` checks the product is the
    right kind and only options the agent chose count; an order of several items is divided by their number. Paid
    when the order is placed (component `purchase`); success means a full match (score 1). An episode with no order
    scores 0. The default `protocol="strict"` matches options and attributes exactly; `protocol="upstream"` uses
    WebShop's own `get_reward` rules (fuzzy option match, title fallback), which also credit some wrong choices
    ("1-pack" for "12-pack"): use it for numbers next to published WebShop results.

    ## Episode end

    Terminated when an order is placed or by `answer`; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation.
    - `tasks`: tasks to draw from (e.g. a suite's split); without them a task is generated from the seed.
    - `max_snapshot_chars`: longer page snapshots are cut (and say so).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.
    - `protocol`: `"strict"` (exact matching) or `"upstream"` (WebShop's fuzzy matching, for published numbers).

    ## Version history

    - v1: the reward changed: only the options the agent chose count.
    - v0: the first version.
    """

    description: ClassVar[str] = ("Buy what a WebShop-style instruction asks in a grocery shop rendered as text "
                                  "(accessibility snapshots, no browser).")

    def __init__(self, *, max_turns: int = 20, tasks: Sequence[Task] | None = None, max_snapshot_chars: int = 12_000,
                 max_action_chars: int = 20_000, render_mode: str | None = None, protocol: str = "strict") -> None:
        from agentgym.envs.web.text_browser import TextBrowser

        super().__init__(max_turns=max_turns, tasks=tasks, max_snapshot_chars=max_snapshot_chars,
                         max_action_chars=max_action_chars, render_mode=render_mode, protocol=protocol)
        self._browser = TextBrowser(self._app.handle, TEXT_ORIGIN)

    def _make_app(self) -> ShopApp:
        from agentgym.envs.web.server import shared_shop

        return shared_shop(serve=False)[0]

    def _origin(self) -> str:
        return TEXT_ORIGIN


class WebShopEnv(_ShopEnv):
    """Buy what a WebShop-style instruction asks in a local grocery shop, in a real Chromium (Playwright).

    ## Description

    The shop app is served on 127.0.0.1 by a background HTTP server and driven through the shared `BrowserPool`'s
    Chromium. Observations are the page's accessibility snapshot in Playwright's format (optionally with a
    screenshot), the same as `agentgym/WebShop-text-v1`, which runs the same shop, tools, reference solver and
    reward without a browser, so a policy trained on one runs on the other. Without `tasks`, a goal is generated
    from the reset seed. Needs Playwright's Chromium.

    ## Tools

    - `click(ref)`: click an element of the page (a link, a button, a text field) by its snapshot ref, e.g. `e12`.
    - `type(ref, text, submit)`: replace the text in a text field; `submit=True` presses Enter afterwards.
    - `select(ref, option)`: choose an option of a drop-down list by its text.
    - `scroll(direction)`: scroll the page up, down, left or right (rarely needed: the snapshot shows the whole
      page).
    - `goto(url)`: open a page of this shop by path, e.g. `/` or `/cart` (other sites are refused).
    - `back()`: go back to the previous page.
    - `answer(text)`: stop shopping and end the episode (only an order placed before counts).

    ## Reward

    WebShop's score of the order (Yao et al., 2022), computed on the server: `r_type * (matched attributes + matched
    options + [price <= limit]) / (goal attributes + goal options + 1)`, where `r_type` checks the product is the
    right kind and only options the agent chose count; an order of several items is divided by their number. Paid
    when the order is placed (component `purchase`); success means a full match (score 1). An episode with no order
    scores 0. The default `protocol="strict"` matches options and attributes exactly; `protocol="upstream"` uses
    WebShop's own `get_reward` rules (fuzzy option match, title fallback), which also credit some wrong choices
    ("1-pack" for "12-pack"): use it for numbers next to published WebShop results.

    ## Episode end

    Terminated when an order is placed or by `answer`; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation.
    - `tasks`: tasks to draw from (e.g. a suite's split); without them a task is generated from the seed.
    - `max_snapshot_chars`: longer page snapshots are cut (and say so).
    - `screenshot`: also return a screenshot: observations become `{"text": str, "image": uint8[H, W, 3]}`.
    - `viewport`: browser window `(width, height)` in pixels (the screenshot's size).
    - `browser`: browser options (see `agentgym.tools.browser.BrowserConfig`) as a dict or a config, or a
      `BrowserPool` to use (default: the shared process-wide pool).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.
    - `protocol`: `"strict"` (exact matching) or `"upstream"` (WebShop's fuzzy matching, for published numbers).

    ## Version history

    - v1: the reward changed: only the options the agent chose count.
    - v0: the first version.
    """

    description: ClassVar[str] = ("Buy what a WebShop-style instruction asks in a local grocery shop, in a real "
                                  "Chromium driven through accessibility snapshots.")

    def __init__(self, *, max_turns: int = 20, tasks: Sequence[Task] | None = None, max_snapshot_chars: int = 12_000,
                 screenshot: bool = False, viewport: tuple[int, int] | list[int] = (1280, 720),
                 browser: Mapping[str, Any] | Any | None = None, max_action_chars: int = 20_000,
                 render_mode: str | None = None, protocol: str = "strict") -> None:
        from agentgym.tools.browser.observations import ScreenObservation
        from agentgym.tools.browser.pool import resolve_pool

        width, height = (int(v) for v in viewport)
        self._pool = resolve_pool(browser)
        self._server = None
        super().__init__(max_turns=max_turns, tasks=tasks, max_snapshot_chars=max_snapshot_chars,
                         max_action_chars=max_action_chars, render_mode=render_mode, protocol=protocol)
        self._browser = self._pool.session(viewport=(width, height))
        self._screen = ScreenObservation(height, width) if screenshot else None
        if self._screen is not None:
            self.observation_space = self._screen.space

    def _make_app(self) -> ShopApp:
        from agentgym.envs.web.server import shared_shop

        app, self._server = shared_shop(serve=True)
        return app

    def _origin(self) -> str:
        assert self._server is not None
        return self._server.origin

    def _with_image(self, observation: Any) -> Any:
        if self._screen is None:
            return observation
        from agentgym.tools.browser.errors import BrowserCrashed

        image = None
        try:
            image = self._browser.screenshot()
        except (BrowserCrashed, ActionError):
            pass  # the episode already ended with an error; keep the last image
        return self._screen.make(str(observation), image)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        return self._with_image(observation), info

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        return self._with_image(observation), reward, terminated, truncated, info
