"""A Stockfish client over UCI: a separate process (Debian ``stockfish``), restarted if it dies.

Stockfish is GPL software, so it is never linked or imported: agentgym talks to the ``stockfish`` binary
through pipes with the UCI protocol, like any chess GUI does.

Strength is configurable, and ``skill_level`` means what Stockfish's own ``Skill Level`` option means.
Below 20, Stockfish searches with ``MultiPV 4`` and, when its iterative deepening reaches depth
``1 + skill_level``, picks one of those four moves with a weakness-scaled random push (``Skill::pick_best``);
deeper iterations do not change that pick. So a level needs a search of at least ``1 + skill_level`` plies:
a shallower limit (the old default ``depth=1``) makes Stockfish pick from a depth-1 search at every level and
flattens all levels into one. The client therefore searches each level to exactly the depth its skill rule
uses, and refuses a ``depth`` below it. At level 20 (no skill rule) ``depth`` is the search depth, by
default :data:`FULL_STRENGTH_DEPTH`.

Stockfish draws the skill push from a clock-seeded RNG, so two runs of the same game differ. Episodes must
be replayable from their seed (branching rollouts replay them), so by default (``deterministic=True``) the
client reproduces the skill rule itself: it searches to depth ``1 + skill_level`` with ``MultiPV 4`` and
applies Stockfish 15's ``pick_best`` formula with the caller's RNG, after ``ucinewgame`` so no hash state
leaks between searches. ``deterministic=False`` sends ``Skill Level`` to the engine instead (and searches to
the same depth, so the engine reaches its pick point).

A process that dies or stops answering is restarted and the search retried; when restarts are used up
the client raises :class:`~agentgym.errors.EnvCrashed`, which ends the episode with ``end_reason="error"``.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np

from agentgym.errors import AgentGymError, ConfigError, EnvCrashed

__all__ = ["FULL_STRENGTH_DEPTH", "NoLegalMove", "StockfishConfig", "StockfishEngine", "find_stockfish",
           "pick_skill_move", "skill_depth"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = "Install it with 'apt-get install stockfish' (Debian/Ubuntu put it in /usr/games) or set AGENTGYM_STOCKFISH."
_MATE_CP = 100_000
#: Search depth at skill level 20 when no ``depth`` is given: one ply deeper than level 19 picks at, so the
#: top level is never weaker than the one below it.
FULL_STRENGTH_DEPTH = 21


def skill_depth(skill_level: int) -> int:
    """The depth at which Stockfish's skill rule picks its move at ``skill_level`` < 20 (``Skill::time_to_pick``)."""
    return 1 + skill_level


def find_stockfish(path: str | None = None) -> str:
    """Locate the binary: ``path`` if given, else ``$AGENTGYM_STOCKFISH``, ``stockfish`` on PATH, /usr/games."""
    def runnable(candidate: str | None) -> bool:
        return bool(candidate) and os.path.isfile(str(candidate)) and os.access(str(candidate), os.X_OK)

    if path is not None:
        if runnable(path):
            return path
        raise EnvCrashed(f"Stockfish binary {path!r} does not exist or is not executable. {_INSTALL_HINT}")
    for candidate in (os.environ.get("AGENTGYM_STOCKFISH"), shutil.which("stockfish"), "/usr/games/stockfish"):
        if runnable(candidate):
            return str(candidate)
    raise EnvCrashed(f"Stockfish was not found. {_INSTALL_HINT}")


