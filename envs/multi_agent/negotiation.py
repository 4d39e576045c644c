"""Deal or no deal: two agents split a pool of items whose values each of them knows only for itself.

The game of Lewis et al. (2017, "Deal or No Deal? End-to-End Learning for Negotiation Dialogues"): three
item types (books, hats, balls), 1-4 of each and 5-7 in all; each agent has private integer values that
make the whole pool worth 10 to it. Agents alternate; a move is a proposal (the counts *the proposer*
keeps, with an optional message), ``accept()`` of the partner's standing proposal, or ``walk_away()``.
A deal pays each agent its value of what it gets, divided by 10; no deal (walking away, or no agreement
within ``max_moves``) pays 0 to both. Tasks are generated so that a split worth at least half to both
exists: a fair deal is always possible, but each side must find it without seeing the other's values.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from agentgym.errors import ConfigError, TaskError
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

from .base import TextAECEnv, outcome
from .messages import clean_message, quote_message

__all__ = ["ITEMS", "NegotiationEnv", "aspiration", "generate_setups", "generate_tasks", "value_of"]

ITEMS = ("book", "hat", "ball")
_MAX_COUNT = 4
_TOTAL_VALUE = 10
_PROPOSALS = list(itertools.product(range(_MAX_COUNT + 1), repeat=len(ITEMS)))  # 125 splits (what I keep)
_ACCEPT, _WALK = len(_PROPOSALS), len(_PROPOSALS) + 1
_AGENTS = ("player_0", "player_1")
#: The scripted negotiator's demand (share of its total value) at its k-th decision; then the floor.
_ASPIRATIONS = (0.8, 0.7, 0.6, 0.5)


def aspiration(decision_index: int) -> float:
    """The scripted negotiator's demand at its ``decision_index``-th decision (0-based)."""
    return _ASPIRATIONS[min(decision_index, len(_ASPIRATIONS) - 1)]


def value_of(share: Sequence[int], values: Sequence[int]) -> int:
    return int(sum(int(s) * int(v) for s, v in zip(share, values)))


def _plural(count: int, item: str) -> str:
    return f"{count} {item}{'' if count == 1 else 'es' if item.endswith('x') else 's'}"


def _describe(share: Sequence[int]) -> str:
    return ", ".join(_plural(c, item) for c, item in zip(share, ITEMS))


