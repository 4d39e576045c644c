"""SelfPlay: one seat of a multi-agent game as a single-agent :class:`~agentgym.env.AgentEnv`.

Every single-agent trainer (GRPO, ARPO, ArCHer, GiGPO) and the rollout engine work on ``AgentEnv``; this
wrapper lets them train on games. The learner's reply goes to the game unchanged (the game parses it,
so turn kinds, errors and the invalid-move penalty are the game's own), then the opponents of the other
seats move until it is the learner's turn again or the game is over. The learner's reward for a step is
the sum of its named reward components over its own move and the opponents' replies (a game can end on
an opponent's move).

Opponents are anything in :mod:`~agentgym.envs.multi_agent.opponents`: random or scripted bots,
Stockfish, a policy, a frozen checkpoint of the learner, or a league of those. Each episode derives the
game seed and every opponent's RNG from the env's ``np_random``, so episodes replay exactly from their seed.
An opponent that fails for reasons outside the game (a dead engine, a failing model server) ends the
episode with ``end_reason="error"``.

The registered ids (``agentgym/Chess-vs-Stockfish-v0``, ``agentgym/Negotiation-SelfPlay-v0``, ...) are
small subclasses at the end of this module that pick a game, default opponents and a turn budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.errors import ConfigError, EnvCrashed, TaskError, did_you_mean
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolSet
from agentgym.trajectory import END_REASONS

from .base import TextAECEnv
from .board_games import ConnectFourEnv, TicTacToeEnv
from .chess import START_FEN, ChessEnv
from .negotiation import NegotiationEnv
from .opponents import Opponent, RandomOpponent, ScriptedOpponent, StockfishOpponent
from .prisoners_dilemma import PrisonersDilemmaEnv
from .referential import ReferentialEnv
from .stockfish import StockfishConfig

__all__ = [
    "ChessVsStockfishEnv",
    "ConnectFourSelfPlayEnv",
    "NegotiationSelfPlayEnv",
    "PrisonersDilemmaSelfPlayEnv",
    "ReferentialSelfPlayEnv",
    "SelfPlay",
    "TicTacToeSelfPlayEnv",
]


class SelfPlay(AgentEnv):
    """Turn seat ``learner`` of an AEC text game into a single-agent env.

    Args:
        game: The multi-agent game (a :class:`~agentgym.envs.multi_agent.base.TextAECEnv`); SelfPlay owns it
            and closes it.
        opponents: One opponent for every other seat, or a mapping ``seat -> opponent`` (then the learner is
            the one seat without an opponent).
        learner: The learner's seat; ``None`` lets each task choose (``metadata["seat"]``) or else draws a
            seat per episode from the env's RNG, so the learner plays every side.
        max_turns: Learner turns (including rejected replies) before truncation.
        tasks: Fixed games to draw from: ``Task.metadata`` may hold ``setup`` (passed to the game) and ``seat``.
        max_action_chars: See :class:`~agentgym.env.AgentEnv`.
        render_mode: ``"ansi"`` or ``None``.
    """

    description: ClassVar[str] = "One seat of a multi-agent game against fixed opponents."

    def __init__(
        self,
        game: TextAECEnv,
        opponents: Opponent | Mapping[str, Opponent],
        *,
        learner: str | None = None,
        max_turns: int = 50,
        tasks: Sequence[Task] | None = None,
        max_action_chars: int = 20_000,
        render_mode: str | None = None,
    ) -> None:
        if not isinstance(game, TextAECEnv):
            raise ConfigError(f"SelfPlay needs a TextAECEnv game, got {type(game).__name__}.")
        seats = list(game.possible_agents)
        if learner is not None and learner not in seats:
            raise ConfigError(f"Unknown learner seat {learner!r}.{did_you_mean(learner, seats)} Seats: {seats}.")
        if isinstance(opponents, Mapping):
            unknown = set(opponents) - set(seats)
            if unknown:
                raise ConfigError(f"Opponents for unknown seats {sorted(unknown)}; the game's seats are {seats}.")
            if not all(isinstance(o, Opponent) for o in opponents.values()):
                raise ConfigError("Every opponent must be an Opponent (RandomOpponent, ScriptedOpponent, ...).")
        elif not isinstance(opponents, Opponent):
            raise ConfigError(f"opponents must be an Opponent or a mapping seat -> Opponent, got "
                              f"{type(opponents).__name__}.")
        elif len(seats) > 2:
            raise ConfigError("One opponent object can play only one seat; pass a mapping seat -> Opponent for games "
                              "with more than two seats.")
        self.game = game
        self.opponents = opponents
        self.fixed_learner = learner
        self.learner = learner or seats[0]
        self._seat_opponents: dict[str, Opponent] = {}
        self._pending: dict[str, float] = {}
        self._opponent_log: list[dict[str, Any]] = []
        all_opponents = list(opponents.values()) if isinstance(opponents, Mapping) else [opponents]
        self.cheap_steps = bool(game.cheap_steps and all(o.cheap for o in all_opponents))
        self.native_format_hint = game.native_format_hint
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=1,
                         render_mode=render_mode)

    # ---- AgentEnv hooks ---------------------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return self.game.toolset(self.learner)

    def _build_parser(self) -> ToolCallParser:
        return self.game.parser(self.learner)

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return Task(id=f"game-{int(rng.integers(2**31 - 1))}", prompt=type(self.game).description)

    def _task_instructions(self) -> str:
        return self.game.rules(self.learner)

    def _choose_seat(self, task: Task) -> str:
        seats = list(self.game.possible_agents)
        seat = task.metadata.get("seat") if isinstance(task.metadata, Mapping) else None
        if seat is None:
            if self.fixed_learner is not None:
                return self.fixed_learner
            candidates = [s for s in seats if not (isinstance(self.opponents, Mapping) and s in self.opponents)]
            return candidates[int(self.np_random.integers(len(candidates)))]
        if seat not in seats:
            raise TaskError(f"Task {task.id!r} names seat {seat!r}.{did_you_mean(str(seat), seats)} Seats: {seats}.")
        return str(seat)

    def _begin_episode(self, task: Task) -> str:
        seat = self._choose_seat(task)
        if isinstance(self.opponents, Mapping):
            missing = [s for s in self.game.possible_agents if s != seat and s not in self.opponents]
            if missing:
                raise ConfigError(f"No opponent for seat(s) {missing} when the learner plays {seat!r}.")
            self._seat_opponents = {s: self.opponents[s] for s in self.game.possible_agents if s != seat}
        else:
            self._seat_opponents = {s: self.opponents for s in self.game.possible_agents if s != seat}
        seed = int(self.np_random.integers(2**31 - 1))
        setup = task.metadata.get("setup") if isinstance(task.metadata, Mapping) else None
        self.game.reset(seed=seed, options={"setup": setup} if setup is not None else None)
        self.learner = seat
        self.toolset = self.game.toolset(seat)
        self.parser = self.game.parser(seat)
        for index, (other, opponent) in enumerate(self._seat_opponents.items()):
            opponent.reset(self.game, other, np.random.default_rng([seed, index]))
        self._pending = {}
        self._opponent_log = []
        self._advance()
        return self.game.observe(seat)["text"]

    # ---- the turn -------------------------------------------------------------------------------------------------
    def _game_done(self) -> bool:
        game = self.game
        return bool(game.game_over or game.terminations.get(self.learner) or game.truncations.get(self.learner))

    def _collect(self) -> None:
        for name, value in self.game.reward_components.get(self.learner, {}).items():
            self._pending[name] = self._pending.get(name, 0.0) + value

    def _advance(self) -> None:
        """Let the opponents move until it is the learner's turn or the game is over."""
        game = self.game
        for _ in range(game.max_steps + 1):
            if self._game_done() or game.agent_selection == self.learner:
                return
            agent = game.agent_selection
            opponent = self._seat_opponents[agent]
            try:
                action = opponent.act(game, agent)
            except EnvCrashed:
                raise
            except Exception as exc:
                raise EnvCrashed(f"opponent {opponent.name} ({agent}) failed: {type(exc).__name__}: {exc}") from exc
            game.step(action)
            self._opponent_log.append({"agent": agent, "opponent": opponent.name, "action": action,
                                       "kind": game.infos[agent]["turn"]["kind"]})
            self._collect()
        raise EnvCrashed(f"the opponents did not hand the turn back within {game.max_steps} steps")

    def _finish_from_game(self) -> None:
        result = self.game.infos[self.learner].get("outcome") or {}
        reason = str(result.get("end_reason", "failed"))
        self.finish(success=bool(result.get("success", False)), score=float(result.get("score", 0.0)),
                    reason=reason if reason in END_REASONS else "failed")

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        self._opponent_log = []
        if self._game_done():
            kind = "void"
        else:
            self._pending = {}
            self.game.step(action)
            turn = self.game.infos[self.learner].get("turn", {})
            for key in ("calls", "errors", "tool_errors"):
                turn_info[key] = list(turn.get(key, []))
            kind = str(turn.get("kind", "invalid"))
            self._collect()
            self._advance()
        for name, value in self._pending.items():
            self.add_reward(name, value)
        self._pending = {}
        turn_info["opponents"] = list(self._opponent_log)
        if self._game_done():
            self._finish_from_game()
        return self.game.observe(self.learner)["text"], kind

    def state_key(self) -> str:
        """The game state as the learner's seat sees it (board and side to move, standing offer, moves left),
        without the opponents' move messages or a rejected move's error: an illegal move that is refused keeps
        the key, and two move orders that reach the same position share it. Hidden information (the other
        seat's values, the referential target for the listener) stays out, as in the learner's view."""
        suffix = "\n(game over)" if self._game_done() else ""
        return f"{self.learner}\n{self.game._render_state(self.learner)}{suffix}"

    # ---- solvers, rendering, closing ---------------------------------------------------------------------------
    def reference_solver(self) -> ReferenceSolver:
        """The game's omniscient reference move for the learner's seat, if the game has one."""
        if not hasattr(self.game, "reference_action"):
            raise NotImplementedError(f"{type(self.game).__name__} has no reference_action.")
        return lambda observation: self.game.reference_action(self.learner)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join([super().render() or "", self.game._render_state(self.learner)])

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        opponents = list(self.opponents.values()) if isinstance(self.opponents, Mapping) else [self.opponents]
        for opponent in opponents:
            opponent.close()
        self.game.close()
        super().close()


