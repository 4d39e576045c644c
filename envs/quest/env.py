"""The long hall: walk a corridor of many rooms, pick up the keys lying in some of them, open the vault at the end.

Why this task: it needs one turn per room (40+ turns) and every room's description stays in the conversation, so a
whole episode holds more context than a small model's window. A policy that keeps its whole history runs into the
context limit long before the vault; one whose context is compacted (a window, dropped tool outputs, a summary)
can finish. The env shows the keys carried in every observation, so a compacted context loses nothing the next
action needs; what it costs is the history's tokens, not the task's state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.envs.games._common import games_parser, python_rng
from agentgym.errors import TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["LongQuestEnv", "generate_tasks", "room_description"]

_ADJECTIVES = ("dusty", "narrow", "vaulted", "cold", "echoing", "dim", "tiled", "painted", "damp", "quiet")
_THINGS = ("a broken lantern", "an old tapestry", "a stack of crates", "a cracked mirror", "a faded map",
           "a row of empty shelves", "a rusted suit of armour", "a pile of rope", "a locked cabinet", "a stone bench")
#: Reward shares: reaching every room pays PROGRESS in all, taking every key KEYS; opening the vault pays the rest.
PROGRESS, KEYS = 0.5, 0.4


def room_description(seed: int, room: int) -> str:
    """A room's fixed flavour text (two things in a room of some kind): it fills the context as real tool output
    does, and it is the same on every visit."""
    rng = random.Random(seed * 100_003 + room)
    first, second = rng.sample(_THINGS, 2)
    return f"You are in room {room}, a {rng.choice(_ADJECTIVES)} chamber with {first} and {second}."


def generate_tasks(rng: random.Random, count: int, *, rooms: int = 40, keys: int = 3) -> list[Task]:
    """``count`` quests of ``rooms`` rooms with ``keys`` keys in distinct rooms (never the first or the vault's).

    Raises:
        TaskError: Fewer than 3 rooms, no key, or more keys than inner rooms.
    """
    _check(rooms, keys)
    tasks = []
    for i in range(count):
        seed = rng.getrandbits(32)
        placed = sorted(rng.sample(range(1, rooms - 1), keys))
        tasks.append(Task(id=f"quest-{rooms}-{keys}-{i:04d}-{seed:08x}",
                          prompt=f"Find the {keys} keys in the long hall of {rooms} rooms and open the vault in "
                                 f"room {rooms - 1}.",
                          answer=None, metadata={"rooms": rooms, "keys": placed, "seed": seed}))
    return tasks


def _check(rooms: Any, keys: Any) -> None:
    if type(rooms) is not int or rooms < 3:
        raise TaskError(f"LongQuest needs rooms >= 3 (an integer), got {rooms!r}.")
    if type(keys) is not int or not 1 <= keys <= rooms - 2:
        raise TaskError(f"LongQuest needs 1 <= keys <= rooms - 2 = {rooms - 2} (keys lie in the inner rooms), "
                        f"got {keys!r}.")


class LongQuestEnv(AgentEnv):
    """Walk a hall of many rooms, take every key, open the vault in the last room (40+ turns).

    ## Description

    The agent starts in room 0 of a corridor of `rooms` rooms. Some inner rooms hold a key; the vault in the last
    room opens only with every key. Each observation describes the room (fixed flavour text), says whether a key
    lies there, and counts the keys carried, so the state is always in the latest observation while the history
    grows by one room description per turn: a whole episode holds more context than a small model's window. It is
    the task for context strategies (`RolloutConfig.context`: `window`, `drop_tool_outputs`, `summarize`).

    ## Tools

    - `forward()`: walk to the next room.
    - `back()`: walk to the previous room.
    - `take()`: take the key lying here (an error where there is none).
    - `open()`: open the vault (only in the last room, with every key).

    ## Reward

    Progress is paid as it is made: 0.5 shared over the rooms reached for the first time (component `progress`),
    0.4 shared over the keys taken (`key`), and the rest up to 1 for opening the vault (`outcome`). An episode cut
    by the turn limit scores the progress it made.

    ## Episode end

    Terminated when the vault opens (`solved`); truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation. `None` (default): twice what the shortest solution needs.
    - `tasks`: tasks to draw from; without them a quest of `rooms` rooms and `keys` keys is drawn with the reset seed.
    - `rooms`: rooms of generated quests.
    - `keys`: keys of generated quests.
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`. 1 by default: one move per turn, which is what makes the task long.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Walk a hall of 40+ rooms, take every key, open the vault: more turns than a context."
    cheap_steps = True
    native_format_hint: ClassVar[str] = "You may also write an action as a plain function call, e.g. forward()."

    def __init__(self, *, max_turns: int | None = None, tasks: Sequence[Task] | None = None, rooms: int = 40,
                 keys: int = 3, max_action_chars: int = 2_000, max_calls_per_turn: int = 1,
                 render_mode: str | None = None) -> None:
        _check(rooms, keys)
        self._task_params: dict[str, Any] = {"rooms": rooms, "keys": keys}
        self._fixed_max_turns = max_turns
        self._rooms, self._keys, self._seed = rooms, (), 0
        self._room, self._taken, self._reached = 0, frozenset(), 0
        super().__init__(max_turns=2 * (rooms + keys) if max_turns is None else max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, max_calls_per_turn=max_calls_per_turn,
                         render_mode=render_mode)

    # ---- tools ------------------------------------------------------------------------------------
    @tool
    def forward(self) -> str | ToolResult:
        """Walk to the next room."""
        if self._room >= self._rooms - 1:
            return ToolResult.error(f"Error: room {self._room} is the last room; there is no way forward. "
                                    f"{self._view()}")
        self._room += 1
        if self._room > self._reached:
            self._reached = self._room
            self._earn("progress", PROGRESS / (self._rooms - 1))
        return f"You walk forward. {self._view()}"

    @tool
    def back(self) -> str | ToolResult:
        """Walk to the previous room."""
        if self._room == 0:
            return ToolResult.error(f"Error: room 0 is the first room; there is no way back. {self._view()}")
        self._room -= 1
        return f"You walk back. {self._view()}"

    @tool
    def take(self) -> str | ToolResult:
        """Take the key lying in this room."""
        if self._room not in self._keys or self._room in self._taken:
            return ToolResult.error(f"Error: there is no key here. {self._view()}")
        self._taken = self._taken | {self._room}
        self._earn("key", KEYS / len(self._keys))
        return f"You take the key. {self._view()}"

    @tool
    def open(self) -> str | ToolResult:
        """Open the vault (in the last room, with every key)."""
        if self._room != self._rooms - 1:
            return ToolResult.error(f"Error: the vault is in room {self._rooms - 1}, not here. {self._view()}")
        if len(self._taken) < len(self._keys):
            return ToolResult.error(f"Error: the vault needs {len(self._keys)} keys; you carry {len(self._taken)}. "
                                    f"{self._view()}")
        self.finish(success=True, score=1.0, reason="solved")
        return "The vault opens. You have finished the quest!"

    def _earn(self, component: str, value: float) -> None:
        """Pay progress now, and make it the score a truncation keeps (the vault pays the rest)."""
        self.add_reward(component, value)
        self._score += value

    def _view(self) -> str:
        here = " A key lies here." if self._room in self._keys and self._room not in self._taken else ""
        vault = " The vault is here." if self._room == self._rooms - 1 else ""
        return (f"{room_description(self._seed, self._room)}{here}{vault} Keys carried: {len(self._taken)} of "
                f"{len(self._keys)}.")

    def action_choices(self) -> tuple[str, ...]:
        """The actions that do something here (constrained decoding samples only from these)."""
        choices = []
        if self._room in self._keys and self._room not in self._taken:
            choices.append("take()")
        if self._room == self._rooms - 1 and len(self._taken) == len(self._keys):
            choices.append("open()")
        if self._room < self._rooms - 1:
            choices.append("forward()")
        if self._room > 0:
            choices.append("back()")
        return tuple(choices)

    def state_key(self) -> str:
        """Room and keys taken: the whole state (the flavour text is fixed per room)."""
        return f"room {self._room} keys {','.join(str(k) for k in sorted(self._taken)) or '-'}"

    # ---- episode ------------------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.forward, self.back, self.take, self.open])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["forward", "back", "take", "open"])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return generate_tasks(python_rng(rng), 1, **self._task_params)[0]

    def _begin_episode(self, task: Task) -> str:
        meta = task.metadata
        try:
            rooms, keys, seed = int(meta["rooms"]), tuple(int(k) for k in meta["keys"]), int(meta["seed"])
        except (KeyError, TypeError, ValueError):
            raise TaskError(f"LongQuest task {task.id!r} needs metadata rooms (int), keys (list of rooms) and "
                            "seed (int).") from None
        _check(rooms, len(keys))
        if len(set(keys)) != len(keys) or any(not 0 < k < rooms - 1 for k in keys):
            raise TaskError(f"LongQuest task {task.id!r}: keys {list(keys)} must be distinct inner rooms "
                            f"(1..{rooms - 2}).")
        self._rooms, self._keys, self._seed = rooms, keys, seed
        self._room, self._taken, self._reached = 0, frozenset(), 0
        if self._fixed_max_turns is None:
            self.max_turns = 2 * (rooms + len(keys))
        return f"{task.prompt}\n{self._view()}"

    def _task_instructions(self) -> str:
        return (f"Walk the hall with forward() and back(), take() every key you find, and open() the vault in the "
                f"last room once you carry every key. One action per turn; you have {self.max_turns} turns.")

    def reference_solver(self) -> ReferenceSolver:
        """Take a key where one lies, open the vault at the end, else walk forward: rooms + keys turns."""

        def solve(observation: str) -> str:
            if self._room in self._keys and self._room not in self._taken:
                return "take()"
            if self._room == self._rooms - 1:
                return "open()"
            return "forward()"

        return solve