@dataclass(frozen=True)
class StockfishConfig:
    """How strong Stockfish plays and how it is run.

    Attributes:
        path: The binary; ``None`` searches ``$AGENTGYM_STOCKFISH``, PATH and /usr/games.
        skill_level: 0 (weakest) to 20 (full strength), as Stockfish's ``Skill Level`` option.
        depth: Search depth at level 20 (``None``: :data:`FULL_STRENGTH_DEPTH`). Below 20 the depth is the
            level's own, ``1 + skill_level``; a ``depth`` below that would cap the level and is refused, a
            larger one changes nothing (Stockfish's pick is made at ``1 + skill_level``).
        nodes: Node limit per search (deterministic), or ``None``.
        movetime_ms: Time per move (not reproducible; only used when set), or ``None``.
        deterministic: Reproduce the skill rule with the caller's RNG (see the module docstring) instead of
            letting the engine draw from its clock.
        threads: Engine threads; 1 keeps searches reproducible.
        hash_mb: Transposition table size.
        timeout_s: Longest wait for any answer before the engine counts as hung.
        max_restarts: Restarts per request before giving up with ``EnvCrashed``.
    """

    path: str | None = None
    skill_level: int = 0
    depth: int | None = None
    nodes: int | None = None
    movetime_ms: int | None = None
    deterministic: bool = True
    threads: int = 1
    hash_mb: int = 4
    timeout_s: float = 10.0
    max_restarts: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.skill_level <= 20:
            raise ConfigError(f"skill_level must be in 0..20 (0 is the weakest), got {self.skill_level}.")
        for name in ("depth", "nodes", "movetime_ms"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 or None, got {value}.")
        if self.skill_level < 20 and self.depth is not None and self.depth < skill_depth(self.skill_level):
            raise ConfigError(
                f"depth={self.depth} would cap Skill Level {self.skill_level}: Stockfish picks its move at depth "
                f"{skill_depth(self.skill_level)} at that level. Leave depth=None (the level's own depth) or lower "
                "skill_level for a weaker engine."
            )
        if self.skill_level < 20 and (self.nodes is not None or self.movetime_ms is not None):
            raise ConfigError("nodes and movetime_ms can stop a search before Stockfish's skill rule picks its move "
                              "(at depth 1 + skill_level); use them only with skill_level=20.")
        if self.threads < 1 or self.hash_mb < 1:
            raise ConfigError(f"threads and hash_mb must be >= 1, got {self.threads} and {self.hash_mb}.")
        if self.timeout_s <= 0 or self.max_restarts < 0:
            raise ConfigError(f"timeout_s must be > 0 and max_restarts >= 0, got {self.timeout_s}, {self.max_restarts}.")
        if self.deterministic and (self.movetime_ms is not None or self.threads != 1):
            raise ConfigError("deterministic=True needs threads=1 and no movetime_ms (time limits are not reproducible); "
                              "use depth or nodes, or set deterministic=False.")

    def effective_depth(self) -> int | None:
        """The depth searched: the skill rule's pick depth below level 20, else ``depth`` or the default.

        ``None`` at level 20 only when ``nodes`` or ``movetime_ms`` bound the search instead.
        """
        if self.skill_level < 20:
            return skill_depth(self.skill_level)
        if self.depth is None and (self.nodes is not None or self.movetime_ms is not None):
            return None
        return FULL_STRENGTH_DEPTH if self.depth is None else self.depth


class NoLegalMove(AgentGymError):
    """The engine was asked to move in a finished game (a caller bug, not an engine failure)."""


class _ProtocolError(Exception):
    """The engine answered something that is not UCI (counts as a failure: restart and retry)."""


@dataclass(frozen=True)
class _Candidate:
    move: str
    score_cp: int


def pick_skill_move(candidates: Sequence[_Candidate], skill_level: int, rng: np.random.Generator) -> str:
    """Stockfish 15's ``Skill::pick_best``: push each of the top moves by a weakness-scaled random amount.

    ``candidates`` are sorted best first (MultiPV order); scores are centipawns from the mover's side.
    """
    top = candidates[0].score_cp
    delta = min(top - candidates[-1].score_cp, 100)  # at most one pawn
    weakness = 120 - 2 * skill_level
    best, best_score = candidates[0].move, -(10**12)
    for c in candidates:
        push = (weakness * (top - c.score_cp) + delta * int(rng.integers(weakness))) // 128
        if c.score_cp + push >= best_score:
            best, best_score = c.move, c.score_cp + push
    return best


def _kill(process: subprocess.Popen[str]) -> None:
    """Stop a process for good (used by close() and by the garbage-collection finalizer)."""
    if process.poll() is None:
        try:
            if process.stdin is not None:
                process.stdin.write("quit\n")
                process.stdin.flush()
        except (OSError, ValueError):
            pass
        try:
            process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5.0)
    for stream in (process.stdin, process.stdout):
        try:
            if stream is not None:
                stream.close()
        except (OSError, ValueError):
            pass