def _simple_opponent(opponent: str | Opponent) -> Opponent:
    if isinstance(opponent, Opponent):
        return opponent
    choices = {"scripted": ScriptedOpponent, "random": RandomOpponent}
    if opponent not in choices:
        raise ConfigError(f"Unknown opponent {opponent!r}.{did_you_mean(str(opponent), choices)} Use 'scripted', "
                          "'random' or an Opponent instance.")
    return choices[opponent]()


class ChessVsStockfishEnv(SelfPlay):
    """Chess against Stockfish over UCI (skill 0 by default) as White or Black: `move("e2e4")`.

    ## Description

    One seat of `agentgym/Chess-v0` (OpenSpiel's rules) as a single-agent env, against Stockfish run as a UCI
    subprocess. The learner plays White or Black, drawn per episode unless `learner` fixes it. The learner's reply
    goes to the game unchanged, then the opponent moves until it is the learner's turn again or the game is over
    (its moves appear in the observation and in `info["turn"]["opponents"]`). Each episode derives the game seed and
    the opponent's RNG from the env's seed, so episodes replay exactly. Needs a Stockfish binary.

    ## Tools

    - `move(move)`: play a legal move in UCI (`e2e4`, `e7e8q`) or SAN (`Nf3`, `O-O`).

    ## Reward

    The step reward is the sum of the game's reward components for the learner over its move and the opponent's
    replies, including `invalid_action` (minus `invalid_action_penalty` per rejected reply); the last step pays the
    rest of the outcome, so the return is the learner's score in the game: 1 for a win, 0.5 for a draw, 0 for a
    loss. Success means a win.

    ## Episode end

    Terminated when the game ends (including a forfeit after `max_invalid_actions` rejected replies in a row, and an
    opponent failing for reasons outside the game, with `end_reason="error"`); truncated after `max_turns` learner
    turns, rejected replies included.

    ## Arguments

    - `skill_level`: Stockfish's `Skill Level`, 0 (weakest, the default) to 20; each level searches to the depth
      Stockfish's own skill rule picks at (`1 + skill_level`), so levels play as in Stockfish.
    - `depth`: search depth at level 20 only (`None`: `stockfish.FULL_STRENGTH_DEPTH`); see `StockfishConfig`.
    - `deterministic`: reproduce Stockfish's skill rule with the episode RNG.
    - `stockfish_path`: the binary (default: `$AGENTGYM_STOCKFISH`, PATH, /usr/games/stockfish).
    - `reference_depth`: depth of the full-strength Stockfish that plays the reference solution.
    - `learner`: `player_0` (White), `player_1` (Black) or `None` (drawn per episode).
    - `max_turns`: learner turns before truncation.
    - `invalid_action_penalty`: penalty per rejected reply (component `invalid_action`).
    - `max_invalid_actions`: rejected replies in a row that forfeit the game (`None`: never).
    - `tasks`: optional fixed games (`metadata`: `setup: {"fen": ...}`, `seat`).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Chess against Stockfish (skill 0 by default) as White or Black: move(\"e2e4\")."

    def __init__(self, *, skill_level: int = 0, depth: int | None = None, deterministic: bool = True,
                 stockfish_path: str | None = None, reference_depth: int = 6, learner: str | None = None,
                 max_turns: int = 150, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 tasks: Sequence[Task] | None = None, max_action_chars: int = 20_000,
                 render_mode: str | None = None) -> None:
        if reference_depth < 1:
            raise ConfigError(f"reference_depth must be >= 1, got {reference_depth}.")
        config = StockfishConfig(path=stockfish_path, skill_level=skill_level, depth=depth, deterministic=deterministic)
        self.reference_depth = int(reference_depth)
        self.stockfish = StockfishOpponent(config)
        game = ChessEnv(invalid_action_penalty=invalid_action_penalty, max_invalid_actions=max_invalid_actions,
                        max_steps=2 * max_turns + 2, max_action_chars=max_action_chars)
        super().__init__(game, self.stockfish, learner=learner, max_turns=max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    def reference_solver(self) -> ReferenceSolver:
        """Full-strength Stockfish at ``reference_depth`` plays the learner's moves (it beats skill 0)."""
        game = self.game
        assert isinstance(game, ChessEnv)

        def solve(observation: str) -> str:
            start = None if game.start_fen == START_FEN else game.start_fen
            move = self.stockfish.engine.best_move(game.uci_moves, start_fen=start,
                                                   full_strength_depth=self.reference_depth)
            return game.play_uci(move)

        return solve


