"""Maze: walk a grid maze to the exit, one ``move(direction)`` per turn.

A richer multi-turn game than guess-the-number: the agent must read a 2-D text map, plan a path and keep
to it. Each task's metadata (width, height, seed, start, exit) fully determines the maze, so a task file
is a few integers and every episode is reproducible.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from agentgym.envs.games._common import check_settings, games_parser, sample_one

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["Maze", "MazeEnv", "generate_tasks"]

Cell = tuple[int, int]
DIRECTIONS: dict[str, tuple[int, int]] = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
MAX_SIDE = 30


class Maze:
    """A perfect maze (exactly one path between any two cells) on a ``height x width`` grid.

    Built by randomized depth-first search from ``random.Random(seed)``, so ``(width, height, seed)``
    always gives the same maze on every platform and Python version.
    """

    def __init__(self, width: int, height: int, seed: int) -> None:
        if not (2 <= width <= MAX_SIDE and 2 <= height <= MAX_SIDE):
            raise TaskError(f"Maze sides must lie in [2, {MAX_SIDE}], got width={width}, height={height}.")
        self.width, self.height = width, height
        self.open: dict[Cell, set[str]] = {(r, c): set() for r in range(height) for c in range(width)}
        rng = random.Random(seed)
        stack: list[Cell] = [(0, 0)]
        visited = {(0, 0)}
        while stack:
            r, c = stack[-1]
            options = [
                (name, (r + dr, c + dc))
                for name, (dr, dc) in DIRECTIONS.items()
                if (r + dr, c + dc) in self.open and (r + dr, c + dc) not in visited
            ]
            if not options:
                stack.pop()
                continue
            name, nxt = options[rng.randrange(len(options))]
            self.open[(r, c)].add(name)
            self.open[nxt].add(_OPPOSITE[name])
            visited.add(nxt)
            stack.append(nxt)

    def step(self, cell: Cell, direction: str) -> Cell | None:
        """The neighbouring cell in ``direction``, or ``None`` if a wall is in the way."""
        if direction not in self.open[cell]:
            return None
        dr, dc = DIRECTIONS[direction]
        return cell[0] + dr, cell[1] + dc

    def shortest_path(self, start: Cell, goal: Cell) -> list[str]:
        """Directions of the shortest path (BFS) from ``start`` to ``goal``."""
        parents: dict[Cell, tuple[Cell, str] | None] = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if cell == goal:
                break
            for name in DIRECTIONS:  # fixed order keeps the path deterministic
                nxt = self.step(cell, name)
                if nxt is not None and nxt not in parents:
                    parents[nxt] = (cell, name)
                    queue.append(nxt)
        path: list[str] = []
        cell = goal
        while parents.get(cell) is not None:
            prev, name = parents[cell]  # type: ignore[misc]
            path.append(name)
            cell = prev
        return path[::-1]

    def render(self, agent: Cell, exit_cell: Cell) -> str:
        """Text map: ``#`` wall, ``.`` floor, ``@`` agent, ``E`` exit; north is up."""
        rows = [["#"] * (2 * self.width + 1) for _ in range(2 * self.height + 1)]
        for (r, c), doors in self.open.items():
            rows[2 * r + 1][2 * c + 1] = "."
            for name in doors:
                dr, dc = DIRECTIONS[name]
                rows[2 * r + 1 + dr][2 * c + 1 + dc] = "."
        rows[2 * exit_cell[0] + 1][2 * exit_cell[1] + 1] = "E"
        rows[2 * agent[0] + 1][2 * agent[1] + 1] = "@"
        return "\n".join("".join(row) for row in rows)


