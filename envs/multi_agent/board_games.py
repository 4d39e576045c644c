"""Two-player board games whose rules come from OpenSpiel: tic-tac-toe and connect-four (chess: ``chess.py``).

OpenSpiel (Apache-2.0) owns the rules, legal moves, terminal test and returns; this module only turns its
state into text and numbers for agents and reads their moves. The numeric ``observation`` is OpenSpiel's
own observation tensor and the ``action_mask`` covers OpenSpiel's distinct actions, so a numeric agent and
a text agent see the same game.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from agentgym.errors import ConfigError
from agentgym.toolset import ToolResult, ToolSet, tool

from ._deps import require_pyspiel
from .base import TextAECEnv, outcome

__all__ = ["ConnectFourEnv", "OpenSpielGameEnv", "TicTacToeEnv"]

_AGENTS = ("player_0", "player_1")


class OpenSpielGameEnv(TextAECEnv):
    """A two-player, zero-sum, perfect-information OpenSpiel game for text agents.

    ``player_0`` moves first. Rewards: +1 win, -1 loss, 0 draw (component ``outcome``), plus the
    ``invalid_action`` penalty. Success means a win; the score is 1 for a win, 0.5 for a draw, 0 for a loss.

    Args:
        game_name: OpenSpiel's short name (``tic_tac_toe``, ``connect_four``, ``chess``).
        kwargs: See :class:`~agentgym.envs.multi_agent.base.TextAECEnv`.
    """

    #: OpenSpiel player index of player_0 and player_1 (chess numbers Black 0 and White 1).
    spiel_players: ClassVar[tuple[int, int]] = (0, 1)

    def __init__(self, game_name: str, *, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 max_steps: int = 200, max_action_chars: int = 4000, render_mode: str | None = None) -> None:
        pyspiel = require_pyspiel()
        self._game = pyspiel.load_game(game_name)
        self._num_actions = int(self._game.num_distinct_actions())
        self._tensor_shape = tuple(int(d) for d in self._game.observation_tensor_shape())
        self._state = self._game.new_initial_state()
        self._last_move: dict[str, str] = {}
        super().__init__(agents=_AGENTS, invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    # ---- seat <-> OpenSpiel player ------------------------------------------------------------------------
    def _spiel_player(self, agent: str) -> int:
        return self.spiel_players[self.possible_agents.index(agent)]

    def _agent_of(self, player: int) -> str:
        return self.possible_agents[self.spiel_players.index(player)]

    # ---- hooks ----------------------------------------------------------------------------------------------
    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        self._state = self._initial_state(setup)
        self._last_move = {}

    def _initial_state(self, setup: Mapping[str, Any] | None) -> Any:
        if setup:
            raise ConfigError(f"{type(self).__name__} takes no setup options; got {sorted(setup)}.")
        return self._game.new_initial_state()

    def _first_agent(self) -> str:
        return self._agent_of(self._state.current_player())

    def _next_agent(self, agent: str) -> str:
        return self._agent_of(self._state.current_player())

    def _observation_box(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, shape=self._tensor_shape, dtype=np.float32)

    def _observation_array(self, agent: str) -> np.ndarray:
        tensor = np.asarray(self._state.observation_tensor(self._spiel_player(agent)), dtype=np.float32)
        return tensor.reshape(self._tensor_shape)

    def _catalogue_size(self, agent: str) -> int | None:
        return self._num_actions

    def _legal_mask(self, agent: str) -> np.ndarray:
        mask = np.zeros(self._num_actions, dtype=np.int8)
        if not self._state.is_terminal() and self._state.current_player() == self._spiel_player(agent):
            mask[self._state.legal_actions()] = 1
        return mask

    def _apply(self, action: int, label: str) -> str:
        """Play OpenSpiel action ``action`` for the acting agent; end the game if it is over."""
        agent = self.acting_agent
        self._state.apply_action(int(action))
        self._last_move[agent] = label
        self._tell_others(f"{agent} played {label}.")
        if self._state.is_terminal():
            self._finish_from_returns()
        return f"You played {label}."

    def _finish_from_returns(self) -> None:
        returns = self._state.returns()
        rewards = {a: float(returns[self._spiel_player(a)]) for a in self.agents}
        outcomes = {}
        for agent, value in rewards.items():
            result = "win" if value > 0 else "loss" if value < 0 else "draw"
            outcomes[agent] = outcome(success=value > 0, score=(value + 1.0) / 2.0,
                                      end_reason="solved" if value > 0 else "failed", result=result)
        winner = [a for a, v in rewards.items() if v > 0]
        self._end_game(rewards, outcomes, f"{winner[0]} wins." if winner else "It is a draw.")

    def _check_turn(self) -> ToolResult | None:
        if self._state.is_terminal():
            return ToolResult.error("Error: the game is already over.")
        return None


def _as_int(value: Any) -> Any:
    """JSON Schema counts 4.0 as an integer; treat it as 4."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _grid(cells: list[str], width: int) -> str:
    rows = [" ".join(cells[i:i + width]) for i in range(0, len(cells), width)]
    return "\n".join(rows)