class NegotiationSelfPlayEnv(SelfPlay):
    """Deal or no deal against a scripted negotiator: `propose(book, hat, ball)`, `accept()`, `walk_away()`.

    ## Description

    One seat of `agentgym/Negotiation-v0` (Lewis et al., 2017) as a single-agent env, against a scripted aspiration
    negotiator (or a random one). Both sides have private values for the books, hats and balls, each pool worth 10
    to each side; a split worth at least half to both always exists. The learner's reply goes to the game unchanged,
    then the opponent moves until it is the learner's turn again or the game is over (its moves appear in the
    observation and in `info["turn"]["opponents"]`). Each episode derives the game seed and the opponent's RNG from
    the env's seed, so episodes replay exactly.

    ## Tools

    - `propose(book, hat, ball, message)`: propose a split by the counts you keep, with an optional message.
    - `accept()`: accept the opponent's standing proposal; this ends the game with a deal.
    - `walk_away()`: end the negotiation without a deal (both get 0).

    ## Reward

    The step reward is the sum of the game's reward components for the learner over its move and the opponent's
    replies, including `invalid_action` (minus `invalid_action_penalty` per rejected reply); the last step pays the
    rest of the outcome, so the return is the learner's score in the game: the value of the learner's share of a
    deal divided by its value of the whole pool (component `deal_value`), 0 for no deal. Success means a deal worth
    at least `success_share`.

    ## Episode end

    Terminated when the game ends (including a forfeit after `max_invalid_actions` rejected replies in a row, and an
    opponent failing for reasons outside the game, with `end_reason="error"`); truncated after `max_turns` learner
    turns, rejected replies included. A game also ends with no deal after `max_moves` proposals.

    ## Arguments

    - `opponent`: `"scripted"` (default), `"random"` or any `Opponent`.
    - `learner`: `player_0` (moves first), `player_1` or `None` (the task's seat, else drawn per episode).
    - `max_moves`: proposals allowed in all before "no deal".
    - `success_share`: share of its total value a deal must give the learner to count as a success.
    - `max_turns`: learner turns before truncation.
    - `invalid_action_penalty`: penalty per rejected reply (component `invalid_action`).
    - `max_invalid_actions`: rejected replies in a row that forfeit the game (`None`: never).
    - `tasks`: optional fixed games (see `agentgym.envs.multi_agent.negotiation.generate_tasks`).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = ("Deal or no deal against a scripted negotiator: propose(book, hat, ball), accept(), "
                                  "walk_away().")

    def __init__(self, *, opponent: str | Opponent = "scripted", learner: str | None = None, max_moves: int = 10,
                 success_share: float = 0.5, max_turns: int = 20, invalid_action_penalty: float = 0.1,
                 max_invalid_actions: int | None = 3, tasks: Sequence[Task] | None = None,
                 max_action_chars: int = 20_000, render_mode: str | None = None) -> None:
        game = NegotiationEnv(max_action_chars=max_action_chars, max_moves=max_moves, success_share=success_share,
                              invalid_action_penalty=invalid_action_penalty, max_invalid_actions=max_invalid_actions,
                              max_steps=2 * max_turns + 2)
        super().__init__(game, _simple_opponent(opponent), learner=learner, max_turns=max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, render_mode=render_mode)


class TicTacToeSelfPlayEnv(SelfPlay):
    """Tic-tac-toe against a scripted bot (win, block, centre, corner) or a random player: `play(cell)`.

    ## Description

    One seat of `agentgym/TicTacToe-v0` (OpenSpiel's rules) as a single-agent env. The scripted bot wins when it
    can, blocks the learner's win, then takes the centre, then a corner. The learner's reply goes to the game
    unchanged, then the opponent moves until it is the learner's turn again or the game is over (its moves appear in
    the observation and in `info["turn"]["opponents"]`). Each episode derives the game seed and the opponent's RNG
    from the env's seed, so episodes replay exactly.

    ## Tools

    - `play(cell)`: put your mark on an empty cell, 0-8 row by row from the top left.

    ## Reward

    The step reward is the sum of the game's reward components for the learner over its move and the opponent's
    replies, including `invalid_action` (minus `invalid_action_penalty` per rejected reply); the last step pays the
    rest of the outcome, so the return is the learner's score in the game: 1 for a win, 0.5 for a draw, 0 for a
    loss. Success means a win.

    ## Episode end

    Terminated when the game ends (including a forfeit after `max_invalid_actions` rejected replies in a row, and an
    opponent failing for reasons outside the game, with `end_reason="error"`); truncated after `max_turns` learner
    turns, rejected replies included.

    ## Arguments

    - `opponent`: `"scripted"` (default), `"random"` or any `Opponent`.
    - `learner`: `player_0` (x, first), `player_1` or `None` (drawn per episode).
    - `max_turns`: learner turns before truncation.
    - `invalid_action_penalty`: penalty per rejected reply (component `invalid_action`).
    - `max_invalid_actions`: rejected replies in a row that forfeit the game (`None`: never).
    - `tasks`: optional fixed games (`metadata["seat"]`).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Tic-tac-toe against a scripted bot: play(cell)."

    def __init__(self, *, opponent: str | Opponent = "scripted", learner: str | None = None, max_turns: int = 15,
                 invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 tasks: Sequence[Task] | None = None, max_action_chars: int = 20_000,
                 render_mode: str | None = None) -> None:
        game = TicTacToeEnv(invalid_action_penalty=invalid_action_penalty, max_invalid_actions=max_invalid_actions,
                            max_steps=2 * max_turns + 2, max_action_chars=max_action_chars)
        super().__init__(game, _simple_opponent(opponent), learner=learner, max_turns=max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    def reference_solver(self) -> ReferenceSolver:
        """Perfect play (minimax): never loses."""
        game = self.game
        assert isinstance(game, TicTacToeEnv)
        return lambda observation: game.minimax_action(self.learner)


class ConnectFourSelfPlayEnv(SelfPlay):
    """Connect-four against a scripted bot (win, block, prefer the centre) or a random player: `play(column)`.

    ## Description

    One seat of `agentgym/ConnectFour-v0` (OpenSpiel's rules) as a single-agent env. The scripted bot wins when it
    can, blocks the learner's win, else prefers the centre columns. The learner's reply goes to the game unchanged,
    then the opponent moves until it is the learner's turn again or the game is over (its moves appear in the
    observation and in `info["turn"]["opponents"]`). Each episode derives the game seed and the opponent's RNG from
    the env's seed, so episodes replay exactly.

    ## Tools

    - `play(column)`: drop a disc into a column that is not full, 0-6 from the left.

    ## Reward

    The step reward is the sum of the game's reward components for the learner over its move and the opponent's
    replies, including `invalid_action` (minus `invalid_action_penalty` per rejected reply); the last step pays the
    rest of the outcome, so the return is the learner's score in the game: 1 for a win, 0.5 for a draw, 0 for a
    loss. Success means a win.

    ## Episode end

    Terminated when the game ends (including a forfeit after `max_invalid_actions` rejected replies in a row, and an
    opponent failing for reasons outside the game, with `end_reason="error"`); truncated after `max_turns` learner
    turns, rejected replies included.

    ## Arguments

    - `opponent`: `"scripted"` (default), `"random"` or any `Opponent`.
    - `learner`: `player_0` (x, first), `player_1` or `None` (drawn per episode).
    - `max_turns`: learner turns before truncation.
    - `invalid_action_penalty`: penalty per rejected reply (component `invalid_action`).
    - `max_invalid_actions`: rejected replies in a row that forfeit the game (`None`: never).
    - `tasks`: optional fixed games (`metadata["seat"]`).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Connect-four against a scripted bot: play(column)."

    def __init__(self, *, opponent: str | Opponent = "scripted", learner: str | None = None, max_turns: int = 40,
                 invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 tasks: Sequence[Task] | None = None, max_action_chars: int = 20_000,
                 render_mode: str | None = None) -> None:
        game = ConnectFourEnv(invalid_action_penalty=invalid_action_penalty, max_invalid_actions=max_invalid_actions,
                              max_steps=2 * max_turns + 2, max_action_chars=max_action_chars)
        super().__init__(game, _simple_opponent(opponent), learner=learner, max_turns=max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    def reference_solver(self) -> ReferenceSolver:
        """The scripted bot's policy for the learner's seat (win, block, centre); good, not perfect."""
        game = self.game
        rng = np.random.default_rng(0)
        return lambda observation: game.scripted_action(self.learner, rng)


class ReferentialSelfPlayEnv(SelfPlay):
    """Describe a target object so that a scripted listener picks it: `describe(message)`.

    ## Description

    One seat of the cooperative `agentgym/Referential-v0` game as a single-agent env, with a scripted partner. By
    default the learner is the speaker: it sees the candidate objects (size, colour, shape) and the target, and must
    describe the target well enough for the listener, who sees the objects in another order. With
    `learner="listener_0"` the learner reads a scripted speaker's descriptions and picks. The learner's reply goes
    to the game unchanged, then the opponent moves until it is the learner's turn again or the game is over (its
    moves appear in the observation and in `info["turn"]["opponents"]`). Each episode derives the game seed and the
    opponent's RNG from the env's seed, so episodes replay exactly.

    ## Tools

    - `describe(message)`: describe the target to the listener, at most 200 characters.
    - `choose(index)`: (only with `learner="listener_0"`) pick the object by its number in your list.
    - `ask(question)`: (only with `learner="listener_0"`) ask the speaker a question instead of choosing now.

    ## Reward

    The step reward is the sum of the game's reward components for the learner over its move and the opponent's
    replies, including `invalid_action` (minus `invalid_action_penalty` per rejected reply); the last step pays the
    rest of the outcome, so the return is the learner's score in the game: 1 when the listener picks the target,
    else 0 (the reward is shared). Success means the right pick.

    ## Episode end

    Terminated when the game ends (including a forfeit after `max_invalid_actions` rejected replies in a row, and an
    opponent failing for reasons outside the game, with `end_reason="error"`); truncated after `max_turns` learner
    turns, rejected replies included. The game fails when `rounds` speaker turns pass without a choice.

    ## Arguments

    - `learner`: `speaker_0` (default) or `listener_0`.
    - `candidates`: objects per game.
    - `rounds`: speaker turns before the listener must have chosen.
    - `max_turns`: learner turns before truncation.
    - `invalid_action_penalty`: penalty per rejected reply (component `invalid_action`).
    - `max_invalid_actions`: rejected replies in a row that forfeit the game (`None`: never).
    - `tasks`: optional fixed games (see `agentgym.envs.multi_agent.referential.generate_tasks`).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Describe a target object so that a scripted listener picks it: describe(message)."

    def __init__(self, *, learner: str | None = "speaker_0", candidates: int = 4, rounds: int = 3, max_turns: int = 10,
                 invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 tasks: Sequence[Task] | None = None, max_action_chars: int = 20_000,
                 render_mode: str | None = None) -> None:
        game = ReferentialEnv(candidates=candidates, rounds=rounds, invalid_action_penalty=invalid_action_penalty,
                              max_invalid_actions=max_invalid_actions, max_steps=2 * max_turns + 2,
                              max_action_chars=max_action_chars)
        super().__init__(game, ScriptedOpponent(), learner=learner, max_turns=max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, render_mode=render_mode)


