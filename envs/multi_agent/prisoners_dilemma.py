"""Iterated prisoner's dilemma, as a simultaneous-move Parallel env and as a turn-based AEC env.

Each round both players choose ``cooperate()`` or ``defect()`` without seeing the other's choice; the
payoffs are the classic T=5 (defect against a cooperator), R=3 (both cooperate), P=1 (both defect),
S=0 (cooperate against a defector). The number of rounds is announced. In the AEC form ``player_0``
chooses first and ``player_1`` chooses without seeing it; the round resolves after both, so the two
forms are the same game. Rewards are the per-round payoffs (component ``payoff``); at the end an agent
succeeds when its mean payoff reaches R (what mutual cooperation earns), and its score is mean / T.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from agentgym.errors import ConfigError
from agentgym.toolset import ToolResult, ToolSet, tool

from .base import TextAECEnv, outcome
from .parallel import TextParallelEnv

__all__ = ["PAYOFFS", "PrisonersDilemmaEnv", "PrisonersDilemmaParallelEnv"]

COOPERATE, DEFECT = "cooperate", "defect"
MOVES = (COOPERATE, DEFECT)
#: (my move, other's move) -> my payoff.
PAYOFFS: dict[tuple[str, str], int] = {
    (COOPERATE, COOPERATE): 3, (COOPERATE, DEFECT): 0, (DEFECT, COOPERATE): 5, (DEFECT, DEFECT): 1,
}
_T, _R = 5, 3
_AGENTS = ("player_0", "player_1")
_HISTORY = 5
_HINT = "You may also write the move as a function call: cooperate() or defect()."


class _Rules:
    """State and text shared by both forms: rounds, history and totals."""

    def __init__(self, rounds: int) -> None:
        if rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {rounds}.")
        self.rounds = int(rounds)
        self.history: list[tuple[str, str]] = []
        self.totals = [0, 0]

    def reset(self, setup: Mapping[str, Any] | None) -> None:
        setup = dict(setup or {})
        if "rounds" in setup:
            self.rounds = int(setup.pop("rounds"))
        if setup:
            raise ConfigError(f"A prisoner's dilemma setup takes only 'rounds'; got {sorted(setup)}.")
        self.history = []
        self.totals = [0, 0]

    def play(self, move_0: str, move_1: str) -> tuple[int, int]:
        pay = (PAYOFFS[(move_0, move_1)], PAYOFFS[(move_1, move_0)])
        self.history.append((move_0, move_1))
        self.totals[0] += pay[0]
        self.totals[1] += pay[1]
        return pay

    @property
    def finished(self) -> bool:
        return len(self.history) >= self.rounds

    def outcome(self, seat: int, *, forfeit: bool = False) -> dict[str, Any]:
        played = max(1, len(self.history))
        mean = self.totals[seat] / played
        success = not forfeit and bool(self.history) and mean >= _R
        return outcome(success=success, score=mean / _T, end_reason="solved" if success else "failed",
                       result="forfeit" if forfeit else f"{self.totals[seat]} points in {len(self.history)} rounds")

    def observation(self, seat: int) -> np.ndarray:
        rows = [[-1, -1] for _ in range(_HISTORY)]
        for i, pair in enumerate(self.history[-_HISTORY:]):
            rows[_HISTORY - min(_HISTORY, len(self.history)) + i] = [MOVES.index(pair[seat]), MOVES.index(pair[1 - seat])]
        rows.append([len(self.history), self.rounds])
        return np.array(rows, dtype=np.int64)

    def box(self) -> spaces.Box:
        return spaces.Box(-1, 10**6, shape=(_HISTORY + 1, 2), dtype=np.int64)

    def text(self, seat: int, agent: str) -> str:
        lines = [(f"Iterated prisoner's dilemma. You are {agent}. Round {min(len(self.history) + 1, self.rounds)} of "
                  f"{self.rounds}. Your points: {self.totals[seat]}; the other player's: {self.totals[1 - seat]}.")]
        if self.history:
            recent = self.history[-10:]
            lines.append("Recent rounds (you / other): " + ", ".join(f"{p[seat]}/{p[1 - seat]}" for p in recent))
        return "\n".join(lines)

    def rules(self, agent: str) -> str:
        return (f"You play {self.rounds} rounds of the prisoner's dilemma as {agent}. Each round you and the other player "
                "choose at the same time: cooperate() or defect(). Payoffs per round: both cooperate 3 each; both defect "
                "1 each; a defector against a cooperator gets 5 and the cooperator 0. You succeed if you average at "
                "least 3 points per round. An invalid reply costs a penalty and counts as cooperate.")

    def round_report(self, seat: int) -> str:
        mine, other = self.history[-1][seat], self.history[-1][1 - seat]
        return f"Round {len(self.history)}: you {mine}, the other player {other}; you got {PAYOFFS[(mine, other)]}."

    def tit_for_tat(self, seat: int) -> str:
        return f"{COOPERATE if not self.history or self.history[-1][1 - seat] == COOPERATE else DEFECT}()"


class _PrisonersDilemmaHooks:
    """The game hooks both forms (simultaneous and turn-based) share; ``self.game`` is a :class:`_Rules`."""

    game: _Rules
    possible_agents: list[str]

    def _observation_box(self, agent: str) -> spaces.Box:
        return self.game.box()

    def _observation_array(self, agent: str) -> np.ndarray:
        return self.game.observation(self.possible_agents.index(agent))

    def _catalogue_size(self, agent: str) -> int | None:
        return 2

    def _catalogue_action(self, agent: str, index: int) -> str:
        return f"{MOVES[index]}()"

    def _legal_mask(self, agent: str) -> np.ndarray:
        return np.ones(2, dtype=np.int8)

    def _render_state(self, agent: str) -> str:
        return self.game.text(self.possible_agents.index(agent), agent)

    def _your_move(self, agent: str) -> str:
        return "Your move: cooperate() or defect()."

    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """Tit for tat: cooperate first, then copy the other player's last move."""
        return self.game.tit_for_tat(self.possible_agents.index(agent))


