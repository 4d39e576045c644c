"""Sokoban: push every box onto a target in a small text grid, one ``move(direction)`` per call.

The puzzles are the RAGEN / GiGPO kind (6x6 rooms, outer walls included, with 1-2 boxes) and are generated
here by reverse play: carve a room by a random walk, put the boxes on their targets, then play the game
*backwards* (the player pulls boxes) from that solved state. Every pull is the reverse of a legal push, so the
result is solvable by construction; a breadth-first solver over (player, boxes) states then proves it and gives
the shortest solution, and any puzzle it cannot solve within its state budget is rejected. No box starts on a
target (gym-sokoban's rooms never do, and its env would pay +1 for such a box on the first move).
``generator="gym-sokoban"`` uses gym-sokoban's own generator instead (:mod:`.sokoban_gym`): its rooms are
easier with 1 box and harder with 2 than this walk's, so only it gives success rates to set next to RAGEN's
and GiGPO's.
A task's metadata carries the puzzle's rows, so a task file is readable and every episode reproducible.

Two rewards: ``reward="solved"`` (the default) pays 1 for a solved room and nothing else; ``reward="gym-sokoban"``
pays gym-sokoban's shaped reward, the one RAGEN and GiGPO train and report on: -0.1 per move (a bump into a wall
included), +1 for each box pushed onto a target, -1 for each pushed off one, +10 when the room is solved. A turn
that moves nothing (no parseable move) pays the step penalty too, so an unreadable reply never costs less than a
move. Under it the return is the sum of those rewards, solved or not; success is still "solved".
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from agentgym.envs.games._common import check_settings, games_parser, sample_one
from agentgym.envs.games.sokoban_gym import draw_room

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["GENERATORS", "Puzzle", "SokobanEnv", "generate_puzzle", "generate_tasks", "room_half", "room_layout",
           "solve"]

Cell = tuple[int, int]
Boxes = tuple[Cell, ...]
DIRECTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_STEPS = list(DIRECTIONS.values())  # what the generators draw a direction from (one list, not one per draw)
#: Symbols of the text grid (the XSB convention, with ``_`` for floor so no row carries significant spaces).
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", ".", "$", "*", "@", "+"
LEGEND = (f"{WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on a target, "
          f"{PLAYER} you, {PLAYER_ON_TARGET} you on a target")
MIN_SIDE, MAX_SIDE = 5, 12
SEED_SPLITS = {"train": (0, 2**30), "test": (2**30, 2**31)}
#: gym-sokoban's reward (``reward="gym-sokoban"``): per move, per box onto / off a target, for the solved room.
STEP_PENALTY, BOX_ON_TARGET_REWARD, BOX_OFF_TARGET_PENALTY, SOLVED_BONUS = -0.1, 1.0, -1.0, 10.0
REWARDS = ("solved", "gym-sokoban")
#: Room generators: this package's random walk, and gym-sokoban's (for numbers next to RAGEN's and GiGPO's).
GENERATORS = ("random-walk", "gym-sokoban")


def room_layout(rows: Sequence[str]) -> tuple[str, ...]:
    """The room without its player: walls, targets and boxes (the player's cell shown as plain floor or target).

    Two puzzles with the same layout and the player elsewhere are nearly the same puzzle (the same boxes to push
    to the same targets), so held-out splits are kept apart by layout, not by the full grid.
    """
    return tuple(row.replace(PLAYER_ON_TARGET, TARGET).replace(PLAYER, FLOOR) for row in rows)


def room_half(rows: Sequence[str]) -> Literal["train", "test"]:
    """Which half of all rooms a puzzle belongs to, from a hash of its layout (:func:`room_layout`).

    Disjoint seeds are not enough to hold a room out: small rooms recur by chance (7 of the first 100 held-out
    6x6 puzzles drawn from the held-out seeds were training puzzles too). Each half of the seed space keeps only
    the rooms of its own half, so no layout can be in both, whatever the sizes, counts and player cells.
    """
    digest = hashlib.sha256("\n".join(room_layout(rows)).encode()).digest()
    return "train" if digest[0] % 2 == 0 else "test"


@dataclass(frozen=True)
class Puzzle:
    """A Sokoban position: the static room (walls, targets) plus the movable player and boxes."""

    walls: frozenset[Cell]
    targets: frozenset[Cell]
    player: Cell
    boxes: Boxes  # sorted, so equal positions compare equal
    height: int
    width: int

    @classmethod
    def parse(cls, rows: Sequence[str]) -> Puzzle:
        """Read a grid in this module's symbols; cells outside the grid count as walls.

        Raises:
            TaskError: The grid is not rectangular, holds unknown symbols, has not exactly one player, or has
                a different number of boxes and targets (or none).
        """
        if not rows or not all(isinstance(r, str) for r in rows) or len({len(r) for r in rows}) != 1:
            raise TaskError("A Sokoban grid must be a non-empty list of equally long strings.")
        walls, targets, boxes, players = set(), set(), [], []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch == WALL:
                    walls.add((r, c))
                elif ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.add((r, c))
                elif ch not in (FLOOR, BOX, PLAYER):
                    raise TaskError(f"Unknown Sokoban symbol {ch!r} in row {r}; use only: {LEGEND}.")
                if ch in (BOX, BOX_ON_TARGET):
                    boxes.append((r, c))
                if ch in (PLAYER, PLAYER_ON_TARGET):
                    players.append((r, c))
        if len(players) != 1:
            raise TaskError(f"A Sokoban grid needs exactly one player ({PLAYER} or {PLAYER_ON_TARGET}); "
                            f"found {len(players)}.")
        if not boxes or len(boxes) != len(targets):
            raise TaskError(f"A Sokoban grid needs as many targets as boxes (at least one); found {len(boxes)} "
                            f"boxes and {len(targets)} targets.")
        return cls(frozenset(walls), frozenset(targets), players[0], tuple(sorted(boxes)), len(rows), len(rows[0]))

    def blocked(self, cell: Cell) -> bool:
        """A wall, or outside the grid."""
        r, c = cell
        return cell in self.walls or not (0 <= r < self.height and 0 <= c < self.width)

    def solved(self) -> bool:
        return set(self.boxes) == self.targets

    def on_targets(self) -> int:
        """How many boxes stand on a target."""
        return sum(b in self.targets for b in self.boxes)

    def push(self, direction: str) -> tuple[Puzzle, bool] | None:
        """The position after moving ``direction`` and whether a box was pushed; ``None`` if blocked."""
        dr, dc = DIRECTIONS[direction]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        if self.blocked(nxt):
            return None
        if nxt not in self.boxes:
            return Puzzle(self.walls, self.targets, nxt, self.boxes, self.height, self.width), False
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if self.blocked(beyond) or beyond in self.boxes:
            return None
        boxes = tuple(sorted(beyond if b == nxt else b for b in self.boxes))
        return Puzzle(self.walls, self.targets, nxt, boxes, self.height, self.width), True

    def rows(self) -> list[str]:
        """The grid as text rows in this module's symbols."""
        grid = [[WALL if (r, c) in self.walls else FLOOR for c in range(self.width)] for r in range(self.height)]
        for r, c in self.targets:
            grid[r][c] = TARGET
        for r, c in self.boxes:
            grid[r][c] = BOX_ON_TARGET if (r, c) in self.targets else BOX
        r, c = self.player
        grid[r][c] = PLAYER_ON_TARGET if self.player in self.targets else PLAYER
        return ["".join(row) for row in grid]


def solve(puzzle: Puzzle, max_states: int = 200_000) -> list[str] | None:
    """Shortest move sequence (breadth-first search over player and box positions) that solves ``puzzle``.

    Returns ``[]`` for a solved position and ``None`` when no solution exists or the search visits more than
    ``max_states`` positions (so a caller never hangs on a large room).

    The search is :meth:`Puzzle.push` over bare ``(player, boxes)`` pairs: drawing a suite solves thousands of rooms
    and visits about a million positions, and building a :class:`Puzzle` for each one took most of that time.
    """
    if puzzle.solved():
        return []
    floor = frozenset((r, c) for r in range(puzzle.height) for c in range(puzzle.width)
                      if (r, c) not in puzzle.walls)
    targets = puzzle.targets
    moves = [(name, dr, dc) for name, (dr, dc) in DIRECTIONS.items()]  # fixed order keeps the solution deterministic
    start = (puzzle.player, puzzle.boxes)
    parents: dict[tuple[Cell, Boxes], tuple[tuple[Cell, Boxes], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        (row, col), boxes = current
        for name, dr, dc in moves:
            nxt = (row + dr, col + dc)
            if nxt not in floor:
                continue
            solved = False
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond not in floor or beyond in boxes:
                    continue
                boxes_after = tuple(sorted(beyond if b == nxt else b for b in boxes))
                solved = set(boxes_after) == targets
            else:  # the boxes of a position already found unsolved
                boxes_after = boxes
            key = (nxt, boxes_after)
            if key in parents:
                continue
            parents[key] = (current, name)
            if solved:
                path: list[str] = []
                node: tuple[Cell, Boxes] | None = key
                while parents[node] is not None:  # type: ignore[index]
                    node, move = parents[node]  # type: ignore[index, misc]
                    path.append(move)
                return path[::-1]
            if len(parents) > max_states:
                return None
            queue.append(key)
    return None


def _carve_room(rng: random.Random, width: int, height: int) -> set[Cell]:
    """Floor cells of a room carved by a random walk inside the outer wall (gym-sokoban's topology idea)."""
    floor: set[Cell] = set()
    cell = (rng.randrange(1, height - 1), rng.randrange(1, width - 1))
    direction = rng.choice(_STEPS)
    for _ in range(int(1.5 * (width + height)) * 2):
        if rng.random() < 0.35:
            direction = rng.choice(_STEPS)
        nxt = (cell[0] + direction[0], cell[1] + direction[1])
        if 1 <= nxt[0] < height - 1 and 1 <= nxt[1] < width - 1:
            cell = nxt
        floor.add(cell)
        if rng.random() < 0.5:  # widen the corridor now and then, so boxes have room to move
            side = (cell[0] + direction[1], cell[1] + direction[0])
            if 1 <= side[0] < height - 1 and 1 <= side[1] < width - 1:
                floor.add(side)
    return floor


def _gym_sokoban_room(rng: random.Random, width: int, height: int, boxes: int) -> Puzzle | None:
    """One room from :mod:`.sokoban_gym` (gym-sokoban's generator), or ``None`` when that draw found none."""
    drawn = draw_room(rng, width, height, boxes)
    if drawn is None:
        return None
    floor, targets, player, placed = drawn
    walls = frozenset((r, c) for r in range(height) for c in range(width) if (r, c) not in floor)
    return Puzzle(walls, targets, player, placed, height, width)


def generate_puzzle(rng: random.Random, width: int, height: int, boxes: int, *,
                    reverse_steps: int = 100, min_moves: int = 4, max_states: int = 200_000,
                    attempts: int = 200, generator: str = "random-walk",
                    boxes_on_targets: bool = False) -> tuple[Puzzle, list[str]]:
    """A solvable puzzle and its shortest solution, by reverse play from the solved room.

    Args:
        generator: ``"random-walk"`` (this module's walk and pulls) or ``"gym-sokoban"`` (gym-sokoban's masked walk
            and scored reverse search, :mod:`.sokoban_gym`; ``reverse_steps`` does not apply to it).
        boxes_on_targets: Let some (not all) boxes start on a target (``"random-walk"`` only). Off by default:
            gym-sokoban's rooms never start that way, and its env pays +1 on the first move of such a room (it
            counts boxes on targets from 0), so returns would not compare.

    Raises:
        TaskError: No puzzle with ``min_moves`` or more moves was found in ``attempts`` rooms (the room is too
            small for that many boxes).
    """
    if generator not in GENERATORS:
        raise TaskError(f"generator must be one of {list(GENERATORS)}, got {generator!r}: 'gym-sokoban' draws rooms "
                        "as gym-sokoban (RAGEN, GiGPO) does, 'random-walk' is this package's own walk.")
    if boxes_on_targets and generator == "gym-sokoban":
        raise TaskError("boxes_on_targets applies to generator='random-walk' only: gym-sokoban's reverse search "
                        "keeps only rooms where every target is free.")
    for _ in range(attempts):
        if generator == "gym-sokoban":
            puzzle = _gym_sokoban_room(rng, width, height, boxes)
            solution = None if puzzle is None else solve(puzzle, max_states)
            if solution is not None and len(solution) >= min_moves:
                return puzzle, solution  # type: ignore[return-value]
            continue
        floor = _carve_room(rng, width, height)
        if len(floor) < boxes + 3:
            continue
        cells = sorted(floor)
        targets = rng.sample(cells, boxes)
        player = rng.choice([c for c in cells if c not in targets])
        walls = frozenset((r, c) for r in range(height) for c in range(width) if (r, c) not in floor)
        box_list = list(targets)
        target_set = set(targets)
        best: tuple[int, Cell, list[Cell]] | None = None
        for _step in range(reverse_steps):
            dr, dc = rng.choice(_STEPS)
            nxt = (player[0] + dr, player[1] + dc)
            if nxt not in floor or nxt in box_list:
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in box_list and rng.random() < 0.7:  # pull the box behind the player along
                box_list[box_list.index(behind)] = player
            player = nxt
            on_target = sum(b in target_set for b in box_list)
            if on_target == len(box_list) or (on_target and not boxes_on_targets):
                continue  # solved, or a box on a target where none may start
            displacement = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(box_list, targets))
            if best is None or displacement > best[0]:
                best = (displacement, player, list(box_list))
        if best is None:
            continue
        puzzle = Puzzle(walls, frozenset(targets), best[1], tuple(sorted(best[2])), height, width)
        solution = solve(puzzle, max_states)
        if solution is not None and len(solution) >= min_moves:
            return puzzle, solution
    hint = "" if boxes_on_targets or generator == "gym-sokoban" else (
        ", or generator='gym-sokoban' (its search finds such rooms more often), or boxes_on_targets=True")
    raise TaskError(f"Found no {width}x{height} Sokoban room with {boxes} box(es) needing >= {min_moves} moves"
                    f"{'' if boxes_on_targets else ' and no box on a target'} in {attempts} tries; use a larger "
                    f"room or fewer boxes{hint}.")


def generate_tasks(rng: random.Random, count: int, *, width: int = 6, height: int = 6,
                   boxes: int | Sequence[int] = 1, seeds: Literal["train", "test"] = "train",
                   min_moves: int | None = None, generator: Literal["random-walk", "gym-sokoban"] = "random-walk",
                   boxes_on_targets: bool = False) -> list[Task]:
    """Draw ``count`` distinct solvable puzzles, each proven by :func:`solve`.

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: How many tasks.
        width: Columns, outer walls included (5 to 12; RAGEN/GiGPO use 6).
        height: Rows, outer walls included.
        boxes: Boxes per puzzle, or a list to draw from per puzzle (e.g. ``[1, 2]``).
        seeds: Which half of the puzzle-seed space to draw from, and which half of the rooms to keep
            (:func:`room_half`): a ``"test"`` room never occurs in ``"train"``, whatever the player's cell, so a
            held-out split is held out even at the training size.
        min_moves: Reject puzzles solved in fewer moves (default: 4 for ``"random-walk"``; 1 for ``"gym-sokoban"``,
            which keeps every room its search picks, so its mix of easy and hard rooms is gym-sokoban's).
        generator: ``"random-walk"`` or ``"gym-sokoban"`` (gym-sokoban's generator, for numbers comparable with
            RAGEN and GiGPO; see :mod:`.sokoban_gym`).
        boxes_on_targets: Let some boxes start on a target (``"random-walk"`` only; off by default).
    """
    if not (MIN_SIDE <= width <= MAX_SIDE and MIN_SIDE <= height <= MAX_SIDE):
        raise TaskError(f"Sokoban sides must lie in [{MIN_SIDE}, {MAX_SIDE}], got width={width}, height={height}.")
    choices = [boxes] if isinstance(boxes, int) else [int(b) for b in boxes]
    if not choices or any(b < 1 or b > 4 for b in choices):
        raise TaskError(f"Sokoban boxes must be 1 to 4 (or a list of such), got {boxes!r}.")
    if seeds not in SEED_SPLITS:
        raise TaskError(f"seeds must be one of {sorted(SEED_SPLITS)}, got {seeds!r}.")
    if generator not in GENERATORS:
        raise TaskError(f"generator must be one of {list(GENERATORS)}, got {generator!r}.")
    if min_moves is None:
        min_moves = 1 if generator == "gym-sokoban" else 4
    if not isinstance(min_moves, int) or min_moves < 1:
        raise TaskError(f"min_moves must be a positive integer, got {min_moves!r}.")
    low, high = SEED_SPLITS[seeds]
    tasks: list[Task] = []
    seen: set[tuple[str, ...]] = set()
    suffix = "-gym" if generator == "gym-sokoban" else ""
    while len(tasks) < count:
        seed = rng.randrange(low, high)
        n_boxes = rng.choice(choices)
        puzzle, solution = generate_puzzle(random.Random(seed), width, height, n_boxes, min_moves=min_moves,
                                           generator=generator, boxes_on_targets=boxes_on_targets)
        rows = puzzle.rows()
        layout = room_layout(rows)  # the player's cell apart, a repeat is the same puzzle
        if layout in seen or room_half(rows) != seeds:
            continue
        seen.add(layout)
        tasks.append(Task(
            id=f"sokoban-{width}x{height}-b{n_boxes}{suffix}-{seed}",
            prompt=f"Push the {'box' if n_boxes == 1 else f'{n_boxes} boxes'} onto the "
                   f"target{'' if n_boxes == 1 else 's'} in this {width}x{height} room.",
            answer=None,
            metadata={"width": width, "height": height, "boxes": n_boxes, "seed": seed, "rows": rows,
                      "optimal_moves": len(solution)},  # the generator: "-gym" in the id, and the suite file
        ))
    return tasks


class SokobanEnv(AgentEnv):
    """Push every box `$` onto a target `.` with `move(direction)`; the room is shown as a text grid.

    ## Description

    The puzzles are the RAGEN / GiGPO kind (6x6 rooms, outer walls included, with 1-2 boxes), generated by reverse
    play: a room carved by a random walk, the boxes put on their targets, then the game played backwards (the player
    pulls boxes), so every puzzle is solvable; a breadth-first solver proves it and gives the shortest solution. No
    box starts on a target. `generator="gym-sokoban"` draws rooms with gym-sokoban's own generator (masked random
    walk, scored reverse search), whose rooms RAGEN and GiGPO report on: on 6x6 rooms its shortest solutions average
    3.4 moves with 1 box and 7.8 with 2, against 4.7 and 6.0 for the default `"random-walk"` generator. A task's
    metadata carries the puzzle's rows, so every episode is reproducible.

    ## Tools

    - `move(direction)`: walk one cell up, down, left or right; walking into a box pushes it, unless a wall or
      another box is behind it.

    ## Reward

    Under `reward="solved"` (the default): 1 for a solved room (component `success`), else 0. Under
    `reward="gym-sokoban"`: gym-sokoban's shaped reward that RAGEN and GiGPO train and report on, -0.1 per move
    (a bump into a wall, and a turn that moves nothing, included), +1 per box pushed onto a target, -1 per box
    pushed off one, +10 when the room is solved; the return is the sum, solved or not. Success means a solved room
    under both. One difference from gym-sokoban's env: it counts boxes on targets from 0 at reset, so in a room that
    starts with a box on a target its first move earns a spurious +1; here only boxes pushed on or off a target pay.
    Generated rooms never start with a box on a target, so on them the two agree.

    ## Episode end

    Terminated when every box is on a target; truncated after `max_turns` turns (a stuck room is not detected).

    ## Arguments

    - `max_turns`: turns before truncation. `None` (default) gives each task three times its shortest solution plus
      10 (or `metadata["max_turns"]` when the task sets one).
    - `tasks`: tasks to draw from; without them a puzzle is generated from the reset seed.
    - `width`: width of generated puzzles (outer walls included).
    - `height`: height of generated puzzles.
    - `boxes`: boxes in generated puzzles (an int or a list to draw from).
    - `generator`: `"random-walk"` (default) or `"gym-sokoban"` (gym-sokoban's room generator, for numbers next to
      RAGEN's and GiGPO's).
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`. Several moves in one reply all run.
    - `render_mode`: `"ansi"` or `None`.
    - `reward`: `"solved"` (the default) or `"gym-sokoban"` (see Reward).

    ## Version history

    - v0: the first version; generated rooms no longer start with a box on a target (`boxes_on_targets=True` in
      `generate_tasks` restores that), and `generator="gym-sokoban"` was added.
    """

    description: ClassVar[str] = "Push every box onto a target in a text-grid Sokoban room with move(direction)."
    cheap_steps = True
    forkable = True
    native_format_hint: ClassVar[str] = 'You may also write a move as a plain function call, e.g. move("up").'

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        tasks: Sequence[Task] | None = None,
        width: int = 6,
        height: int = 6,
        boxes: int | Sequence[int] = 1,
        generator: Literal["random-walk", "gym-sokoban"] = "random-walk",
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
        reward: Literal["solved", "gym-sokoban"] = "solved",
    ) -> None:
        if reward not in REWARDS:
            raise TaskError(f"reward must be one of {list(REWARDS)}, got {reward!r}: 'solved' pays 1 for a solved "
                            "room, 'gym-sokoban' pays gym-sokoban's shaped reward.")
        self.reward_scheme = reward
        self._earned = 0.0  # gym-sokoban: the reward paid so far this episode
        self._moved_this_turn = False
        self._task_params: dict[str, Any] = {"width": width, "height": height,
                                             "boxes": boxes if isinstance(boxes, int) else list(boxes),
                                             "generator": generator}
        check_settings(generate_tasks, self._task_params)  # fail fast on bad settings
        self._fixed_max_turns = max_turns
        self._puzzle: Puzzle | None = None
        self._moves = 0
        self._plan: list[tuple[tuple[Cell, Boxes], str]] = []
        super().__init__(max_turns=50 if max_turns is None else max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, max_calls_per_turn=max_calls_per_turn,
                         render_mode=render_mode)

    @tool
    def move(self, direction: Literal["up", "down", "left", "right"]) -> str | ToolResult:
        """Walk one cell; walking into a box pushes it one cell further, unless a wall or box is behind it.

        Args:
            direction: One of up, down, left, right (up is the top of the grid).
        """
        if self._puzzle is None:  # only reachable by calling the tool outside an episode
            return ToolResult.error("Error: no puzzle is loaded; call reset() first.")
        before = self._puzzle
        result = before.push(direction)
        self._pay_shaped("step", STEP_PENALTY)
        self._moved_this_turn = True
        if result is None:
            return f"Something blocks {direction}; you did not move.\n{self._view()}"
        self._puzzle, pushed = result
        self._moves += 1
        placed = self._puzzle.on_targets() - before.on_targets()
        if placed:
            self._pay_shaped("box_on_target" if placed > 0 else "box_off_target",
                             placed * (BOX_ON_TARGET_REWARD if placed > 0 else -BOX_OFF_TARGET_PENALTY))
        if self._puzzle.solved():
            if self.reward_scheme == "solved":
                self.add_reward("success", 1.0)
                self.finish(success=True, reason="solved")
            else:
                self._pay_shaped("solved", SOLVED_BONUS)
                self.finish(success=True, score=self._earned, reason="solved")
            return f"You pushed a box {direction}: every box is on a target, solved in {self._moves} moves!\n" \
                   f"{self._view()}"
        return f"You {'pushed a box' if pushed else 'moved'} {direction}.\n{self._view()}"

    def _pay_shaped(self, name: str, value: float) -> None:
        """Pay one gym-sokoban reward component now (nothing under ``reward="solved"``)."""
        if self.reward_scheme == "gym-sokoban":
            self.add_reward(name, value)
            self._earned += value

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        """A turn that moved nothing (void, invalid or refused) pays the step penalty under gym-sokoban too."""
        self._moved_this_turn = False
        observation, kind = super()._run_action(action, turn_info)
        if not self._moved_this_turn and not self._finished:
            self._pay_shaped("step", STEP_PENALTY)
        return observation, kind

    def _pay_outcome(self) -> None:
        """Under gym-sokoban an unsolved episode keeps the (shaped) reward it earned: that sum is its return."""
        if self.reward_scheme == "gym-sokoban" and not self._finished:
            self._score = self._earned
        super()._pay_outcome()

    def state_key(self) -> str:
        """Player and box cells: the room is fixed per task, so they are the whole state (a bump into a wall or
        a walk that comes back lands on the same key)."""
        if self._puzzle is None:
            return ""
        boxes = " ".join(f"{r},{c}" for r, c in self._puzzle.boxes)
        return f"sokoban player {self._puzzle.player[0]},{self._puzzle.player[1]} boxes {boxes}" + (
            " (solved)" if self._finished and self._success else "")

    def _view(self) -> str:
        if self._puzzle is None:
            return ""
        return "\n".join(self._puzzle.rows()) + \
            f"\nBoxes on targets: {self._puzzle.on_targets()}/{len(self._puzzle.boxes)}."

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.move])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["move"], {"move": "direction"})

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return sample_one(generate_tasks, rng, self._task_params)

    def _begin_episode(self, task: Task) -> str:
        rows = task.metadata.get("rows")
        if not isinstance(rows, (list, tuple)):
            raise TaskError(f"Sokoban task {task.id!r} needs metadata rows: the grid as a list of strings "
                            f"({LEGEND}).")
        try:
            puzzle = Puzzle.parse(list(rows))
        except TaskError as exc:
            raise TaskError(f"Sokoban task {task.id!r}: {exc}") from None
        if puzzle.solved():
            raise TaskError(f"Sokoban task {task.id!r} starts solved; put at least one box off its target.")
        self._puzzle, self._moves, self._plan, self._earned = puzzle, 0, [], 0.0
        if self._fixed_max_turns is None:
            optimal = task.metadata.get("optimal_moves")
            if optimal is None:
                solution = solve(puzzle)
                if solution is None:
                    raise TaskError(f"Sokoban task {task.id!r} has no solution the solver can find.")
                optimal = len(solution)
            self.max_turns = int(task.metadata.get("max_turns", 3 * int(optimal) + 10))
        return f"{task.prompt}\n{self._view()}"

    def _task_instructions(self) -> str:
        return (
            f"Push every box onto a target. The grid shows {LEGEND}; up is the top. Call move with up, down, "
            "left or right: walking into a box pushes it one cell, but you cannot pull boxes or push two at "
            f"once, so a box pushed into a corner is stuck for good. You have {self.max_turns} turns."
        )

    def reference_solver(self) -> ReferenceSolver:
        """One move per turn along a breadth-first shortest solution, re-planned whenever the position is not
        the one the plan expects (so it also finishes episodes that someone else started)."""

        def act(observation: str) -> str:
            puzzle = self._puzzle
            if puzzle is None:
                return 'move("up")'
            state = (puzzle.player, puzzle.boxes)
            if not self._plan or self._plan[0][0] != state:
                solution = solve(puzzle) or ["up"]
                self._plan, current = [], puzzle
                for name in solution:
                    self._plan.append(((current.player, current.boxes), name))
                    step = current.push(name)
                    if step is None:
                        break
                    current = step[0]
            return f'move("{self._plan.pop(0)[1]}")'

        return act