_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def generate_tasks(rng: random.Random, count: int, *, width: int = 5, height: int = 5,
                   max_path: int | None = None, unlike: Mapping[str, Any] | None = None) -> list[Task]:
    """Draw ``count`` distinct mazes with a start and an exit at least half the maze apart.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks.
        width: Cells per row (2 to 30).
        height: Cells per column (2 to 30).
        max_path: Keep only mazes whose shortest path takes at most this many moves (``None``: any), so a suite
            with a tight turn limit holds no task that even the reference solver cannot finish.
        unlike: Another split's draw, ``{stream: ..., count: ..., <its options>}`` (``stream``: the seed string of
            that split's generator, ``NAME/VERSION/SEED/SPLIT`` as the suite loader seeds it): no task returned
            has the walls, start and exit of one of its tasks. Small mazes repeat: many seeds build the same 4x4
            maze, so a held-out split that only avoids the training seeds still holds training tasks (18 of
            credit-maze's 200 validation tasks; about 1 in 9). With it, no two tasks returned are the same either.
    """
    seen_elsewhere = set() if unlike is None else _unlike_keys(unlike)
    if not (2 <= width <= MAX_SIDE and 2 <= height <= MAX_SIDE):
        raise TaskError(f"Maze sides must lie in [2, {MAX_SIDE}], got width={width}, height={height}.")
    if max_path is not None and max_path < (width + height) // 2:
        raise TaskError(f"max_path={max_path} is shorter than the closest start-exit distance allowed "
                        f"({(width + height) // 2}); raise it or leave it unset.")
    cells = [(r, c) for r in range(height) for c in range(width)]
    tasks: list[Task] = []
    seen: set[tuple[int, Cell, Cell]] = set()
    while len(tasks) < count:
        seed = rng.randrange(2**31)
        start, exit_cell = rng.sample(cells, 2)
        # Keep start and exit far enough apart that the task needs planning, not one lucky move.
        if abs(start[0] - exit_cell[0]) + abs(start[1] - exit_cell[1]) < (width + height) // 2:
            continue
        if (seed, start, exit_cell) in seen:
            continue
        if max_path is not None and len(Maze(width, height, seed).shortest_path(start, exit_cell)) > max_path:
            continue
        if unlike is not None:
            identity = task_identity(width, height, seed, start, exit_cell)
            if identity in seen_elsewhere:
                continue
            seen_elsewhere.add(identity)  # and no task twice within this split either
        seen.add((seed, start, exit_cell))
        tasks.append(
            Task(
                id=f"maze-{width}x{height}-{seed}",
                prompt=f"Find the exit E of this {width}x{height} maze.",
                answer=None,
                metadata={"width": width, "height": height, "seed": seed,
                          "start": list(start), "exit": list(exit_cell)},
            )
        )
    return tasks


def task_identity(width: int, height: int, seed: int, start: Cell, exit_cell: Cell) -> tuple[Any, ...]:
    """What makes two maze tasks the same task: the walls, the start and the exit (not the seed that built them)."""
    walls = tuple(sorted((cell, tuple(sorted(ways))) for cell, ways in Maze(width, height, seed).open.items()))
    return width, height, walls, start, exit_cell


def _unlike_keys(unlike: Mapping[str, Any]) -> set[tuple[Any, ...]]:
    """:func:`task_identity` of every task of the split ``unlike`` describes (drawn again from its stream)."""
    options = dict(unlike)
    stream, count = options.pop("stream", None), options.pop("count", None)
    if not isinstance(stream, str) or not isinstance(count, int) or count < 1 or "unlike" in options:
        raise TaskError("unlike must name another split's draw: {stream: 'NAME/VERSION/SEED/SPLIT', count: N, "
                        f"width: ..., height: ..., max_path: ...}} (its options, no unlike of its own); got {unlike!r}.")
    tasks = generate_tasks(random.Random(stream), count, **options)
    return {task_identity(t.metadata["width"], t.metadata["height"], t.metadata["seed"], tuple(t.metadata["start"]),
                          tuple(t.metadata["exit"])) for t in tasks}


