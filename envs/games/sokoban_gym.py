"""Sokoban rooms drawn the way gym-sokoban draws them, for success rates comparable with RAGEN and GiGPO.

gym-sokoban (Schrader, 2018; the generator of Racanière et al., 2017, "Imagination-Augmented Agents",
appendix: "reverse playing") builds a room in three steps, each followed here with our own code and one
``random.Random``:

1. **Topology.** A random walk of ``int(1.7 * (width + height))`` steps that turns with probability 0.35 and
   stamps one of five 3x3 floor masks (a horizontal bar, a vertical bar, two L shapes and a 2x2 block) around
   each position; the border is then walled.
2. **Placement.** The player, then each box target, on a uniformly drawn free floor cell.
3. **Reverse playing.** A depth-first search (depth 300, at most 300,000 positions) over moves and *pulls* from
   the solved room. Each position is scored ``pulls on the path * sum of box-to-own-target Manhattan
   distances``, and only positions where every target is uncovered (no box, no player on one) score at all; the
   first best-scoring position is the room. A room whose search scores 0 everywhere is drawn again.

The search keys positions as gym-sokoban's grid does (box identities are not part of it, and a box never pulled
is told apart from one that was), so its first-visit order, and hence the rooms it picks, follow the original.
Because every target must be uncovered, no box starts on a target. Mean shortest solutions on 6x6 rooms,
measured with gym-sokoban 0.0.6's ``generate_room``: 3.39 +- 0.07 moves with 1 box (1,000 rooms) and 7.78 +- 0.21
with 2 (400 rooms); this module's rooms: 3.33 +- 0.07 and 7.75 +- 0.20 on as many.
"""

from __future__ import annotations

import random

__all__ = ["CHANGE_PROBABILITY", "MASKS", "SEARCH_DEPTH", "SEARCH_STATES", "draw_room", "reverse_play",
           "room_topology"]

Cell = tuple[int, int]

CHANGE_PROBABILITY = 0.35
SEARCH_DEPTH = 300
SEARCH_STATES = 300_000
#: gym-sokoban's floor stamps, as offsets from the walk's position.
MASKS: tuple[tuple[Cell, ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),            # horizontal bar
    ((-1, 0), (0, 0), (1, 0)),            # vertical bar
    ((0, -1), (0, 0), (1, 0)),            # L: left and down
    ((0, -1), (0, 0), (1, -1), (1, 0)),   # 2x2 block
    ((0, 0), (0, 1), (1, 0)),             # L: right and down
)
#: Search order: up, down, left, right (gym-sokoban tries its pull actions first; plain moves repeat them).
_DIRECTIONS: tuple[Cell, ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
_WALK_DIRECTIONS: tuple[Cell, ...] = ((1, 0), (0, 1), (-1, 0), (0, -1))


def room_topology(rng: random.Random, width: int, height: int) -> set[Cell]:
    """Floor cells of a room carved by gym-sokoban's masked random walk (outer wall excluded)."""
    steps = int(1.7 * (width + height))
    direction = rng.choice(_WALK_DIRECTIONS)
    row, col = rng.randint(1, height - 1), rng.randint(1, width - 1)
    floor: set[Cell] = set()
    for _ in range(steps):
        if rng.random() < CHANGE_PROBABILITY:
            direction = rng.choice(_WALK_DIRECTIONS)
        row = max(min(row + direction[0], height - 2), 1)
        col = max(min(col + direction[1], width - 2), 1)
        for dr, dc in rng.choice(MASKS):
            floor.add((row + dr, col + dc))
    return {(r, c) for r, c in floor if 0 < r < height - 1 and 0 < c < width - 1}


class _Search:
    """gym-sokoban's reverse-play depth-first search, over (player, pulled boxes, unpulled boxes) positions."""

    def __init__(self, floor: set[Cell], targets: tuple[Cell, ...]) -> None:
        self.floor = floor
        self.targets = targets
        self.explored: set[tuple[Cell, frozenset[Cell], frozenset[Cell]]] = set()
        self.best_score = -1
        self.best: tuple[Cell, tuple[Cell, ...]] | None = None

    def run(self, player: Cell, ttl: int) -> None:
        # boxes[i] is the box that started on targets[i]; pulled[i] says whether it was ever pulled.
        self._visit(player, tuple(self.targets), (False,) * len(self.targets), 0, ttl)

    def _visit(self, player: Cell, boxes: tuple[Cell, ...], pulled: tuple[bool, ...], pulls: int, ttl: int) -> None:
        ttl -= 1
        if ttl <= 0 or len(self.explored) >= SEARCH_STATES:
            return
        key = (player, frozenset(b for b, p in zip(boxes, pulled) if p),
               frozenset(b for b, p in zip(boxes, pulled) if not p))
        if key in self.explored:
            return
        covered = set(boxes) | {player}
        uncovered = sum(t not in covered for t in self.targets)
        displacement = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, self.targets))
        score = pulls * displacement if uncovered == len(self.targets) else 0
        if score > self.best_score:
            self.best_score, self.best = score, (player, boxes)
        self.explored.add(key)
        for dr, dc in _DIRECTIONS:
            nxt = (player[0] + dr, player[1] + dc)
            if nxt not in self.floor or nxt in boxes:
                continue  # a wall or a box: gym-sokoban's move leaves the position as it was (already explored)
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes:
                i = boxes.index(behind)
                moved = boxes[:i] + (player,) + boxes[i + 1:]
                flags = pulled[:i] + (True,) + pulled[i + 1:]
                self._visit(nxt, moved, flags, pulls + 1, ttl)
            else:
                self._visit(nxt, boxes, pulled, pulls, ttl)
        # gym-sokoban's plain moves (its actions 4-7) repeat the walks above without pulling.
        for dr, dc in _DIRECTIONS:
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in self.floor and nxt not in boxes and (player[0] - dr, player[1] - dc) in boxes:
                self._visit(nxt, boxes, pulled, pulls, ttl)


def reverse_play(floor: set[Cell], targets: tuple[Cell, ...], player: Cell) -> tuple[int, Cell, tuple[Cell, ...]]:
    """The best-scoring position of gym-sokoban's reverse play: ``(score, player, boxes)``; score 0 means none."""
    search = _Search(floor, targets)
    search.run(player, SEARCH_DEPTH)  # at most 300 frames deep: within Python's default limit of 1000
    if search.best is None:  # unreachable: the start position is always scored
        return 0, player, targets
    return search.best_score, search.best[0], search.best[1]


def draw_room(rng: random.Random, width: int, height: int, boxes: int
              ) -> tuple[set[Cell], frozenset[Cell], Cell, tuple[Cell, ...]] | None:
    """One gym-sokoban room: ``(floor, targets, player, boxes)``, or ``None`` when this draw has no room (too
    little floor, or reverse play scored 0; gym-sokoban raises then, and its users draw again)."""
    floor = room_topology(rng, width, height)
    cells = sorted(floor)  # row-major, as numpy's where() lists them
    if len(cells) <= boxes + 1:
        return None
    player = rng.choice(cells)
    free = [c for c in cells if c != player]
    targets = tuple(rng.sample(free, boxes))
    score, start, placed = reverse_play(floor, targets, player)
    if score <= 0:
        return None
    return floor, frozenset(targets), start, tuple(sorted(placed))
