"""Chess between text agents, on OpenSpiel's rules (Apache-2.0; the GPL ``chess`` package is not used).

Agents write moves in UCI (``move("e2e4")``, ``move("e7e8q")``) or SAN (``move("Nf3")``, ``move("O-O")``);
check marks, ``=`` and ``-`` are optional. The observation lists every legal move in both notations, and
the game keeps the start FEN and the UCI move list so that an engine (Stockfish over UCI) can be asked
about the exact game, repetition history included.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from agentgym.errors import ConfigError
from agentgym.toolset import ToolResult, ToolSet, tool

from ._deps import require_pyspiel
from .board_games import OpenSpielGameEnv

__all__ = ["START_FEN", "ChessEnv", "LegalMove"]

START_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
_UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")


class LegalMove(tuple[str, str, int]):
    """``(san, uci, action)`` of one legal move."""

    @property
    def san(self) -> str:
        return self[0]

    @property
    def uci(self) -> str:
        return self[1]

    @property
    def action(self) -> int:
        return self[2]


def _normalise(text: str) -> str:
    """Fold the spellings of one move together: ``e2-e4`` / ``E2E4`` / ``Nf3+`` / ``0-0`` / ``e8=Q``."""
    move = text.strip().strip("\"'`.").replace("0-0-0", "O-O-O").replace("0-0", "O-O")
    move = move.rstrip("+#!?")
    if move.upper() in ("O-O", "O-O-O"):
        return move.upper()
    squashed = move.replace("-", "").replace("=", "").replace(" ", "")
    if _UCI.match(squashed.lower()):
        return squashed.lower()
    return move.replace("=", "")


class ChessEnv(OpenSpielGameEnv):
    """Chess on OpenSpiel's rules between two text agents: `move("e2e4")` in UCI or SAN.

    ## Description

    A PettingZoo AEC env; `player_0` is White, `player_1` is Black. OpenSpiel (Apache-2.0) owns the rules: checkmate
    wins; stalemate, repetition, the 50-move rule and insufficient material draw. The observation lists every legal
    move in both notations, and the game keeps the start FEN and the UCI move list so that an engine (Stockfish
    over UCI) can be asked about the exact game. A game may start from a FEN:
    `reset(options={"setup": {"fen": "..."}})`.

    ## Tools

    - `move(move)`: play a legal move in UCI (`e2e4`, `e7e8q`) or SAN (`Nf3`, `O-O`); check marks, `=` and `-` are
      optional.

    ## Reward

    +1 for a win, -1 for a loss, 0 for a draw (component `outcome`), minus `invalid_action_penalty` per rejected
    reply. Success means a win; the score is 1 for a win, 0.5 for a draw, 0 for a loss.

    ## Episode end

    Terminated by checkmate, a draw, or a forfeit after `max_invalid_actions` bad replies in a row; truncated after
    `max_steps` steps (moves and rejected replies of both sides).

    ## Arguments

    - `invalid_action_penalty`: subtracted from an agent's reward for each reply that makes no legal move
      (component `invalid_action`).
    - `max_invalid_actions`: bad replies in a row after which the agent forfeits (`None`: never).
    - `max_steps`: steps (good or bad replies of all agents) after which every agent is truncated.
    - `max_action_chars`: longer replies are rejected as invalid.
    - `render_mode`: `"ansi"` (the whole game state as text) or `None`.

    ## Version history

    - v0: the first version.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "chess_text_v0", "render_modes": ["ansi"], "is_parallelizable": False}
    description: ClassVar[str] = "Chess (OpenSpiel rules) between text agents: move(\"e2e4\") in UCI or SAN."
    native_format_hint: ClassVar[str] = 'You may also write the move as a function call, e.g. move("e2e4") or move("Nf3").'
    spiel_players: ClassVar[tuple[int, int]] = (1, 0)  # OpenSpiel: Black is player 0, White is player 1

    def __init__(self, *, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 max_steps: int = 600, max_action_chars: int = 4000, render_mode: str | None = None) -> None:
        self._pyspiel = require_pyspiel()
        self.start_fen = START_FEN
        self.uci_moves: list[str] = []
        self._legal_cache: tuple[int, list[LegalMove], dict[str, int]] | None = None
        super().__init__("chess", invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    # ---- state ------------------------------------------------------------------------------------------
    def _initial_state(self, setup: Mapping[str, Any] | None) -> Any:
        setup = dict(setup or {})
        fen = setup.pop("fen", None)
        if setup:
            raise ConfigError(f"ChessEnv setup takes only 'fen'; got unknown keys {sorted(setup)}.")
        self.uci_moves = []
        self._legal_cache = None
        if fen is None:
            self.start_fen = START_FEN
            return self._game.new_initial_state()
        try:
            state = self._game.new_initial_state(str(fen))
        except Exception as exc:
            raise ConfigError(f"Invalid FEN {fen!r}: {exc}") from exc
        self.start_fen = str(fen)
        return state

    @property
    def fen(self) -> str:
        """FEN of the current position."""
        return str(self._state)

    def legal_moves(self) -> list[LegalMove]:
        """Every legal move of the side to move, as ``(san, uci, action)``, in OpenSpiel's order."""
        ply = len(self.uci_moves)
        if self._legal_cache is None or self._legal_cache[0] != ply:
            if self._state.is_terminal():
                moves: list[LegalMove] = []
            else:
                board = self._state.board()
                player = self._state.current_player()
                moves = [
                    LegalMove((self._state.action_to_string(player, a),
                               self._pyspiel.chess.action_to_move(a, board).to_lan(), int(a)))
                    for a in self._state.legal_actions()
                ]
            table: dict[str, int] = {}
            for move in moves:
                table[_normalise(move.uci)] = move.action
                table[_normalise(move.san)] = move.action
            self._legal_cache = (ply, moves, table)
        return list(self._legal_cache[1])

    def _lookup(self, text: str) -> LegalMove | None:
        self.legal_moves()
        assert self._legal_cache is not None
        action = self._legal_cache[2].get(_normalise(text))
        if action is None:
            return None
        return next(m for m in self._legal_cache[1] if m.action == action)

    # ---- tool -----------------------------------------------------------------------------------------------
    @tool
    def move(self, move: str) -> str | ToolResult:
        """Make a chess move.

        Args:
            move: The move in UCI (e2e4, e7e8q) or SAN (Nf3, exd5, O-O, e8=Q).
        """
        if (error := self._check_turn()) is not None:
            return error
        found = self._lookup(move) if isinstance(move, str) else None
        if found is None:
            legal = " ".join(m.uci for m in self.legal_moves())
            return ToolResult.error(f"Error: {move!r} is not a legal move in this position. Legal moves (UCI): {legal}.")
        self.uci_moves.append(found.uci)
        return self._apply(found.action, f"{found.san} ({found.uci})")

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.move])

    def _raw_argument_tools(self) -> dict[str, str]:
        return {"move": "move"}

    def play_uci(self, uci: str) -> str:
        """The canonical action text for a UCI move (what engines and bots send to ``step``)."""
        return f'move("{uci}")'

    def _catalogue_action(self, agent: str, index: int) -> str:
        if self._state.is_terminal():
            return 'move("0000")'
        move = self._pyspiel.chess.action_to_move(int(index), self._state.board())
        return self.play_uci(move.to_lan())

    # ---- text -------------------------------------------------------------------------------------------------
    def _board_text(self) -> str:
        placement = self.fen.split()[0]
        rows = []
        for rank_index, rank in enumerate(placement.split("/")):
            cells = []
            for ch in rank:
                cells.extend(["."] * int(ch) if ch.isdigit() else [ch])
            rows.append(f"{8 - rank_index} " + " ".join(cells))
        rows.append("  a b c d e f g h")
        return "\n".join(rows)

    def _render_state(self, agent: str) -> str:
        colour = "White" if agent == "player_0" else "Black"
        side = "White" if self.fen.split()[1] == "w" else "Black"
        return (f"Chess. You are {colour} ({agent}); uppercase letters are White, lowercase Black.\n"
                f"{self._board_text()}\nFEN: {self.fen}\nSide to move: {side}. Moves played: {len(self.uci_moves)}.")

    def _your_move(self, agent: str) -> str:
        legal = ", ".join(f"{m.san} ({m.uci})" for m in self.legal_moves())
        return f"Your move. Legal moves: {legal}. Call move(\"<uci or san>\")."

    def _rules(self, agent: str) -> str:
        colour = "White" if agent == "player_0" else "Black"
        return (f"You play chess as {colour} ({agent}). Standard rules: checkmate wins; stalemate, repetition, the "
                "50-move rule and insufficient material draw. Write moves in UCI (e2e4, e7e8q) or SAN (Nf3, O-O). "
                "Each observation lists the legal moves. An illegal or unreadable move is rejected, costs a penalty "
                "and you must move again; repeated invalid replies forfeit the game. Win: +1, draw: 0, loss: -1.")

    def _truncation_outcome(self, agent: str) -> dict[str, Any]:
        from .base import outcome

        return outcome(success=False, score=0.5, end_reason="max_turns", result="truncated")

    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """A one-ply bot: mate if possible, else the most valuable capture, else a random move."""
        values = {"p": 1, "n": 3, "b": 3, "r": 5, "q": 9}
        moves = self.legal_moves()
        mates = [m for m in moves if m.san.endswith("#")]
        if mates:
            return self.play_uci(mates[0].uci)
        pieces = self._pieces()
        best: list[LegalMove] = []
        best_value = 0
        for m in moves:
            value = values.get(pieces.get(m.uci[2:4], "").lower(), 0)
            if value > best_value:
                best, best_value = [m], value
            elif value == best_value and value > 0:
                best.append(m)
        pool = best or moves
        return self.play_uci(pool[int(rng.integers(len(pool)))].uci)

    def _pieces(self) -> dict[str, str]:
        """Square name -> piece letter, from the FEN."""
        pieces: dict[str, str] = {}
        for rank_index, rank in enumerate(self.fen.split()[0].split("/")):
            file = 0
            for ch in rank:
                if ch.isdigit():
                    file += int(ch)
                else:
                    pieces[f"{chr(ord('a') + file)}{8 - rank_index}"] = ch
                    file += 1
        return pieces