class StockfishEngine:
    """One Stockfish process, started lazily, spoken to over UCI; close() stops it (idempotent).

    Args:
        config: Strength and process settings.
    """

    def __init__(self, config: StockfishConfig | None = None) -> None:
        self.config = config or StockfishConfig()
        self.restarts = 0
        self._process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()
        self._closed = False

    # ---- process ----------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The engine's process id while it runs."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def _start(self) -> None:
        binary = find_stockfish(self.config.path)
        try:
            process = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True, bufsize=1)
        except OSError as exc:
            raise EnvCrashed(f"Could not start Stockfish ({binary}): {exc}. {_INSTALL_HINT}") from exc
        self._process = process
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(process, self._lines), daemon=True, name="stockfish-reader").start()
        self._finalizer = weakref.finalize(self, _kill, process)
        self._send("uci")
        self._wait_for("uciok")
        self._send(f"setoption name Threads value {self.config.threads}")
        self._send(f"setoption name Hash value {self.config.hash_mb}")
        if not self.config.deterministic:
            self._send(f"setoption name Skill Level value {self.config.skill_level}")
        self._send("isready")
        self._wait_for("readyok")

    @staticmethod
    def _read(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                lines.put(line.strip())
        except (OSError, ValueError):
            pass
        lines.put(None)  # end of stream: the process died

    def _send(self, command: str) -> None:
        if self._process is None or self._process.stdin is None:
            raise BrokenPipeError("engine not running")
        try:
            self._process.stdin.write(command + "\n")
            self._process.stdin.flush()
        except ValueError as exc:  # write to a closed pipe object
            raise BrokenPipeError(str(exc)) from exc

    def _wait_for(self, prefix: str) -> list[str]:
        """Lines up to and including the first that starts with ``prefix``; raises if the engine dies or hangs."""
        deadline = time.monotonic() + self.config.timeout_s
        lines: list[str] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"Stockfish gave no '{prefix}' within {self.config.timeout_s} s")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise BrokenPipeError("Stockfish exited")
            lines.append(line)
            if line.startswith(prefix):
                return lines

    def _stop_process(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _kill once
            self._finalizer = None
        self._process = None

    # ---- searching ------------------------------------------------------------------------------------------
    def best_move(self, moves: Sequence[str], *, start_fen: str | None = None, rng: np.random.Generator | None = None,
                  full_strength_depth: int | None = None) -> str:
        """The engine's move (UCI) after ``moves`` from ``start_fen`` (default: the initial position).

        Args:
            moves: UCI moves played so far.
            start_fen: Starting position, or ``None`` for the standard one.
            rng: Drives the skill rule in deterministic mode (required there unless full strength).
            full_strength_depth: Ignore the skill settings and search at full strength to this depth
                (used for reference play and analysis).

        Raises:
            EnvCrashed: the engine could not be (re)started or kept dying.
        """
        if self._closed:
            raise EnvCrashed("This StockfishEngine was closed; create a new one.")
        with self._lock:
            last_error: Exception | None = None
            for attempt in range(self.config.max_restarts + 1):
                try:
                    if self._process is None or self._process.poll() is not None:
                        if self._process is not None:
                            self.restarts += 1
                            logger.warning("Stockfish died (exit %s); restarting", self._process.returncode)
                            self._stop_process()
                        self._start()
                    return self._search(list(moves), start_fen, rng, full_strength_depth)
                except (OSError, TimeoutError, _ProtocolError) as exc:
                    last_error = exc
                    logger.warning("Stockfish request failed (attempt %d): %s", attempt + 1, exc)
                    self._stop_process()
                    if attempt < self.config.max_restarts:
                        self.restarts += 1
            raise EnvCrashed(f"Stockfish failed {self.config.max_restarts + 1} times in a row ({last_error}); the "
                             "episode ends with an error.")

    def _search(self, moves: list[str], start_fen: str | None, rng: np.random.Generator | None,
                full_strength_depth: int | None) -> str:
        cfg = self.config
        position = "position startpos" if start_fen is None else f"position fen {start_fen}"
        if moves:
            position += " moves " + " ".join(moves)
        skill = full_strength_depth is None and cfg.skill_level < 20
        emulate = skill and cfg.deterministic
        if cfg.deterministic:
            self._send("ucinewgame")
        self._send(f"setoption name MultiPV value {4 if emulate else 1}")
        self._send("isready")
        self._wait_for("readyok")
        self._send(position)
        limits = []
        if full_strength_depth is not None:
            limits.append(f"depth {full_strength_depth}")
        else:
            depth = cfg.effective_depth()
            if depth is not None:
                limits.append(f"depth {depth}")
            if cfg.nodes is not None:
                limits.append(f"nodes {cfg.nodes}")
            if cfg.movetime_ms is not None:
                limits.append(f"movetime {cfg.movetime_ms}")
        self._send("go " + " ".join(limits or ["depth 1"]))
        lines = self._wait_for("bestmove")
        best = lines[-1].split()
        if len(best) < 2:
            raise _ProtocolError(f"malformed bestmove line {lines[-1]!r}")
        if best[1] in ("(none)", "0000"):
            raise NoLegalMove("Stockfish was asked to move in a finished game (no legal move).")
        if not emulate:
            return best[1]
        candidates = _multipv(lines)
        if len(candidates) <= 1:
            return best[1]
        if rng is None:
            raise ConfigError("A deterministic skill-limited engine needs an rng (np.random.Generator) to pick moves.")
        return pick_skill_move(candidates, cfg.skill_level, rng)

    def close(self) -> None:
        """Stop the engine process (idempotent)."""
        self._closed = True
        with self._lock:
            self._stop_process()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _multipv(lines: Sequence[str]) -> list[_Candidate]:
    """The latest ``(move, score)`` for each MultiPV line of the search output, best first."""
    latest: dict[int, _Candidate] = {}
    for line in lines:
        if not line.startswith("info ") or " multipv " not in line or " pv " not in line or " score " not in line:
            continue
        tokens = line.split()
        try:
            index = int(tokens[tokens.index("multipv") + 1])
            kind, value = tokens[tokens.index("score") + 1], int(tokens[tokens.index("score") + 2])
            move = tokens[tokens.index("pv") + 1]
        except (ValueError, IndexError):
            continue
        if "lowerbound" in tokens or "upperbound" in tokens:
            continue
        score = value if kind == "cp" else (_MATE_CP - abs(value)) * (1 if value > 0 else -1)
        latest[index] = _Candidate(move, score)
    return [latest[i] for i in sorted(latest)]
