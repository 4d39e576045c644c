"""BabyAI: carry out a language mission in a ``minigrid`` world that the agent sees as text.

The level, its dynamics, its mission and its reward are minigrid's own BabyAI levels, untouched: this env only
turns the agent's egocentric 7x7 view into sentences the way BALROG does ("a red ball 2 steps forward and 1 step
left"), and tool calls into minigrid actions. A task is ``(level, seed)``, so an episode replays exactly from its
task; success is the level's own reward being positive. The reference solver is minigrid's BabyAI bot
(``minigrid.utils.baby_ai_bot.BabyAIBot``), the planner the BabyAI authors used to make their demonstrations.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from agentgym.envs.games._common import check_settings, sample_one

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import DependencyNotInstalled, TaskError
from agentgym.parsers import BareNameParser, CompositeParser, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["ACTIONS", "BabyAIEnv", "describe_view", "generate_tasks"]

#: Tool name -> minigrid action index (``minigrid.core.actions.Actions``: left, right, forward, pickup, drop,
#: toggle, done).
ACTIONS: dict[str, int] = {"turn_left": 0, "turn_right": 1, "forward": 2, "pickup": 3, "drop": 4, "toggle": 5,
                           "done": 6}
_DONE_TEXT = {"turn_left": "You turned left.", "turn_right": "You turned right.", "forward": "You went forward.",
              "pickup": "You picked it up.", "drop": "You dropped it.", "toggle": "You opened or closed it.",
              "done": "You said done."}
#: What the agent is told when an action changed nothing (minigrid silently ignores such actions).
_NO_EFFECT = {"forward": "Something blocks your way; you did not move.",
              "pickup": "There is nothing you can pick up in front of you (or your hands are full).",
              "drop": "You cannot drop anything here (you carry nothing, or the cell in front is not empty).",
              "toggle": "Nothing in front of you can be opened or closed."}
DEFAULT_LEVELS = ("BabyAI-GoToLocal-v0", "BabyAI-PickupLoc-v0")
SEED_SPLITS = {"train": (0, 2**30), "test": (2**30, 2**31)}
_OBJECTS = {0: "unseen", 1: "empty", 2: "wall", 3: "floor", 4: "door", 5: "key", 6: "ball", 7: "box", 8: "goal",
            9: "lava", 10: "agent"}
_COLOURS = {0: "red", 1: "green", 2: "blue", 3: "purple", 4: "yellow", 5: "grey"}
_DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}


def _minigrid() -> Any:
    try:
        import minigrid  # noqa: F401  (importing registers the BabyAI-* ids with gymnasium)
    except ImportError as exc:
        raise DependencyNotInstalled("minigrid", "babyai", "the BabyAI env") from exc
    return minigrid


def _check_level(level: str) -> None:
    import gymnasium as gym

    _minigrid()
    if not (isinstance(level, str) and level.startswith("BabyAI-") and level in gym.registry):
        from agentgym.errors import did_you_mean

        known = [k for k in gym.registry if k.startswith("BabyAI-")]
        raise TaskError(f"Unknown BabyAI level {level!r}.{did_you_mean(str(level), known)} Use a minigrid "
                        "BabyAI id such as 'BabyAI-GoToLocal-v0'.")


def _steps(n: int, word: str) -> str:
    return f"{n} step{'' if n == 1 else 's'} {word}"


def _where(forward: int, right: int) -> str:
    """BALROG-style relative position: forward first, then sideways."""
    parts = []
    if forward:
        parts.append(_steps(forward, "forward"))
    if right:
        parts.append(_steps(abs(right), "right" if right > 0 else "left"))
    return " and ".join(parts) if parts else "here"


def describe_view(image: np.ndarray, carrying: str | None = None) -> str:
    """Sentences for minigrid's egocentric view (``obs["image"]``, indexed ``[x, y]``, the agent at the middle of
    the bottom row looking up): every visible object with its position relative to the agent, and the nearest
    wall straight ahead, to the left and to the right, as BALROG's BabyAI text wrapper does.
    """
    size_x, size_y = image.shape[0], image.shape[1]
    ax, ay = size_x // 2, size_y - 1
    cells: list[list[list[int]]] = image.tolist()  # plain ints: ~10x faster to read than numpy scalars

    def name(x: int, y: int) -> str | None:
        kind = _OBJECTS.get(cells[x][y][0], "unknown")
        if kind in ("unseen", "empty", "wall", "floor", "agent"):
            return None
        text = f"{_COLOURS.get(cells[x][y][1], '')} {kind}".strip()
        if kind == "door":
            text = f"{_DOOR_STATES.get(cells[x][y][2], '')} {text}".strip()
        return text

    lines: list[str] = []
    for y in range(size_y - 1, -1, -1):  # nearest rows first
        for x in range(size_x):
            thing = None if (x, y) == (ax, ay) else name(x, y)
            if thing is not None:
                lines.append(f"a {thing} {_where(ay - y, x - ax)}")
    for label, (dx, dy) in (("forward", (0, -1)), ("left", (-1, 0)), ("right", (1, 0))):
        x, y, n = ax, ay, 0
        while True:
            x, y, n = x + dx, y + dy, n + 1
            if not (0 <= x < size_x and 0 <= y < size_y) or _OBJECTS.get(cells[x][y][0]) == "unseen":
                break
            if _OBJECTS.get(cells[x][y][0]) == "wall":
                lines.append(f"a wall {_steps(n, label)}")
                break
    front = name(ax, ay - 1) if ay >= 1 else None
    if front is None and ay >= 1 and _OBJECTS.get(cells[ax][ay - 1][0]) == "wall":
        front = "wall"
    text = "You see:\n" + ("\n".join(f"- {line}" for line in lines) if lines else "- nothing but floor")
    text += f"\nDirectly in front of you: {'nothing' if front is None else 'a ' + front}."
    text += f"\nYou are carrying {carrying}." if carrying else "\nYou are carrying nothing."
    return text


def generate_tasks(rng: random.Random, count: int, *, levels: Sequence[str] = DEFAULT_LEVELS,
                   seeds: Literal["train", "test"] = "train") -> list[Task]:
    """Draw ``count`` distinct ``(level, seed)`` tasks, levels in turn.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks.
        levels: minigrid BabyAI level ids to cycle through.
        seeds: Which half of the seed space to draw from; ``"test"`` seeds never occur in ``"train"``, so a
            held-out split holds rooms never trained on even for the same level.
    """
    if isinstance(levels, str):
        levels = [levels]
    if not levels:
        raise TaskError("generate_tasks needs at least one BabyAI level.")
    for level in levels:
        _check_level(level)
    if seeds not in SEED_SPLITS:
        raise TaskError(f"seeds must be one of {sorted(SEED_SPLITS)}, got {seeds!r}.")
    low, high = SEED_SPLITS[seeds]
    tasks: list[Task] = []
    seen: set[tuple[str, int]] = set()
    while len(tasks) < count:
        level, seed = levels[len(tasks) % len(levels)], rng.randrange(low, high)
        if (level, seed) in seen:
            continue
        seen.add((level, seed))
        short = level.removeprefix("BabyAI-").removesuffix("-v0")
        tasks.append(Task(id=f"babyai-{short}-{seed}", prompt=f"Carry out the mission in this BabyAI {short} room.",
                          answer=None, metadata={"level": level, "seed": seed}))
    return tasks


class BabyAIEnv(AgentEnv):
    """A minigrid BabyAI level seen as text, acted on with one tool per minigrid action.

    ## Description

    The level, its dynamics, its mission and its success are minigrid's own BabyAI levels, untouched: the env turns
    the agent's egocentric 7x7 view into sentences the way BALROG does ("a red ball 2 steps forward and 1 step
    left") and tool calls into minigrid actions. A task is `(level, seed)`, so an episode replays exactly from its
    task. The default levels are `BabyAI-GoToLocal-v0` and `BabyAI-PickupLoc-v0`. The reference solver is
    minigrid's BabyAI bot, the planner the BabyAI authors used for their demonstrations.

    ## Tools

    - `turn_left()`: turn 90 degrees left, staying on the same cell.
    - `turn_right()`: turn 90 degrees right, staying on the same cell.
    - `forward()`: move one cell forward, unless a wall, a closed door or an object is in front.
    - `pickup()`: pick up the object directly in front (one object can be carried at a time).
    - `drop()`: drop the carried object onto the empty cell in front.
    - `toggle()`: open or close the door (or open the box) in front; a locked door needs its key.
    - `done()`: say the mission is done (most BabyAI levels ignore it).

    ## Reward

    1 when the level ends with a positive minigrid reward, i.e. the mission is complete (component `success`);
    0 otherwise. minigrid's step-discounted reward value is not passed on.

    ## Episode end

    Terminated when the mission is complete, or when the level ends in a failed state or reaches its own step
    limit (minigrid's `max_steps`); truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation. `None` (default): the level's own step limit, or `metadata["max_turns"]`
      when the task sets one. The level's step limit also ends the episode when several actions in one reply
      reach it first.
    - `tasks`: tasks to draw from; without them a `(level, seed)` is drawn with the reset seed.
    - `levels`: levels of generated tasks.
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`. Several actions in one reply all run.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = ("Carry out a BabyAI mission (minigrid) seen as text: turn_left, turn_right, "
                                  "forward, pickup, drop, toggle, done.")
    cheap_steps = True
    forkable = True
    native_format_hint: ClassVar[str] = "You may also write an action as a plain function call, e.g. forward()."

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        tasks: Sequence[Task] | None = None,
        levels: Sequence[str] = DEFAULT_LEVELS,
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
    ) -> None:
        self._task_params: dict[str, Any] = {"levels": [levels] if isinstance(levels, str) else list(levels)}
        check_settings(generate_tasks, self._task_params)  # fail fast on bad settings
        self._fixed_max_turns = max_turns
        self._levels: dict[str, Any] = {}
        self._world: Any = None
        self._mission = ""
        super().__init__(max_turns=64 if max_turns is None else max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, max_calls_per_turn=max_calls_per_turn,
                         render_mode=render_mode)

    # ---- tools: one per minigrid action ------------------------------------------------------------
    def _act(self, name: str) -> str | ToolResult:
        if self._world is None:  # only reachable by calling a tool outside an episode
            return ToolResult.error("Error: no BabyAI level is loaded; call reset() first.")
        world = self._world
        before = (tuple(world.agent_pos), world.carrying, world.grid.encode().tobytes() if name == "toggle" else b"")
        obs, reward, terminated, truncated, _ = world.step(ACTIONS[name])
        after = (tuple(world.agent_pos), world.carrying, world.grid.encode().tobytes() if name == "toggle" else b"")
        said = _NO_EFFECT[name] if name in _NO_EFFECT and before == after else _DONE_TEXT[name]
        if name in ("pickup", "drop") and before != after:
            obj = after[1] if name == "pickup" else before[1]
            said = f"You {'picked up' if name == 'pickup' else 'dropped'} the {obj.color} {obj.type}."
        view = describe_view(obs["image"], self._carrying())
        if terminated and float(reward) > 0:
            self.add_reward("success", 1.0)
            self.finish(success=True, reason="solved")
            return f"{said} Mission complete: {self._mission}!\n{view}"
        if terminated or truncated:  # a failed end state of the level, or its own step limit
            self.finish(success=False, reason="max_turns" if truncated else "answered")
            return f"{said} The level ended without completing the mission.\n{view}"
        return f"{said}\n{view}"

    @tool
    def turn_left(self) -> str | ToolResult:
        """Turn 90 degrees to the left, staying on the same cell."""
        return self._act("turn_left")

    @tool
    def turn_right(self) -> str | ToolResult:
        """Turn 90 degrees to the right, staying on the same cell."""
        return self._act("turn_right")

    @tool
    def forward(self) -> str | ToolResult:
        """Move one cell forward, unless a wall, a closed door or an object is in front of you."""
        return self._act("forward")

    @tool
    def pickup(self) -> str | ToolResult:
        """Pick up the object directly in front of you (you can carry one object at a time)."""
        return self._act("pickup")

    @tool
    def drop(self) -> str | ToolResult:
        """Drop the object you carry onto the empty cell directly in front of you."""
        return self._act("drop")

    @tool
    def toggle(self) -> str | ToolResult:
        """Open or close the door (or open the box) directly in front of you; a locked door needs its key."""
        return self._act("toggle")

    @tool
    def done(self) -> str | ToolResult:
        """Say you are done (the level decides whether that means anything; most BabyAI levels ignore it)."""
        return self._act("done")

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.turn_left, self.turn_right, self.forward, self.pickup, self.drop, self.toggle,
                        self.done])

    def _build_parser(self) -> ToolCallParser:
        """The common formats, plus a reply that is only an action's name (``turn left``, as BALROG reads
        BabyAI actions): every BabyAI action takes no argument, so the ``()`` adds nothing but a way to fail."""
        common = super()._build_parser()
        parsers = common.parsers if isinstance(common, CompositeParser) else [common]
        return CompositeParser([*parsers, BareNameParser(self.toolset.names)])

    # ---- episode ----------------------------------------------------------------------------------
    def _carrying(self) -> str | None:
        obj = None if self._world is None else self._world.carrying
        return None if obj is None else f"a {obj.color} {obj.type}"

    def _level_env(self, level: str) -> Any:
        if level not in self._levels:
            import gymnasium as gym

            _check_level(level)
            self._levels[level] = gym.make(level).unwrapped  # no wrappers: our turn limit and API rule
        return self._levels[level]

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return sample_one(generate_tasks, rng, self._task_params)

    def _begin_episode(self, task: Task) -> str:
        meta = task.metadata
        try:
            level, seed = str(meta["level"]), int(meta["seed"])
        except (KeyError, TypeError, ValueError):
            raise TaskError(f"BabyAI task {task.id!r} needs metadata level (a minigrid BabyAI id) and an "
                            "integer seed.") from None
        world = self._level_env(level)
        # minigrid prints each rejected level sample; keep stdout clean for CLI tables (a reset takes ~5 ms,
        # so another thread's print in that window is the only thing that could be swallowed).
        with contextlib.redirect_stdout(io.StringIO()):
            obs, _ = world.reset(seed=seed)
        self._world, self._mission = world, str(obs["mission"])
        if self._fixed_max_turns is None:
            self.max_turns = int(meta.get("max_turns", world.max_steps))
        return f"Mission: {self._mission}.\n{describe_view(obs['image'], self._carrying())}"

    def _task_instructions(self) -> str:
        return (
            "You are an agent in a grid world of rooms with keys, balls, boxes and doors; carry out the mission "
            "you are given. You see the cells in front of you and beside you (not through walls or closed "
            "doors); positions are given relative to you, e.g. '2 steps forward and 1 step left'. Act with "
            "turn_left, turn_right, forward, pickup, drop, toggle or done (none takes arguments): to reach an "
            "object you must face it and stand next to it. The episode ends when the mission is done or after "
            f"{self.max_turns} turns."
        )

    def state_key(self) -> str:
        """Agent cell, heading, what it carries, and a digest of the full grid (objects, door states): the
        level's whole state, so revisiting a cell with the same heading and world gives the same key."""
        world = self._world
        if world is None:
            return ""
        digest = hashlib.sha1(world.grid.encode().tobytes()).hexdigest()[:16]
        x, y = (int(v) for v in world.agent_pos)
        return (f"babyai {x},{y} dir {int(world.agent_dir)} carrying {self._carrying() or 'nothing'} grid {digest}"
                + (" (done)" if self._finished and self._success else ""))

    def reference_solver(self) -> ReferenceSolver:
        """minigrid's BabyAI bot, built on the live level; it keeps its own memory of what it has seen, so one
        solver serves one episode from its current state."""
        from minigrid.utils.baby_ai_bot import BabyAIBot

        if self._world is None:
            return lambda observation: "forward()"
        bot = BabyAIBot(self._world)
        names = {index: name for name, index in ACTIONS.items()}

        def act(observation: str) -> str:
            return f"{names[int(bot.replan())]}()"

        return act