def _random_values(rng: random.Random, counts: Sequence[int]) -> list[int] | None:
    """Integer values with ``sum(counts * values) == 10``, at least two item types valued (None: retry)."""
    for _ in range(100):
        values = [0] * len(counts)
        remaining = _TOTAL_VALUE
        order = list(range(len(counts)))
        rng.shuffle(order)
        for i in order[:-1]:
            values[i] = rng.randint(0, remaining // counts[i])
            remaining -= values[i] * counts[i]
        last = order[-1]
        if remaining % counts[last] == 0:
            values[last] = remaining // counts[last]
            if sum(1 for v in values if v > 0) >= 2:
                return values
    return None


def _fair_split_exists(counts: Sequence[int], values_a: Sequence[int], values_b: Sequence[int]) -> bool:
    for share in itertools.product(*(range(c + 1) for c in counts)):
        other = [c - s for c, s in zip(counts, share)]
        if value_of(share, values_a) * 2 >= _TOTAL_VALUE and value_of(other, values_b) * 2 >= _TOTAL_VALUE:
            return True
    return False


def generate_setups(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """``count`` games (item counts and both agents' values) in which a split worth >= 5 to both exists."""
    setups: list[dict[str, Any]] = []
    while len(setups) < count:
        counts = [rng.randint(1, _MAX_COUNT) for _ in ITEMS]
        if not 5 <= sum(counts) <= 7:
            continue
        values_0, values_1 = _random_values(rng, counts), _random_values(rng, counts)
        if values_0 is None or values_1 is None or values_0 == values_1:
            continue
        if _fair_split_exists(counts, values_0, values_1):
            setups.append({"counts": counts, "values": [values_0, values_1]})
    return setups


def generate_tasks(rng: random.Random, count: int, *, seats: Sequence[str] = _AGENTS) -> list[Task]:
    """Tasks for the self-play env: a game plus the learner's seat (alternating over ``seats``).

    Args:
        rng: The only source of randomness (the suite seeds it per split).
        count: Number of tasks.
        seats: Seats the learner takes, in turn.
    """
    if not seats or any(s not in _AGENTS for s in seats):
        raise TaskError(f"Negotiation seats must be among {list(_AGENTS)}, got {list(seats)}.")
    tasks = []
    for i, setup in enumerate(generate_setups(rng, count)):
        seat = seats[i % len(seats)]
        counts = setup["counts"]
        prompt = f"Negotiate a split of {_describe(counts)} as {seat}."
        tasks.append(Task(id=f"{'-'.join(map(str, counts))}-{i}", prompt=prompt, answer=None,
                          metadata={"setup": setup, "seat": seat}))
    return tasks


class NegotiationEnv(TextAECEnv):
    """Deal or no deal: split books, hats and balls with private values; propose, accept or walk away.

    ## Description

    The negotiation game of Lewis et al. (2017, "Deal or No Deal? End-to-End Learning for Negotiation Dialogues")
    between `player_0` (moves first) and `player_1`, a PettingZoo AEC env. Three item types, 1-4 of each and 5-7 in
    all; each agent has private integer values that make the whole pool worth 10 to it. Agents alternate; tasks are
    generated so that a split worth at least half to both exists, but each side must find it without seeing the
    other's values.

    ## Tools

    - `propose(book, hat, ball, message)`: propose a split by the counts the proposer keeps, with an optional
      message.
    - `accept()`: accept the partner's standing proposal; this ends the game with a deal.
    - `walk_away()`: end the negotiation without a deal (both get 0).

    ## Reward

    A deal pays each agent its value of what it gets divided by its value of the whole pool (component
    `deal_value`); no deal pays 0 to both. An agent succeeds when its share reaches `success_share`. Each
    rejected reply costs `invalid_action_penalty`.

    ## Episode end

    Terminated by a deal, by walking away, when `max_moves` proposals pass without agreement (no deal), or when an
    agent forfeits after `max_invalid_actions` bad replies in a row; truncated after `max_steps` steps.

    ## Arguments

    - `max_moves`: proposals allowed in all before the game ends with no deal.
    - `success_share`: a deal counts as a success for an agent worth at least this share of its total.
    - `invalid_action_penalty`: subtracted from an agent's reward for each reply that makes no legal move
      (component `invalid_action`).
    - `max_invalid_actions`: bad replies in a row after which the agent forfeits (`None`: never).
    - `max_steps`: steps (good or bad replies of all agents) after which every agent is truncated.
    - `max_action_chars`: longer replies are rejected as invalid.
    - `render_mode`: `"ansi"` (the whole game state as text) or `None`.

    ## Version history

    - v0: the first version.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "negotiation_text_v0", "render_modes": ["ansi"],
                                          "is_parallelizable": False}
    description: ClassVar[str] = ("Deal or no deal: two agents with private values split books, hats and balls by "
                                  "proposing, accepting or walking away.")
    native_format_hint: ClassVar[str] = ("You may also write moves as function calls, e.g. propose(1, 0, 2, \"I need "
                                         "the balls\"), accept() or walk_away().")

    def __init__(self, *, max_moves: int = 10, success_share: float = 0.5, invalid_action_penalty: float = 0.1,
                 max_invalid_actions: int | None = 3, max_steps: int = 60, max_action_chars: int = 4000,
                 render_mode: str | None = None) -> None:
        if max_moves < 2:
            raise ConfigError(f"max_moves must be >= 2 (one proposal and one answer), got {max_moves}.")
        if not 0.0 <= success_share <= 1.0:
            raise ConfigError(f"success_share must be in [0, 1], got {success_share}.")
        self.max_moves = int(max_moves)
        self.success_share = float(success_share)
        self.counts = [1, 1, 1]
        self.values: dict[str, list[int]] = {}
        self.offer: tuple[str, tuple[int, ...]] | None = None  # (proposer, what the proposer keeps)
        self.moves = 0
        self.decisions: dict[str, int] = {}
        super().__init__(agents=_AGENTS, invalid_action_penalty=invalid_action_penalty,
                         max_invalid_actions=max_invalid_actions, max_steps=max_steps,
                         max_action_chars=max_action_chars, render_mode=render_mode)

    # ---- game ----------------------------------------------------------------------------------------------
    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        if setup is None:
            setup = generate_setups(random.Random(int(rng.integers(2**63 - 1))), 1)[0]
        try:
            counts = [int(c) for c in setup["counts"]]
            values = [[int(v) for v in vs] for vs in setup["values"]]
        except (KeyError, TypeError, ValueError):
            raise ConfigError("A negotiation setup needs 'counts' (3 ints) and 'values' (two lists of 3 ints).") from None
        if len(counts) != len(ITEMS) or len(values) != 2 or any(len(v) != len(ITEMS) for v in values):
            raise ConfigError(f"A negotiation setup needs {len(ITEMS)} counts and two value lists of {len(ITEMS)}.")
        if any(not 0 <= c <= _MAX_COUNT for c in counts) or any(v < 0 for vs in values for v in vs):
            raise ConfigError(f"Counts must lie in 0..{_MAX_COUNT} and values must be >= 0; got {counts}, {values}.")
        self.counts = counts
        self.values = {agent: values[i] for i, agent in enumerate(self.possible_agents)}
        self.offer = None
        self.moves = 0
        self.decisions = dict.fromkeys(self.possible_agents, 0)

    def total_value(self, agent: str) -> int:
        return value_of(self.counts, self.values[agent])

    def _other(self, agent: str) -> str:
        return self.possible_agents[1 - self.possible_agents.index(agent)]

    def share_for(self, agent: str) -> tuple[int, ...] | None:
        """What ``agent`` would get if it accepted the standing offer (None: no offer from the other)."""
        if self.offer is None or self.offer[0] == agent:
            return None
        return tuple(c - k for c, k in zip(self.counts, self.offer[1]))

    def _after_move(self) -> None:
        agent = self.acting_agent
        self.moves += 1
        self.decisions[agent] += 1
        if not self._over and self.moves >= self.max_moves:
            self._no_deal(f"No agreement within {self.max_moves} moves.")

    def _no_deal(self, summary: str) -> None:
        self._end_game(dict.fromkeys(self.agents, 0.0),
                       {a: outcome(success=False, score=0.0, end_reason="failed", result="no_deal") for a in self.agents},
                       summary + " No deal: everyone gets 0.")

    # ---- tools ------------------------------------------------------------------------------------------------
    @tool
    def propose(self, book: int, hat: int, ball: int, message: str = "") -> str | ToolResult:
        """Propose a split: the numbers of books, hats and balls YOU keep; the partner gets the rest.

        Args:
            book: Books you keep.
            hat: Hats you keep.
            ball: Balls you keep.
            message: Optional words to the partner (at most 300 characters).
        """
        keep = (book, hat, ball)
        if any(isinstance(k, bool) or not isinstance(k, int) for k in keep):
            return ToolResult.error("Error: book, hat and ball must be whole numbers, e.g. propose(1, 0, 2).")
        if any(not 0 <= k <= c for k, c in zip(keep, self.counts)):
            return ToolResult.error(f"Error: you can keep at most {_describe(self.counts)} (and not fewer than 0); "
                                    f"you asked for {_describe(keep)}.")
        if len(message) > 300:
            return ToolResult.error(f"Error: the message has {len(message)} characters; the limit is 300.")
        agent = self.acting_agent
        self.offer = (agent, tuple(int(k) for k in keep))
        gives = tuple(c - k for c, k in zip(self.counts, keep))
        said = f" and says: {quote_message(message)}" if clean_message(message) else ""
        self._tell_others(f"{agent} proposes to keep {_describe(keep)} and give you {_describe(gives)}{said}.")
        self._after_move()
        return f"You proposed to keep {_describe(keep)} (worth {value_of(keep, self.values[agent])} to you)."

    @tool
    def accept(self) -> str | ToolResult:
        """Accept the partner's standing proposal; the game ends with that split."""
        agent = self.acting_agent
        mine = self.share_for(agent)
        if mine is None:
            return ToolResult.error("Error: there is no proposal from your partner to accept; call propose(book, hat, "
                                    "ball) or walk_away().")
        other = self._other(agent)
        shares = {agent: mine, other: self.offer[1]}  # type: ignore[index]
        rewards, outcomes = {}, {}
        for a, share in shares.items():
            score = value_of(share, self.values[a]) / max(1, self.total_value(a))
            rewards[a] = score
            outcomes[a] = outcome(success=score >= self.success_share, score=score,
                                  end_reason="solved" if score >= self.success_share else "failed", result="deal")
        self._tell_others(f"{agent} accepts your proposal.")
        self._end_game(rewards, outcomes, f"Deal: {agent} gets {_describe(mine)}, {other} gets "
                       f"{_describe(self.offer[1])}.")  # type: ignore[index]
        return f"You accepted: you get {_describe(mine)} (worth {value_of(mine, self.values[agent])} to you)."

    @tool
    def walk_away(self) -> str:
        """End the negotiation without a deal (both get 0)."""
        agent = self.acting_agent
        self._tell_others(f"{agent} walks away.")
        self._no_deal(f"{agent} walked away.")
        return "You walked away."

    def _end_game(self, rewards: Mapping[str, float], outcomes: Mapping[str, dict[str, Any]], summary: str) -> None:
        super()._end_game({a: 0.0 for a in rewards}, outcomes, summary)
        for agent, value in rewards.items():  # name the component after what it is
            if value:
                self._add_reward(agent, "deal_value", float(value))

    def _forfeit(self, agent: str) -> None:
        self._no_deal(f"{agent} made {self.max_invalid_actions} invalid replies in a row.")

    def _build_tools(self, agent: str) -> ToolSet:
        return ToolSet([self.propose, self.accept, self.walk_away])

    # ---- observations -------------------------------------------------------------------------------------------
    def _observation_box(self, agent: str) -> spaces.Box:
        high = max(self.max_moves, _TOTAL_VALUE)
        return spaces.Box(-1, high, shape=(11,), dtype=np.int64)

    def _observation_array(self, agent: str) -> np.ndarray:
        offer = self.share_for(agent)
        return np.array([*self.counts, *self.values.get(agent, [0, 0, 0]), *(offer if offer else (-1, -1, -1)),
                         self.max_moves - self.moves, int(offer is not None)], dtype=np.int64)

    def _catalogue_size(self, agent: str) -> int | None:
        return len(_PROPOSALS) + 2

    def _catalogue_action(self, agent: str, index: int) -> str:
        if index == _ACCEPT:
            return "accept()"
        if index == _WALK:
            return "walk_away()"
        return "propose({}, {}, {})".format(*_PROPOSALS[index])

    def _legal_mask(self, agent: str) -> np.ndarray:
        mask = np.array([int(all(k <= c for k, c in zip(p, self.counts))) for p in _PROPOSALS] + [0, 1], dtype=np.int8)
        mask[_ACCEPT] = int(self.share_for(agent) is not None)
        return mask

    def _render_state(self, agent: str) -> str:
        values = self.values.get(agent, [0, 0, 0])
        lines = [f"Negotiation. You are {agent}. Items: {_describe(self.counts)}.",
                 "Your values: " + ", ".join(f"{item}={v}" for item, v in zip(ITEMS, values))
                 + f" (the whole pool is worth {self.total_value(agent)} to you)."]
        offer = self.share_for(agent)
        if offer is not None:
            lines.append(f"Standing proposal from your partner: you get {_describe(offer)} "
                         f"(worth {value_of(offer, values)} to you).")
        elif self.offer is not None:
            lines.append(f"Your standing proposal: you keep {_describe(self.offer[1])}.")
        lines.append(f"Moves left: {self.max_moves - self.moves}.")
        return "\n".join(lines)

    def _your_move(self, agent: str) -> str:
        options = "propose(book, hat, ball, message) with the counts YOU keep"
        if self.share_for(agent) is not None:
            options += ", accept()"
        return f"Your move: {options}, or walk_away()."

    def _rules(self, agent: str) -> str:
        return ("You negotiate how to split a pool of books, hats and balls with a partner. You know your own values of "
                "the items; your partner has different values you cannot see. Take turns: propose a split (the counts "
                "you keep; the partner gets the rest), accept the partner's standing proposal, or walk away. If you "
                f"agree, you score your value of what you get divided by 10; with no deal within {self.max_moves} moves "
                "(or if anyone walks away) both score 0. A deal worth at least "
                f"{self.success_share:.0%} of your total counts as a success. Invalid replies cost a penalty.")

    # ---- bots ------------------------------------------------------------------------------------------------------
    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """An aspiration negotiator: accept when the offer meets a falling demand, else make a generous offer.

        The demand is 80%, 70%, 60%, then 50% of its total value at its successive decisions; its proposal is
        the split that meets the demand while keeping the fewest items (the partner gets the most).
        """
        demand = aspiration(self.decisions[agent]) * self.total_value(agent)
        offer = self.share_for(agent)
        if offer is not None and value_of(offer, self.values[agent]) >= demand:
            return "accept()"
        keep = self._cheapest_split(self.values[agent], demand)
        return "propose({}, {}, {})".format(*keep)

    def _splits(self) -> list[tuple[int, ...]]:
        return [tuple(s) for s in itertools.product(*(range(c + 1) for c in self.counts))]

    def _cheapest_split(self, values: Sequence[int], demand: float) -> tuple[int, ...]:
        fitting = [s for s in self._splits() if value_of(s, values) >= demand]
        return min(fitting, key=lambda s: (sum(s), -value_of(s, values), s))

    def reference_action(self, agent: str) -> str:
        """Play against the scripted negotiator with full knowledge (proves every generated task solvable).

        Propose the split best for ``agent`` that the bot will accept at its next decision; when nothing the
        bot accepts is worth ``success_share`` yet, accept a good enough standing offer, or offer the best
        split at the bot's floor demand (which it accepts once its demand has fallen that far).
        """
        other = self._other(agent)
        mine, theirs = self.values[agent], self.values[other]
        need = self.success_share * self.total_value(agent)
        bot_demand = aspiration(self.decisions[other]) * self.total_value(other)
        floor = aspiration(len(_ASPIRATIONS)) * self.total_value(other)

        def best(min_other: float) -> tuple[int, ...] | None:
            options = [s for s in self._splits()
                       if value_of(tuple(c - k for c, k in zip(self.counts, s)), theirs) >= min_other]
            return max(options, key=lambda s: (value_of(s, mine), s)) if options else None

        offer = self.share_for(agent)
        target = best(bot_demand)
        if target is not None and value_of(target, mine) >= need:
            if offer is not None and value_of(offer, mine) >= value_of(target, mine):
                return "accept()"
            return "propose({}, {}, {})".format(*target)
        if offer is not None and value_of(offer, mine) >= need:
            return "accept()"
        fallback = best(floor) or tuple(self.counts)
        return "propose({}, {}, {})".format(*fallback)