class MazeEnv(AgentEnv):
    """Walk from `@` to the exit `E` of a text maze with `move(direction)`.

    ## Description

    The agent reads a 2-D text map of a grid maze (its cell `@`, the exit `E`, and the open directions) and must
    plan a path and keep to it. Each task's metadata (width, height, seed, start, exit) fully determines the maze,
    so a task file is a few integers and every episode is reproducible. Without `tasks`, a `width x height` maze is
    drawn with the reset seed.

    ## Tools

    - `move(direction)`: move one cell north, south, east or west (north is up); a wall leaves the agent in place.

    ## Reward

    1 on reaching the exit (component `success`); 0 for an episode that runs out of turns.

    ## Episode end

    Terminated on reaching the exit; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation. `None` (default) gives each task twice its shortest path plus 5 (or
      `metadata["max_turns"]` when the task sets one).
    - `tasks`: tasks to draw from; without them a maze of `width x height` is drawn with the reset seed.
    - `width`: width of generated mazes.
    - `height`: height of generated mazes.
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`. Several moves in one reply all run.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Walk a grid maze to the exit with move(direction); the maze is shown as text."
    cheap_steps = True
    forkable = True
    native_format_hint: ClassVar[str] = 'You may also write a move as a plain function call, e.g. move("north").'

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        tasks: Sequence[Task] | None = None,
        width: int = 5,
        height: int = 5,
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
    ) -> None:
        self._task_params: dict[str, Any] = {"width": width, "height": height}
        check_settings(generate_tasks, self._task_params)  # fail fast on bad settings
        self._fixed_max_turns = max_turns
        self._maze: Maze | None = None
        self._pos: Cell = (0, 0)
        self._exit: Cell = (0, 0)
        self._moves = 0
        super().__init__(max_turns=2 * (width + height) + 5 if max_turns is None else max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, max_calls_per_turn=max_calls_per_turn,
                         render_mode=render_mode)

    @tool
    def move(self, direction: Literal["north", "south", "east", "west"]) -> str | ToolResult:
        """Move one cell; north is up on the map.

        Args:
            direction: One of north, south, east, west.
        """
        if self._maze is None:  # only reachable by calling the tool outside an episode
            return ToolResult.error("Error: no maze is loaded; call reset() first.")
        nxt = self._maze.step(self._pos, direction)
        if nxt is None:
            return f"A wall blocks {direction}; you did not move.\n{self._view()}"
        self._pos = nxt
        self._moves += 1
        if self._pos == self._exit:
            self.add_reward("success", 1.0)
            self.finish(success=True, reason="solved")
            return f"You moved {direction} and reached the exit in {self._moves} moves!"
        return f"You moved {direction}.\n{self._view()}"

    def state_key(self) -> str:
        """The agent's cell: the maze and exit are fixed per task, so the position is the whole state (a wall
        bump or a detour that comes back lands on the same key)."""
        return f"maze position {self._pos[0]},{self._pos[1]}" + (" (exit)" if self._finished and self._success else "")

    def _view(self) -> str:
        if self._maze is None:
            return ""
        doors = [name for name in DIRECTIONS if name in self._maze.open[self._pos]]
        return f"{self._maze.render(self._pos, self._exit)}\nOpen directions: {', '.join(doors)}."

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.move])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["move"], {"move": "direction"})

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return sample_one(generate_tasks, rng, self._task_params)

    def _begin_episode(self, task: Task) -> str:
        meta = task.metadata
        try:
            width, height, seed = int(meta["width"]), int(meta["height"]), int(meta["seed"])
            start = tuple(int(v) for v in meta.get("start", (0, 0)))
            exit_cell = tuple(int(v) for v in meta.get("exit", (height - 1, width - 1)))
        except (KeyError, TypeError, ValueError):
            raise TaskError(
                f"Maze task {task.id!r} needs integer metadata width, height, seed "
                "(and optional start/exit as [row, col])."
            ) from None
        maze = Maze(width, height, seed)
        for name, cell in (("start", start), ("exit", exit_cell)):
            if len(cell) != 2 or cell not in maze.open:
                raise TaskError(
                    f"Maze task {task.id!r}: {name} {list(cell)} is not a cell of the {width}x{height} grid."
                )
        if start == exit_cell:
            raise TaskError(f"Maze task {task.id!r}: start and exit are the same cell.")
        self._maze, self._pos, self._exit, self._moves = maze, start, exit_cell, 0  # type: ignore[assignment]
        if self._fixed_max_turns is None:
            self.max_turns = int(meta.get("max_turns", 2 * len(maze.shortest_path(start, exit_cell)) + 5))  # type: ignore[arg-type]
        return f"{task.prompt}\n{self._view()}"

    def _task_instructions(self) -> str:
        return (
            "Walk the agent @ to the exit E. The map shows walls #, floor . and north at the top. Call move with "
            f"north, south, east or west; walls block moves. You have {self.max_turns} turns."
        )

    def reference_solver(self) -> ReferenceSolver:
        """One move per turn along the BFS shortest path from wherever the agent stands."""

        def solve(observation: str) -> str:
            if self._maze is None:
                return 'move("north")'
            path = self._maze.shortest_path(self._pos, self._exit)
            return f'move("{path[0] if path else "north"}")'

        return solve