class PrisonersDilemmaParallelEnv(_PrisonersDilemmaHooks, TextParallelEnv):
    """Iterated prisoner's dilemma with simultaneous moves: cooperate() or defect().

    ## Description

    Each round both players choose without seeing the other's choice; the payoffs are the classic T=5 (defect
    against a cooperator), R=3 (both cooperate), P=1 (both defect), S=0 (cooperate against a defector), and the
    number of rounds is announced. This is the simultaneous-move (PettingZoo Parallel) form: both players act
    in the same step. In the turn-based (AEC) form, `PrisonersDilemmaEnv`, `player_0` chooses first and `player_1`
    without seeing it, so the two forms are the same game.

    ## Tools

    - `cooperate()`: cooperate this round.
    - `defect()`: defect this round.

    ## Reward

    The round's payoff (component `payoff`), minus `invalid_action_penalty` per rejected reply. At the end an agent
    succeeds when its mean payoff reaches R (what mutual cooperation earns); its score is mean payoff / T.

    ## Episode end

    Terminated after `rounds` rounds, or when an agent forfeits after `max_invalid_actions` bad replies in a row;
    truncated after `max_steps` steps.

    ## Arguments

    - `rounds`: rounds per game (announced).
    - `invalid_action_penalty`: subtracted from an agent's reward for each reply that makes no legal move
      (component `invalid_action`).
    - `max_invalid_actions`: bad replies in a row after which the agent forfeits (`None`: never).
    - `max_steps`: steps (good or bad replies of all agents) after which every agent is truncated.
    - `max_action_chars`: longer replies are rejected as invalid.
    - `render_mode`: `"ansi"` (the whole game state as text) or `None`.

    ## Version history

    - v0: the first version.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "prisoners_dilemma_text_v0", "render_modes": ["ansi"]}
    description: ClassVar[str] = "Iterated prisoner's dilemma: cooperate() or defect(), simultaneously, for N rounds."
    native_format_hint: ClassVar[str] = _HINT

    def __init__(self, *, rounds: int = 10, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 max_steps: int = 1000, max_action_chars: int = 4000, render_mode: str | None = None) -> None:
        self.game = _Rules(rounds)
        super().__init__(agents=_AGENTS, invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    @tool
    def cooperate(self) -> str:
        """Cooperate this round."""
        self._record_move(COOPERATE)
        return "You chose to cooperate."

    @tool
    def defect(self) -> str:
        """Defect this round."""
        self._record_move(DEFECT)
        return "You chose to defect."

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.cooperate, self.defect])

    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        self.game.reset(setup)

    def _default_move(self, agent: str) -> str:
        return COOPERATE

    def _resolve(self, moves: Mapping[str, Any]) -> None:
        pay = self.game.play(moves["player_0"], moves["player_1"])
        for seat, agent in enumerate(self.possible_agents):
            self._add_reward(agent, "payoff", float(pay[seat]))
            self._tell(agent, self.game.round_report(seat))
        if self.game.finished:
            self._end_game({a: self.game.outcome(i) for i, a in enumerate(self.possible_agents)},
                           f"Final points: {self.game.totals[0]} to {self.game.totals[1]}.")

    def _forfeit(self, agents: Any) -> None:
        self._end_game({a: self.game.outcome(i, forfeit=a in agents) for i, a in enumerate(self.possible_agents)},
                       f"{', '.join(agents)} made {self.max_invalid_actions} invalid replies in a row.")

    def _rules(self, agent: str) -> str:
        return self.game.rules(agent)


class PrisonersDilemmaEnv(_PrisonersDilemmaHooks, TextAECEnv):
    """Iterated prisoner's dilemma: cooperate() or defect(); simultaneous in the parallel form.

    ## Description

    Each round both players choose without seeing the other's choice; the payoffs are the classic T=5 (defect
    against a cooperator), R=3 (both cooperate), P=1 (both defect), S=0 (cooperate against a defector), and the
    number of rounds is announced. In this turn-based (AEC) form `player_0` chooses first and `player_1` chooses
    without seeing it; the round resolves after both, so it is the same game as the simultaneous-move (Parallel)
    form, `PrisonersDilemmaParallelEnv`.

    ## Tools

    - `cooperate()`: cooperate this round.
    - `defect()`: defect this round.

    ## Reward

    The round's payoff (component `payoff`), minus `invalid_action_penalty` per rejected reply. At the end an agent
    succeeds when its mean payoff reaches R (what mutual cooperation earns); its score is mean payoff / T.

    ## Episode end

    Terminated after `rounds` rounds, or when an agent forfeits after `max_invalid_actions` bad replies in a row;
    truncated after `max_steps` steps.

    ## Arguments

    - `rounds`: rounds per game (announced).
    - `invalid_action_penalty`: subtracted from an agent's reward for each reply that makes no legal move
      (component `invalid_action`).
    - `max_invalid_actions`: bad replies in a row after which the agent forfeits (`None`: never).
    - `max_steps`: steps (good or bad replies of all agents) after which every agent is truncated.
    - `max_action_chars`: longer replies are rejected as invalid.
    - `render_mode`: `"ansi"` (the whole game state as text) or `None`.

    ## Version history

    - v0: the first version.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "prisoners_dilemma_text_v0", "render_modes": ["ansi"],
                                          "is_parallelizable": True}
    description: ClassVar[str] = PrisonersDilemmaParallelEnv.description
    native_format_hint: ClassVar[str] = _HINT

    def __init__(self, *, rounds: int = 10, invalid_action_penalty: float = 0.1, max_invalid_actions: int | None = 3,
                 max_steps: int = 1000, max_action_chars: int = 4000, render_mode: str | None = None) -> None:
        self.game = _Rules(rounds)
        self._pending: str | None = None
        super().__init__(agents=_AGENTS, invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    def _choose(self, move: str) -> str:
        agent = self.acting_agent
        if agent == "player_0":
            self._pending = move
            self._tell_others("player_0 has chosen; it is your turn to choose.")
            return f"You chose to {move}."
        assert self._pending is not None
        pay = self.game.play(self._pending, move)
        self._pending = None
        for seat, name in enumerate(self.possible_agents):
            self._add_reward(name, "payoff", float(pay[seat]))
            if name != agent:
                self._tell(name, self.game.round_report(seat))
        if self.game.finished:
            self._end_game({}, {a: self.game.outcome(i) for i, a in enumerate(self.possible_agents)},
                           f"Final points: {self.game.totals[0]} to {self.game.totals[1]}.")
        return f"You chose to {move}. {self.game.round_report(1)}"

    @tool
    def cooperate(self) -> str | ToolResult:
        """Cooperate this round."""
        return self._choose(COOPERATE)

    @tool
    def defect(self) -> str | ToolResult:
        """Defect this round."""
        return self._choose(DEFECT)

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.cooperate, self.defect])

    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        self.game.reset(setup)
        self._pending = None

    def _forfeit(self, agent: str) -> None:
        self._end_game({}, {a: self.game.outcome(i, forfeit=a == agent) for i, a in enumerate(self.possible_agents)},
                       f"{agent} made {self.max_invalid_actions} invalid replies in a row.")

    def _rules(self, agent: str) -> str:
        return self.game.rules(agent) + (" (Turn-based form: player_0 chooses first, player_1 then chooses without "
                                         "seeing that choice; the round is revealed after both.)")

    def reference_action(self, agent: str) -> str:
        """Always cooperate: against tit for tat this earns R every round (the success level)."""
        return "cooperate()"