class PrisonersDilemmaSelfPlayEnv(SelfPlay):
    """Iterated prisoner's dilemma against tit for tat (or a random player): `cooperate()` or `defect()`.

    ## Description

    One seat of `agentgym/PrisonersDilemma-v0` as a single-agent env. Each round both players choose without seeing
    the other's choice; the payoffs are T=5 (defect against a cooperator), R=3 (both cooperate), P=1 (both defect),
    S=0 (cooperate against a defector), and the number of rounds is announced. Tit for tat cooperates first, then
    repeats the learner's last move. The learner's reply goes to the game unchanged, then the opponent moves until
    it is the learner's turn again or the game is over (its moves appear in the observation and in
    `info["turn"]["opponents"]`). Each episode derives the game seed and the opponent's RNG from the env's seed, so
    episodes replay exactly.

    ## Tools

    - `cooperate()`: cooperate this round.
    - `defect()`: defect this round.

    ## Reward

    The step reward is the sum of the game's reward components for the learner over its move and the opponent's
    replies, including `invalid_action` (minus `invalid_action_penalty` per rejected reply); the last step pays the
    rest of the outcome, so the return is the learner's score in the game: the mean payoff per round divided by T.
    The step rewards are the round payoffs (component `payoff`). Success means a mean payoff of at least R (what
    mutual cooperation earns).

    ## Episode end

    Terminated when the game ends (including a forfeit after `max_invalid_actions` rejected replies in a row, and an
    opponent failing for reasons outside the game, with `end_reason="error"`); truncated after `max_turns` learner
    turns, rejected replies included.

    ## Arguments

    - `opponent`: `"scripted"` (tit for tat, default), `"random"` or any `Opponent`.
    - `learner`: `player_0`, `player_1` or `None` (drawn per episode).
    - `rounds`: rounds per game.
    - `max_turns`: learner turns before truncation.
    - `invalid_action_penalty`: penalty per rejected reply (component `invalid_action`).
    - `max_invalid_actions`: rejected replies in a row that forfeit the game (`None`: never).
    - `tasks`: optional fixed games (`metadata`: `setup: {"rounds": n}`, `seat`).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Iterated prisoner's dilemma against tit for tat: cooperate() or defect()."

    def __init__(self, *, opponent: str | Opponent = "scripted", learner: str | None = None, rounds: int = 10,
                 max_turns: int = 30, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 tasks: Sequence[Task] | None = None, max_action_chars: int = 20_000,
                 render_mode: str | None = None) -> None:
        game = PrisonersDilemmaEnv(rounds=rounds, invalid_action_penalty=invalid_action_penalty,
                                   max_invalid_actions=max_invalid_actions, max_steps=2 * max_turns + 2,
                                   max_action_chars=max_action_chars)
        super().__init__(game, _simple_opponent(opponent), learner=learner, max_turns=max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, render_mode=render_mode)