class TicTacToeEnv(OpenSpielGameEnv):
    """Tic-tac-toe on OpenSpiel's rules between two text agents: `play(cell)`.

    ## Description

    A PettingZoo AEC env whose rules, legal moves, terminal test and returns come from OpenSpiel. `player_0` is x
    and moves first. The text observation shows the board and the empty cells (0-8, row by row); the numeric
    `observation` is OpenSpiel's observation tensor and the `action_mask` marks the legal cells, so a numeric
    agent and a text agent see the same game.

    ## Tools

    - `play(cell)`: put your mark on an empty cell, 0-8 row by row from the top left.

    ## Reward

    +1 for a win, -1 for a loss, 0 for a draw (component `outcome`), minus `invalid_action_penalty` per rejected
    reply. Success means a win; the score is 1 for a win, 0.5 for a draw, 0 for a loss.

    ## Episode end

    Terminated by a win, a draw, or a forfeit after `max_invalid_actions` bad replies in a row; truncated after
    `max_steps` steps.

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

    metadata: ClassVar[dict[str, Any]] = {"name": "tictactoe_text_v0", "render_modes": ["ansi"],
                                          "is_parallelizable": False}
    description: ClassVar[str] = "Tic-tac-toe (OpenSpiel rules) between two text agents: play(cell) with cell 0-8."
    native_format_hint: ClassVar[str] = "You may also write the move as a function call, e.g. play(4)."

    def __init__(self, *, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 max_steps: int = 60, max_action_chars: int = 4000, render_mode: str | None = None) -> None:
        super().__init__("tic_tac_toe", invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    @tool
    def play(self, cell: int) -> str | ToolResult:
        """Put your mark on an empty cell.

        Args:
            cell: Cell number 0-8, row by row from the top left (0 1 2 / 3 4 5 / 6 7 8).
        """
        if (error := self._check_turn()) is not None:
            return error
        cell = _as_int(cell)
        if isinstance(cell, bool) or not isinstance(cell, int) or cell not in self._state.legal_actions():
            legal = ", ".join(str(a) for a in self._state.legal_actions())
            return ToolResult.error(f"Error: {cell!r} is not an empty cell. Empty cells: {legal}.")
        return self._apply(cell, str(cell))

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.play])

    def _catalogue_action(self, agent: str, index: int) -> str:
        return f"play({index})"

    def _board_cells(self) -> list[str]:
        text = str(self._state).replace("\n", "")
        return ["x" if c == "x" else "o" if c == "o" else str(i) for i, c in enumerate(text)]

    def _render_state(self, agent: str) -> str:
        mark = "x" if agent == "player_0" else "o"
        return f"Tic-tac-toe. You are {mark} ({agent}). Board (numbers are empty cells):\n" + _grid(self._board_cells(), 3)

    def _your_move(self, agent: str) -> str:
        legal = ", ".join(str(a) for a in self._state.legal_actions())
        return f"Your move. Empty cells: {legal}. Call play(cell)."

    def _rules(self, agent: str) -> str:
        mark = "x" if agent == "player_0" else "o"
        return (f"You play tic-tac-toe as {mark} ({agent}); x moves first. Get three of your marks in a row, column "
                "or diagonal to win. Cells are numbered 0-8 row by row from the top left. A move on an occupied cell "
                "is rejected, costs a penalty and you must move again; repeated invalid replies forfeit the game.")

    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """Win if possible, else block, else centre, else a corner, else any cell (ties broken by ``rng``)."""
        legal = list(self._state.legal_actions())
        me = self._spiel_player(agent)
        for player in (me, 1 - me):
            for cell in legal:
                if self._wins_if(player, cell):
                    return f"play({cell})"
        for preferred in ([4], [0, 2, 6, 8]):
            options = [c for c in preferred if c in legal]
            if options:
                return f"play({options[int(rng.integers(len(options)))]})"
        return f"play({legal[int(rng.integers(len(legal)))]})"

    def _wins_if(self, player: int, cell: int) -> bool:
        cells = self._board_cells()
        mark = "x" if player == 0 else "o"
        board = [c if c in "xo" else "." for c in cells]
        board[cell] = mark
        lines = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
        return any(all(board[i] == mark for i in line) for line in lines)

    def minimax_action(self, agent: str) -> str:
        """The perfect-play move (minimax over OpenSpiel states, memoised; first best move in cell order)."""
        me = self._spiel_player(agent)
        memo: dict[str, float] = {}

        def value(state: Any) -> float:
            if state.is_terminal():
                return state.returns()[me]
            key = str(state)
            if key not in memo:
                scores = []
                for a in state.legal_actions():
                    child = state.clone()
                    child.apply_action(a)
                    scores.append(value(child))
                memo[key] = max(scores) if state.current_player() == me else min(scores)
            return memo[key]

        best, best_value = -1, -2.0
        for a in self._state.legal_actions():
            child = self._state.clone()
            child.apply_action(a)
            v = value(child)
            if v > best_value:
                best, best_value = a, v
        return f"play({best})"


class ConnectFourEnv(OpenSpielGameEnv):
    """Connect-four on OpenSpiel's rules (6 rows x 7 columns) between two text agents: `play(column)`.

    ## Description

    A PettingZoo AEC env whose rules, legal moves, terminal test and returns come from OpenSpiel. `player_0` is x
    and moves first. The text observation shows the board and the columns that are not full (0-6); the numeric
    `observation` is OpenSpiel's observation tensor and the `action_mask` marks the legal columns, so a numeric
    agent and a text agent see the same game.

    ## Tools

    - `play(column)`: drop a disc into a column that is not full, 0-6 from the left.

    ## Reward

    +1 for a win, -1 for a loss, 0 for a draw (component `outcome`), minus `invalid_action_penalty` per rejected
    reply. Success means a win; the score is 1 for a win, 0.5 for a draw, 0 for a loss.

    ## Episode end

    Terminated by a win, a draw, or a forfeit after `max_invalid_actions` bad replies in a row; truncated after
    `max_steps` steps.

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

    metadata: ClassVar[dict[str, Any]] = {"name": "connectfour_text_v0", "render_modes": ["ansi"],
                                          "is_parallelizable": False}
    description: ClassVar[str] = "Connect-four (OpenSpiel rules) between two text agents: play(column) with column 0-6."
    native_format_hint: ClassVar[str] = "You may also write the move as a function call, e.g. play(3)."

    def __init__(self, *, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 max_steps: int = 200, max_action_chars: int = 4000, render_mode: str | None = None) -> None:
        super().__init__("connect_four", invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    @tool
    def play(self, column: int) -> str | ToolResult:
        """Drop a disc into a column.

        Args:
            column: Column number 0-6 from the left; it must not be full.
        """
        if (error := self._check_turn()) is not None:
            return error
        column = _as_int(column)
        if isinstance(column, bool) or not isinstance(column, int) or column not in self._state.legal_actions():
            legal = ", ".join(str(a) for a in self._state.legal_actions())
            return ToolResult.error(f"Error: {column!r} is not an open column. Open columns: {legal}.")
        return self._apply(column, f"column {column}")

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.play])

    def _catalogue_action(self, agent: str, index: int) -> str:
        return f"play({index})"

    def _render_state(self, agent: str) -> str:
        disc = "x" if agent == "player_0" else "o"
        rows = str(self._state).strip().splitlines()
        board = "\n".join(" ".join(row) for row in rows)
        return (f"Connect-four. You are {disc} ({agent}). Board, top row first ('.' is empty):\n{board}\n"
                + " ".join(str(c) for c in range(7)))

    def _your_move(self, agent: str) -> str:
        legal = ", ".join(str(a) for a in self._state.legal_actions())
        return f"Your move. Open columns: {legal}. Call play(column)."

    def _rules(self, agent: str) -> str:
        disc = "x" if agent == "player_0" else "o"
        return (f"You play connect-four as {disc} ({agent}); x moves first. Drop discs into columns 0-6; a disc falls "
                "to the lowest empty row. Four of your discs in a row, column or diagonal win. A move into a full "
                "column is rejected, costs a penalty and you must move again; repeated invalid replies forfeit.")

    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """Win if possible, else block an immediate win, else prefer central columns (ties broken by ``rng``)."""
        legal = list(self._state.legal_actions())
        me = self._spiel_player(agent)
        for col in legal:
            child = self._state.clone()
            child.apply_action(col)
            if child.is_terminal() and child.returns()[me] > 0:
                return f"play({col})"
        for col in legal:  # would the opponent win there if it were its move?
            if self._opponent_wins_at(col, me):
                return f"play({col})"
        weights = np.array([4 - abs(3 - c) for c in legal], dtype=np.float64)
        return f"play({legal[int(rng.choice(len(legal), p=weights / weights.sum()))]})"

    def _opponent_wins_at(self, column: int, me: int) -> bool:
        rows = [list(r) for r in str(self._state).strip().splitlines()]
        mine = "x" if me == 0 else "o"
        theirs = "o" if mine == "x" else "x"
        row = max((r for r in range(6) if rows[r][column] == "."), default=None)
        if row is None:
            return False
        rows[row][column] = theirs
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, column + sign * dc
                while 0 <= r < 6 and 0 <= c < 7 and rows[r][c] == theirs:
                    count += 1
                    r, c = r + sign * dr, c + sign * dc
            if count >= 4:
                return True
        return False
