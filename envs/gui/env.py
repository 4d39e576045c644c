"""MiniWoB-v0: control a web page by pixels, MiniWoB++ style: screenshot in, click(x, y)/type/key out.

Each episode loads one MiniWoB++ page (served on 127.0.0.1) in a pooled Chromium context, seeds it, and
shows the agent ``{"text": the task's utterance, "image": uint8[H, W, 3]}``. Actions are coordinate
actions on that image: ``click(x, y)``, ``type(text)``, ``key(name)``, ``scroll(x, y, dy)`` and
``drag(x1, y1, x2, y2)``. The episode ends when the page's own reward function fires
(``core.endEpisode``); its raw reward (-1..1, partial credit for some tasks) is the env's reward and
success means the full reward of 1.

Agent aids (BrowserGym-style, all off by default, each one a constructor option):

* ``set_of_marks=True`` draws numbered boxes over the page's interactive elements on the screenshot (with
  Pillow, after capture: the page's DOM and events are untouched), lists them in the text part
  (``[3] button "Submit"``) and adds the tool ``click_mark(mark)``, which clicks the centre of that box.
* ``screenshot_size=(W, H)`` resizes the screenshot to any size; every coordinate the agent writes is in
  that image's pixels and maps back to the page linearly (``page = image * page_size / image_size``).
* ``accessibility=True`` adds the page's accessibility tree (Playwright's aria snapshot, no refs) to the
  text part, beside the pixels.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from agentgym.envs.gui.miniwob import (
    HIDE_CHROME_CSS,
    NO_TIME_LIMIT_MS,
    READY_JS,
    START_JS,
    STATE_JS,
    native_screen,
    shared_static_server,
    task_path,
)
from agentgym.envs.gui.tasks import make_task
from agentgym.tools.browser.actions import (
    check_key,
    check_point,
    check_scroll_delta,
    check_text,
)
from agentgym.tools.browser.errors import ActionError, BrowserCrashed
from agentgym.tools.browser.marks import MARKS_JS, MAX_MARKS, Mark, describe_marks, draw_marks, parse_marks
from agentgym.tools.browser.page_session import STILL_CSS

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import AgentGymError, ConfigError, TaskError
from agentgym.parsers import (
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    ToolCallParser,
)
from agentgym.suite import Task
from agentgym.toolset import ToolCall, ToolResult, ToolSet, tool

__all__ = ["MiniWoBEnv"]

TOOL_NAMES = ("click", "type", "key", "scroll", "drag")
MARK_TOOL = "click_mark"
READY_POLLS = 40  # x 50 ms: how long a page may take to become ready before the start counts as a crash
#: The global that holds the episode's mark: a random token set (read-only) in the task's page at the start, so
#: a look can tell the page it started from any other document (a reload, another task's page, an earlier
#: episode's page from history), whose MiniWoB globals would otherwise be read as this task's reward.
EPISODE_MARK = "__agentgymEpisode"
#: Set at the start with the mark: the page may not navigate itself away (a link, a form or a <meta refresh> that
#: the agent typed into a page which echoes text as HTML). Chromium's Navigation API lets the page cancel the
#: navigations its own content starts; those the env starts through the browser (the next episode) are not
#: cancelable and go through.
_SET_MARK_JS = (f"(mark) => {{ Object.defineProperty(window, '{EPISODE_MARK}', "
                "{ value: mark, writable: false, configurable: false, enumerable: false }); "
                "if (window.navigation) { window.navigation.addEventListener('navigate', (event) => { "
                "if (event.cancelable && !event.hashChange) { event.preventDefault(); } }); } }")
#: One script per look at the page: the task's end state, the set-of-marks elements when asked, and the episode
#: mark. A page without MiniWoB's globals reads as "not done".
OBSERVE_JS = (f"([marks, limit]) => {{ let state; try {{ state = ({STATE_JS})(); }} catch (e) {{ "
              f"state = [false, null, String(e)]; }} return [state, marks ? ({MARKS_JS})(limit) : null, "
              f"window.{EPISODE_MARK} === undefined ? null : window.{EPISODE_MARK}]; }}")
#: Seconds to wait before each retry of a look that failed (a navigation the agent started may be replacing
#: the document just then; Chromium refuses screenshots until the new one has painted).
LOOK_RETRY_WAITS = (0.05, 0.2, 0.5)
REWARD_RANGE = (-1.0, 1.0)  # MiniWoB's own range for core.endEpisode
#: Added to every page at the start: MiniWoB's side panels hidden, the caret and CSS animations still (so that
#: equal pages give equal pixels; see ``agentgym.tools.browser.page_session.STILL_CSS``).
_PAGE_CSS_JS = ("(css) => { const s = document.createElement('style'); s.textContent = css; "
                "document.head.appendChild(s); }")
SCREENSHOT_LIMITS = (16, 4096)


class MiniWoBEnv(AgentEnv):
    """MiniWoB++ web tasks by pixels: a screenshot in, `click(x, y)`, `type`, `key`, `scroll` or `drag` out.

    ## Description

    Each episode loads one MiniWoB++ page (served on 127.0.0.1) in a pooled Chromium context, seeds it, and shows
    the agent `{"text": the task's utterance, "image": uint8[H, W, 3]}`. Actions are coordinate actions on that
    image. Agent aids in the style of BrowserGym, all off by default: `set_of_marks` draws numbered boxes over the
    interactive elements (after capture, so the page never sees them) and adds `click_mark`; `screenshot_size`
    resizes the image, and every coordinate maps back to the page linearly; `accessibility` adds the page's
    accessibility tree to the text part. Needs Playwright's Chromium.

    ## Tools

    - `click(x, y)`: click at a point of the screenshot (pixels from the left and top edges).
    - `click_mark(mark)`: (only with `set_of_marks=True`) click the centre of a numbered box of the latest
      screenshot.
    - `type(text)`: type text with the keyboard into whatever has focus (click a field first).
    - `key(name)`: press a key or a chord, e.g. `Enter`, `Tab`, `Control+a`.
    - `scroll(x, y, dy)`: turn the mouse wheel over a point; positive `dy` scrolls down.
    - `drag(x1, y1, x2, y2)`: press the mouse at `(x1, y1)`, move to `(x2, y2)` and release.

    ## Reward

    The page's own raw reward when its reward function fires (`core.endEpisode`): -1 to 1, with partial credit on
    some tasks (component `task`). Success means the full reward of 1. An episode that runs out of turns scores 0.

    ## Episode end

    Terminated when the page ends its episode; truncated after `max_turns` turns. The page's own time limit is
    switched off, so only turns count.

    ## Arguments

    - `task_id`: the MiniWoB task played when no task list is given (e.g. `"click-button"`); it also sets the
      default screen size.
    - `tasks`: tasks to draw from (e.g. a suite's split); each names its page in `metadata["task"]`.
    - `max_turns`: turns before truncation.
    - `screen`: `(width, height)` of the browser window; defaults to the task's own size (160x210, or 375x667 for
      the flight sites). Pages smaller than the screen sit top-left.
    - `screenshot_size`: `(width, height)` of the image the agent sees (16-4096 pixels each way; default: the
      screen). Every coordinate in an action is in its pixels: `click(x, y)` clicks the page at `(x * screen_w /
      width, y * screen_h / height)`.
    - `set_of_marks`: draw numbered boxes over the interactive elements on the image, list them in the text (`[3]
      button "Submit"`) and add the tool `click_mark(mark)`.
    - `accessibility`: add the page's accessibility tree (Playwright's aria snapshot, without refs) to the text part
      of each observation. Off by default: it costs tokens and a little time.
    - `browser`: browser options (see `agentgym.tools.browser.BrowserConfig`) as a dict or a config, or a
      `BrowserPool` to use (default: the shared process-wide pool).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` (the text part), `"rgb_array"` (the last screenshot) or `None`.

    ## Version history

    - v0: the first version.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    description: ClassVar[str] = ("MiniWoB++ web tasks by pixels: screenshot in, click(x, y)/type/key/scroll/drag "
                                  "out; the page's own reward.")
    native_format_hint: ClassVar[str] = (
        'You may also write actions as function calls, e.g. click(80, 105), type("hello"), key("Enter"), '
        "scroll(80, 120, 100) or drag(10, 60, 120, 60)."
    )

    def __init__(
        self,
        *,
        task_id: str = "click-button",
        tasks: Sequence[Task] | None = None,
        max_turns: int = 10,
        screen: Sequence[int] | None = None,
        screenshot_size: Sequence[int] | None = None,
        set_of_marks: bool = False,
        accessibility: bool = False,
        browser: Mapping[str, Any] | Any | None = None,
        max_action_chars: int = 20_000,
        render_mode: str | None = None,
    ) -> None:
        from agentgym.tools.browser.observations import ScreenObservation
        from agentgym.tools.browser.pool import resolve_pool

        task_path(task_id)  # unknown ids fail here, with "did you mean"
        pool = resolve_pool(browser)
        width, height = native_screen(task_id) if screen is None else tuple(int(v) for v in screen)
        if not (100 <= width <= 2000 and 100 <= height <= 2000):
            raise ConfigError(f"screen must be (width, height) between 100 and 2000 pixels, got {screen!r}.")
        image_size = _check_screenshot_size(screenshot_size, (width, height))
        self.task_id = task_id
        self.screen = (width, height)
        self.image_size = image_size
        self.set_of_marks = bool(set_of_marks)
        self.accessibility = bool(accessibility)
        self._server = shared_static_server()
        self._pool = pool
        self._screen = ScreenObservation(image_size[1], image_size[0])
        self._marks: dict[int, Mark] = {}  # the marks of the latest observation, by id
        self._view: Any = None  # the look taken right after the last action (state, marks, pixels), not yet shown
        self._utterance = ""
        self._page_task = ""
        self._page_key = ""  # the latest screen as state_key() reports it (set whenever the page is observed)
        self._episode_mark = ""  # the random token set in this episode's page (see EPISODE_MARK)
        self._left_page = False  # whether the agent made the browser leave the episode's page
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=4,
                         render_mode=render_mode)
        self.observation_space = self._screen.space
        self._session = self._pool.session(viewport=(width, height))

    # ---- tools -------------------------------------------------------------------------------------------------------
    def _act(self, run: Any) -> ToolResult:
        self._view = None
        try:
            run()
        except ActionError as exc:
            return ToolResult.error(str(exc))
        self._check_done()
        return ToolResult("")

    def to_page(self, x: Any, y: Any, *, what: str = "point") -> tuple[float, float]:
        """A point of the screenshot (image pixels) as page pixels; off-image points raise ActionError.

        Linear in each axis (``page = image * screen / image_size``); results within 1e-6 of a whole pixel
        snap to it, so ``to_page(*to_image(p)) == p`` exactly for every whole page pixel ``p``.
        """
        width, height = self.image_size
        ix, iy = check_point(x, y, width, height, what=what)
        return _snap(ix * self.screen[0] / width), _snap(iy * self.screen[1] / height)

    def to_image(self, x: float, y: float) -> tuple[float, float]:
        """A page point as screenshot (image) pixels: the inverse of :meth:`to_page`."""
        return x * self.image_size[0] / self.screen[0], y * self.image_size[1] / self.screen[1]

    @tool
    def click(self, x: float, y: float) -> ToolResult:
        """Click at a point of the screenshot.

        Args:
            x: Pixels from the left edge.
            y: Pixels from the top edge.
        """
        return self._act(lambda: self._session.mouse_click(*self.to_page(x, y)))

    @tool(name=MARK_TOOL)
    def click_mark(self, mark: int) -> ToolResult:
        """Click the centre of a numbered box of the latest screenshot (set-of-marks).

        Args:
            mark: The box's number, as drawn on the screenshot and listed under "Marks".
        """
        def run() -> None:
            number = mark if isinstance(mark, int) and not isinstance(mark, bool) else None
            if isinstance(mark, float) and mark.is_integer():
                number = int(mark)
            target = self._marks.get(number) if number is not None else None
            if target is None:
                listed = (f"the marks are 1 to {len(self._marks)}" if self._marks
                          else "the latest screenshot has no marks; click(x, y) instead")
                raise ActionError(f"Error: there is no mark {str(mark)[:20]} on the latest screenshot; {listed}.")
            self._session.mouse_click(*target.center)

        return self._act(run)

    @tool(name="type")
    def type_text(self, text: str) -> ToolResult:
        """Type text with the keyboard into whatever has focus (click a field first).

        Args:
            text: The characters to type.
        """
        return self._act(lambda: self._session.keyboard_type(check_text(text)))

    @tool
    def key(self, name: str) -> ToolResult:
        """Press a key or a chord, e.g. Enter, Tab, Backspace, ArrowDown, Control+a.

        Args:
            name: The key's name.
        """
        return self._act(lambda: self._session.press(check_key(name)))

    @tool
    def scroll(self, x: float, y: float, dy: float) -> ToolResult:
        """Turn the mouse wheel over a point; positive dy scrolls down.

        Args:
            x: Pixels from the left edge.
            y: Pixels from the top edge.
            dy: Pixels to scroll (positive: down, negative: up).
        """
        def run() -> None:
            px, py = self.to_page(x, y)
            self._session.wheel(px, py, check_scroll_delta(dy) * self.screen[1] / self.image_size[1])

        return self._act(run)

    @tool
    def drag(self, x1: float, y1: float, x2: float, y2: float) -> ToolResult:
        """Press the mouse at (x1, y1), move to (x2, y2) and release.

        Args:
            x1: Start, pixels from the left edge.
            y1: Start, pixels from the top edge.
            x2: End, pixels from the left edge.
            y2: End, pixels from the top edge.
        """
        def run() -> None:
            start = self.to_page(x1, y1, what="start point")
            end = self.to_page(x2, y2, what="end point")
            self._session.drag(*start, *end)

        return self._act(run)

    def _build_tools(self) -> ToolSet:
        marks = [self.click_mark] if self.set_of_marks else []
        return ToolSet([self.click, *marks, self.type_text, self.key, self.scroll, self.drag])

    def _build_parser(self) -> ToolCallParser:
        names = (*TOOL_NAMES, MARK_TOOL) if self.set_of_marks else TOOL_NAMES
        return CompositeParser([HermesParser(), FunctionCallParser(names, {"type": "text", "key": "name"})])

    # ---- the task's reward ------------------------------------------------------------------------------------------
    def _check_done(self) -> None:
        self._view = self._look()
        if self._finished:
            return
        state, mark = _unpack_look(self._view.value)
        if mark != self._episode_mark:
            # Another document is showing: whatever its globals say is not this task's result, and the task's
            # own state is gone with the page that held it. The episode fails.
            self._left_page = True
            self.finish(success=False, score=0.0, reason="failed")
            return
        done, raw = state
        if not done:
            return
        reward = float(raw) if isinstance(raw, (int, float)) and np.isfinite(raw) else 0.0
        reward = min(max(reward, REWARD_RANGE[0]), REWARD_RANGE[1])
        success = reward >= 1.0 - 1e-9
        self.add_reward("task", reward)
        self.finish(success=success, score=reward, reason="solved" if success else "failed")

    # ---- observations ------------------------------------------------------------------------------------------------
    def _look(self) -> Any:
        """One call to the browser: the task's state, the marks (if on), the pixels and the tree (if on).

        A look only reads the page, so a failure is not the agent's doing: it is tried once more (a navigation
        may have replaced the page's context just then), and a second failure ends the episode as a crash.
        """
        for wait in (*LOOK_RETRY_WAITS, None):
            try:
                return self._session.observe(OBSERVE_JS, [self.set_of_marks, MAX_MARKS], aria=self.accessibility)
            except ActionError as exc:
                if wait is None:
                    raise BrowserCrashed(f"the page could not be observed: {exc}") from exc
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _observe(self, messages: str = "") -> dict[str, Any]:
        view, self._view = self._view or self._look(), None
        width, height = self.image_size
        image = view.image
        if self.image_size != self.screen:
            image = _resize(image, self.image_size)
        marks = parse_marks(view.value[1]) if self.set_of_marks and isinstance(view.value, list) else []
        self._marks = {mark.id: mark for mark in marks}
        if self.set_of_marks:
            image = draw_marks(image, marks, scale=(width / self.screen[0], height / self.screen[1]))
        lines = [messages] if messages else []
        if self._left_page:
            lines.append("The browser left the task's page, so the task failed; the episode is over.")
        elif self._finished:
            lines.append(f"The task is over (reward {self._score:.2f}).")
        lines.append(f"Task: {self._utterance}")
        lines.append(f"Screen: {width}x{height} pixels; x grows to the right and y downwards from the top-left corner.")
        extra = []
        if self.set_of_marks:
            extra.append(f"Marks ({MARK_TOOL}(n) clicks the centre of box n):\n" + describe_marks(marks))
        if self.accessibility:
            extra.append("Page:\n" + (view.aria or ""))
        lines.extend(extra)
        observation = self._screen.make("\n".join(lines), image)
        pixels = hashlib.sha256(np.ascontiguousarray(observation["image"]).tobytes()).hexdigest()[:16]
        self._page_key = "\n".join([f"Task: {self._utterance}", f"Screen pixels {pixels}", *extra])
        return observation

    def state_key(self) -> str:
        """The page as the agent sees it: the task utterance, a digest of the screenshot's pixels (the page's
        whole visible state: focus, typed text, checked boxes), the marks' list with ``set_of_marks`` and,
        with ``accessibility``, the page tree.
        Recorded when the observation is taken, so asking for it costs no browser call. The page renders
        deterministically, so replaying a seed's actions gives the same keys."""
        if self._finished:
            return f"task over (reward {self._score:.2f})"
        return self._page_key

    def _format_results(self, results: Sequence[tuple[ToolCall, ToolResult]], notes: Sequence[str]) -> str:
        return "\n".join([r.content for _, r in results if r.content] + list(notes))

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[Any, str]:  # type: ignore[override]
        messages, kind = super()._run_action(action, turn_info)
        return self._observe(messages), kind

    # ---- episodes ----------------------------------------------------------------------------------------------------
    def _sample_task(self, rng: np.random.Generator) -> Task:
        seed = int(rng.integers(0, 2**31 - 1))
        return make_task(self.task_id, seed, tag=f"{int(rng.integers(0, 2**40)):010x}")

    def _begin_episode(self, task: Task) -> Any:  # type: ignore[override]
        page_task = str(task.metadata.get("task", self.task_id))
        try:
            seed = int(task.metadata.get("seed", 0))
        except (TypeError, ValueError):
            raise TaskError(f"MiniWoB task {task.id!r}: metadata['seed'] must be an integer.") from None
        path = task_path(page_task)
        self._page_task = page_task
        self._left_page = False
        self._episode_mark = secrets.token_hex(16)
        for attempt in range(2):
            try:
                self._session.start(path, allowed_origins=[self._server.origin])
                self._session.evaluate(_PAGE_CSS_JS, HIDE_CHROME_CSS + "\n" + STILL_CSS)
                self._session.evaluate(_SET_MARK_JS, self._episode_mark)
                ready, utterance = self._session.evaluate(START_JS, [seed, NO_TIME_LIMIT_MS])
                for _ in range(READY_POLLS):
                    if ready:
                        break
                    self._session.evaluate("() => new Promise(r => setTimeout(r, 50))")
                    ready, utterance = self._session.evaluate(READY_JS)
                if not ready:
                    raise BrowserCrashed(f"the MiniWoB page {page_task} did not become ready")
                break
            except ActionError as exc:  # the page itself failed (not the model's doing): one retry, then crash
                if attempt:
                    raise BrowserCrashed(f"the MiniWoB page {page_task} failed to start: {exc}") from exc
        self._utterance = str(utterance)
        self._view = None
        self._marks = {}
        return self._observe()

    def _task_instructions(self) -> str:
        width, height = self.image_size
        marks = (" Numbered boxes mark the clickable elements on the screenshot and are listed under \"Marks\"; "
                 f"{MARK_TOOL}(n) clicks the centre of box n.") if self.set_of_marks else ""
        tree = (" Under \"Page\" you also get the page's accessibility tree as text."
                if self.accessibility else "")
        return (
            f"You control a web page through its screenshot ({width}x{height} pixels). Each observation gives the "
            "task in words and the current screenshot. Act with the mouse and keyboard at pixel coordinates "
            "of the screenshot (x to the right, y downwards, from the top-left corner): click(x, y), type(text) "
            f"into the focused field, key(name), scroll(x, y, dy) and drag(x1, y1, x2, y2).{marks}{tree} The "
            f"episode ends when the page scores the task. You have {self.max_turns} turns."
        )

    def reference_solver(self) -> ReferenceSolver:
        """Plan pixel actions from the page's DOM (only the tasks in ``solvers.SOLVABLE_TASKS``)."""
        from agentgym.envs.gui.solvers import reference_solver

        if not self._started:
            raise AgentGymError("reset() the env before asking for its reference solver.")
        solve = reference_solver(self._page_task, self._session.evaluate)
        if self.image_size == self.screen:
            return solve
        return lambda observation: self._scale_action(solve(observation))

    def _scale_action(self, action: str) -> str:
        """A page-pixel action of the reference solver in screenshot pixels (for ``screenshot_size``)."""
        parsed = self.parser.parse(action)
        if len(parsed.calls) != 1 or parsed.calls[0].name not in ("click", "scroll", "drag"):
            return action
        call = parsed.calls[0]
        values = list(self.toolset.bind_arguments(call).values())
        points = values[:2] if call.name != "drag" else values
        scaled: list[float] = []
        for i in range(0, len(points), 2):
            scaled.extend(self.to_image(float(points[i]), float(points[i + 1])))
        if call.name == "scroll":
            scaled.append(float(values[2]) * self.image_size[1] / self.screen[1])
        # repr() round-trips floats exactly, so to_page() gives back the solver's own page pixels.
        return f"{call.name}({', '.join(str(int(v)) if v == int(v) else repr(v) for v in scaled)})"

    # ---- gymnasium plumbing ------------------------------------------------------------------------------------------
    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:  # type: ignore[override]
        observation, reward, terminated, truncated, info = super().step(action)
        return self._screen.ensure(observation), reward, terminated, truncated, info

    def render(self) -> Any:
        if self.render_mode == "rgb_array":
            return self._screen.last_image.copy()
        if self.render_mode == "ansi":
            return "\n".join(f"{'>>' if who == 'action' else '<<'} "
                             f"{obs['text'] if isinstance(obs, dict) else obs}" for who, obs in self._transcript)
        return None

    def close(self) -> None:
        if not self._closed:
            self._session.close()
        super().close()


def _check_screenshot_size(size: Sequence[int] | None, screen: tuple[int, int]) -> tuple[int, int]:
    if size is None:
        return screen
    low, high = SCREENSHOT_LIMITS
    try:
        width, height = (int(v) for v in size)
        ok = all(float(v) == int(v) for v in size)
    except (TypeError, ValueError):
        ok = False
    if not ok or not (low <= width <= high and low <= height <= high):
        raise ConfigError(f"screenshot_size must be (width, height) in whole pixels between {low} and {high}, got "
                          f"{size!r}; e.g. screenshot_size=(320, 420) for twice the 160x210 MiniWoB screen.")
    return width, height


def _unpack_look(value: Any) -> tuple[tuple[bool, Any], str | None]:
    """``((done, raw reward), episode mark)`` from OBSERVE_JS's value; anything malformed reads as not done."""
    try:
        state, _marks, mark = value
        done, raw = bool(state[0] is True), state[1]
    except (TypeError, ValueError, IndexError):
        return (False, None), None
    return (done, raw), mark if isinstance(mark, str) else None


def _snap(value: float) -> float:
    """``value``, or the whole pixel within 1e-6 of it (float scaling must not cost a round trip a pixel)."""
    nearest = round(value)
    return float(nearest) if abs(value - nearest) < 1e-6 else value


def _resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``image`` resized to ``size = (width, height)``: bilinear, which Pillow widens into an antialiasing filter
    when shrinking. Lanczos is a little sharper but cost 1.6-3x the time here (9 against 16 ms for 320x420)."""
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR), dtype=np.uint8)
