"""MiniWoB-v0: control a web page by pixels, MiniWoB++ style: screenshot in, click(x, y)/type/key out.

Each episode loads one MiniWoB++ page (served on 127.0.0.1) in a pooled Chromium context, seeds it, and
shows the agent ``{"text": the task's utterance, "image": uint8[H, W, 3]}``. Actions are coordinate
actions on that image: ``click(x, y)``, ``type(text)``, ``key(name)``, ``scroll(x, y, dy)`` and
``drag(x1, y1, x2, y2)``. The episode ends when the page's own reward function fires
(``core.endEpisode``); its raw reward (-1..1, partial credit for some tasks) is the env's reward and
success means the full reward of 1.
"""

from __future__ import annotations

import hashlib
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
READY_POLLS = 40  # x 50 ms: how long a page may take to become ready before the start counts as a crash


class MiniWoBEnv(AgentEnv):
    """MiniWoB++ tasks in a real Chromium, observed as screenshots and driven by pixel coordinates.

    Args:
        task_id: The MiniWoB task played when no task list is given (e.g. ``"click-button"``); it also
            sets the default screen size.
        tasks: Tasks to draw from (e.g. a suite's split); each names its page in ``metadata["task"]``.
        max_turns: Turns before truncation.
        screen: ``(width, height)`` of the browser window and of the image; defaults to the task's own
            size (160x210, or 375x667 for the flight sites). Pages smaller than the screen sit top-left.
        accessibility: Add the page's accessibility tree (no refs) to the text observation.
        browser: Browser options (see :class:`agentgym.tools.browser.BrowserConfig`) as a dict or a config,
            or a :class:`~agentgym.tools.browser.BrowserPool` to use (default: the shared process-wide pool).
        max_action_chars: See :class:`~agentgym.env.AgentEnv`.
        render_mode: ``"ansi"`` (the text part), ``"rgb_array"`` (the last screenshot) or ``None``.
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
        self.task_id = task_id
        self.screen = (width, height)
        self.accessibility = bool(accessibility)
        self._server = shared_static_server()
        self._pool = pool
        self._screen = ScreenObservation(height, width)
        self._utterance = ""
        self._page_task = ""
        self._page_key = ""  # the latest screen as state_key() reports it (set whenever the page is observed)
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=4,
                         render_mode=render_mode)
        self.observation_space = self._screen.space
        self._session = self._pool.session(viewport=(width, height))

    # ---- tools -------------------------------------------------------------------------------------------------------
    def _act(self, run: Any) -> ToolResult:
        try:
            run()
        except ActionError as exc:
            return ToolResult.error(str(exc))
        self._check_done()
        return ToolResult("")

    @tool
    def click(self, x: float, y: float) -> ToolResult:
        """Click at a point of the screenshot.

        Args:
            x: Pixels from the left edge.
            y: Pixels from the top edge.
        """
        width, height = self.screen
        return self._act(lambda: self._session.mouse_click(*check_point(x, y, width, height)))

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
        width, height = self.screen

        def run() -> None:
            px, py = check_point(x, y, width, height)
            self._session.wheel(px, py, check_scroll_delta(dy))

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
        width, height = self.screen

        def run() -> None:
            start = check_point(x1, y1, width, height, what="start point")
            end = check_point(x2, y2, width, height, what="end point")
            self._session.drag(*start, *end)

        return self._act(run)

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.click, self.type_text, self.key, self.scroll, self.drag])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([HermesParser(), FunctionCallParser(TOOL_NAMES, {"type": "text", "key": "name"})])

    # ---- the task's reward ------------------------------------------------------------------------------------------
    def _check_done(self) -> None:
        done, raw, _reason = self._session.evaluate(STATE_JS)
        if not done or self._finished:
            return
        reward = float(raw) if isinstance(raw, (int, float)) and np.isfinite(raw) else 0.0
        success = reward >= 1.0 - 1e-9
        self.add_reward("task", reward)
        self.finish(success=success, score=reward, reason="solved" if success else "failed")

    # ---- observations ------------------------------------------------------------------------------------------------
    def _observe(self, messages: str = "") -> dict[str, Any]:
        width, height = self.screen
        lines = [messages] if messages else []
        if self._finished:
            lines.append(f"The task is over (reward {self._score:.2f}).")
        lines.append(f"Task: {self._utterance}")
        lines.append(f"Screen: {width}x{height} pixels; x grows to the right and y downwards from the top-left corner.")
        page = "Page:\n" + self._session.aria_text() if self.accessibility else ""
        if page:
            lines.append(page)
        observation = self._screen.make("\n".join(lines), self._session.screenshot())  # no image: the last one
        pixels = hashlib.sha256(np.ascontiguousarray(observation["image"]).tobytes()).hexdigest()[:16]
        self._page_key = f"Task: {self._utterance}\nScreen pixels {pixels}" + (f"\n{page}" if page else "")
        return observation

    def state_key(self) -> str:
        """The page as the agent sees it: the task utterance, a digest of the screenshot's pixels (the page's
        whole visible state: focus, typed text, checked boxes) and, with ``accessibility``, the page tree.
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
        for attempt in range(2):
            try:
                self._session.start(path, allowed_origins=[self._server.origin])
                self._session.evaluate("(css) => { const s = document.createElement('style'); s.textContent = css; "
                                       "document.head.appendChild(s); }", HIDE_CHROME_CSS)
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
        return self._observe()

    def _task_instructions(self) -> str:
        width, height = self.screen
        return (
            f"You control a web page through its screenshot ({width}x{height} pixels). Each observation gives the "
            "task in words and the current screenshot. Act with the mouse and keyboard at pixel coordinates "
            "(x to the right, y downwards, from the top-left corner): click(x, y), type(text) into the focused "
            "field, key(name), scroll(x, y, dy) and drag(x1, y1, x2, y2). The episode ends when the page scores "
            f"the task. You have {self.max_turns} turns."
        )

    def reference_solver(self) -> ReferenceSolver:
        """Plan pixel actions from the page's DOM (only the tasks in ``solvers.SOLVABLE_TASKS``)."""
        from agentgym.envs.gui.solvers import reference_solver

        if not self._started:
            raise AgentGymError("reset() the env before asking for its reference solver.")
        return reference_solver(self._page_task, self._session.evaluate)

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
