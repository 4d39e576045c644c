"""The base class of every turn-based text game: a PettingZoo AEC env whose actions are model text.

:class:`TextAECEnv` implements the AEC bookkeeping once (agent order, per-agent rewards and their named
components, terminations, truncations, dead steps, invalid-move handling, observations), so a game only
writes its rules as hooks and its moves as ``@tool`` methods:

* ``_build_tools(agent)`` / ``_build_parser(agent)``: the tools a seat may call, read from Hermes
  ``<tool_call>`` blocks and function-call strings (``move("e2e4")``) as in single-agent envs;
* ``_new_game(rng, setup)``: set up a game from the env's RNG, or from a fixed ``setup`` (a task);
* ``_observation_box`` / ``_observation_array``: the numeric encoding of what the agent may know;
* ``_catalogue_size`` / ``_catalogue_action`` / ``_legal_mask``: a fixed catalogue of canonical moves
  and which are legal now (the ``action_mask``);
* ``_render_state`` / ``_your_move`` / ``_rules``: the text a language model reads.

Model mistakes are data, not crashes: an unreadable reply, an unknown tool or an illegal move leaves the
same agent to move again, with an error observation and a configurable penalty reported as the named
reward component ``invalid_action``; after ``max_invalid_actions`` mistakes in a row the agent forfeits.
Tools end the game with :meth:`TextAECEnv._end_game`, which gives every agent an ``outcome`` in its info
(``success``, ``score``, ``end_reason``) with the same meaning as single-agent outcomes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from agentgym.errors import ConfigError
from agentgym.parsers import (
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    ToolCallParser,
)
from agentgym.spaces import UnicodeText
from agentgym.toolset import ToolSet

from ._deps import require_pettingzoo
from .spaces import CatalogueText, text_observation_space
from .turns import run_turn

require_pettingzoo()
from pettingzoo import AECEnv

__all__ = ["GameConfigMixin", "TextAECEnv", "outcome"]

logger = logging.getLogger(__name__)


def outcome(*, success: bool, score: float, end_reason: str, result: str) -> dict[str, Any]:
    """One agent's end-of-game record (the keys single-agent envs report, plus the game ``result``)."""
    return {"success": bool(success), "score": float(score), "end_reason": end_reason, "result": result}


class GameConfigMixin:
    """What every text game shares, AEC and parallel: settings validation and the per-game hooks."""

    def _observation_box(self, agent: str) -> spaces.Box:
        raise NotImplementedError

    def _observation_array(self, agent: str) -> np.ndarray:
        raise NotImplementedError

    def _catalogue_size(self, agent: str) -> int | None:
        """Size of the seat's canonical action catalogue, or ``None`` when moves are free text only."""
        return None

    def _catalogue_action(self, agent: str, index: int) -> str:
        raise NotImplementedError

    def _legal_mask(self, agent: str) -> np.ndarray:
        """1 for catalogue actions legal now for ``agent`` (only asked when it is ``agent``'s turn)."""
        raise NotImplementedError

    def _render_state(self, agent: str) -> str:
        """The state as ``agent`` may see it (board, items, history)."""
        raise NotImplementedError

    def _your_move(self, agent: str) -> str:
        """What ``agent`` may do now, with the legal moves listed."""
        raise NotImplementedError

    def _rules(self, agent: str) -> str:
        """The game's rules and the seat's goal, for the system prompt."""
        raise NotImplementedError

    @staticmethod
    def _check_common(invalid_action_penalty: float, max_invalid_actions: int | None, max_steps: int,
                      max_action_chars: int) -> None:
        if not np.isfinite(invalid_action_penalty) or invalid_action_penalty < 0:
            raise ConfigError(f"invalid_action_penalty must be a finite number >= 0 (it is subtracted), got "
                              f"{invalid_action_penalty}.")
        if max_invalid_actions is not None and max_invalid_actions < 1:
            raise ConfigError(f"max_invalid_actions must be >= 1 or None (never forfeit), got {max_invalid_actions}.")
        if max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {max_steps}.")
        if max_action_chars < 1:
            raise ConfigError(f"max_action_chars must be >= 1, got {max_action_chars}.")


class TextAECEnv(AECEnv, GameConfigMixin):
    """A turn-based game for text agents on the PettingZoo AEC API.

    Args:
        agents: Seat names, e.g. ``("player_0", "player_1")``.
        invalid_action_penalty: Subtracted from an agent's reward for each reply that makes no legal move.
        max_invalid_actions: Consecutive bad replies after which the agent forfeits (``None``: never; the
            game then ends only by ``max_steps``).
        max_steps: Steps (good or bad replies of all agents) after which every agent is truncated.
        max_action_chars: Longer replies are rejected as invalid (protects the parsers).
        render_mode: ``"ansi"`` renders the whole game state as text.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "text_game_v0", "render_modes": ["ansi"], "is_parallelizable": False}
    #: One-line description for ``agentgym list``.
    description: ClassVar[str] = ""
    #: Family-native action format, appended to the instructions.
    native_format_hint: ClassVar[str] = ""
    #: True when reset/step are pure in-process computation (no subprocess, no I/O).
    cheap_steps: ClassVar[bool] = True

    def __init__(
        self,
        *,
        agents: Sequence[str],
        invalid_action_penalty: float = 0.1,
        max_invalid_actions: int | None = 3,
        max_steps: int = 200,
        max_action_chars: int = 4000,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        self._check_common(invalid_action_penalty, max_invalid_actions, max_steps, max_action_chars)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}.")
        if len(set(agents)) != len(agents) or len(agents) < 2:
            raise ConfigError(f"A game needs at least two distinct agent names, got {list(agents)}.")
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.max_invalid_actions = max_invalid_actions
        self.max_steps = int(max_steps)
        self.max_action_chars = int(max_action_chars)
        self.render_mode = render_mode
        self.possible_agents: list[str] = list(agents)
        self.agents: list[str] = []
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection: str = self.possible_agents[0]
        self.reward_components: dict[str, dict[str, float]] = {}
        self.np_random, self._np_random_seed = seeding.np_random(None)
        self._acting: str = self.possible_agents[0]
        self._over = False
        self._closed = False
        self._steps = 0
        self._inbox: dict[str, list[str]] = {}
        self._invalid_streak: dict[str, int] = {}
        self._turn_index: dict[str, int] = {}
        self._toolsets = {a: self._build_tools(a) for a in self.possible_agents}
        self._parsers = {a: self._build_parser(a) for a in self.possible_agents}
        self._action_spaces: dict[str, spaces.Space[Any]] = {}
        self._observation_spaces: dict[str, spaces.Dict] = {}
        for agent in self.possible_agents:
            size = self._catalogue_size(agent)
            self._action_spaces[agent] = (
                UnicodeText() if size is None else CatalogueText(size, lambda i, a=agent: self._catalogue_action(a, i))
            )
            self._observation_spaces[agent] = text_observation_space(self._observation_box(agent), size)

    # ---- hooks for games -------------------------------------------------------------------------------
    def _build_tools(self, agent: str) -> ToolSet:
        raise NotImplementedError

    def _build_parser(self, agent: str) -> ToolCallParser:
        """Hermes ``<tool_call>`` plus function-call strings for this seat's tools."""
        return CompositeParser([HermesParser(), FunctionCallParser(self._toolsets[agent].names, self._raw_argument_tools())])

    def _raw_argument_tools(self) -> dict[str, str]:
        """Tools whose single string argument may be written unquoted, e.g. ``move(e2e4)``."""
        return {}

    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        raise NotImplementedError

    def _first_agent(self) -> str:
        return self.possible_agents[0]

    def _forfeit(self, agent: str) -> None:
        """``agent`` made too many bad replies in a row. Default (two-player zero-sum): the other seats win."""
        self._end_game(
            {a: (-1.0 if a == agent else 1.0) for a in self.agents},
            {a: outcome(success=a != agent, score=0.0 if a == agent else 1.0, end_reason="failed" if a == agent
                        else "solved", result="forfeit" if a == agent else "win") for a in self.agents},
            f"{agent} forfeits after {self.max_invalid_actions} invalid replies in a row.",
        )

    def scripted_action(self, agent: str, rng: np.random.Generator) -> str:
        """A sensible move for ``agent`` from a rule-based bot (used by :class:`ScriptedOpponent`)."""
        legal = self.legal_actions(agent)
        return legal[int(rng.integers(len(legal)))]

    # ---- helpers for tools -------------------------------------------------------------------------------
    def _add_reward(self, agent: str, name: str, value: float) -> None:
        """Add a named reward component to ``agent`` for the current step."""
        self.rewards[agent] = float(self.rewards.get(agent, 0.0) + value)
        components = self.reward_components.setdefault(agent, {})
        components[name] = components.get(name, 0.0) + float(value)

    def _tell(self, agent: str, text: str) -> None:
        """Show ``text`` to ``agent`` in its next observation."""
        self._inbox[agent].append(text)

    def _tell_others(self, text: str) -> None:
        for agent in self.agents:
            if agent != self._acting:
                self._inbox[agent].append(text)

    def _end_game(self, rewards: Mapping[str, float], outcomes: Mapping[str, dict[str, Any]], summary: str) -> None:
        """End the game: final rewards (component ``outcome``), terminations and each agent's outcome."""
        for agent in self.agents:
            if rewards.get(agent):
                self._add_reward(agent, "outcome", float(rewards[agent]))
            self.terminations[agent] = True
            self.infos[agent]["outcome"] = dict(outcomes[agent])
            self._inbox[agent].append(f"Game over. {summary}")
        self._over = True

    # ---- queries ---------------------------------------------------------------------------------------------
    @property
    def acting_agent(self) -> str:
        """The agent whose move is being executed (tools read it)."""
        return self._acting

    @property
    def game_over(self) -> bool:
        return self._over

    def legal_actions(self, agent: str | None = None) -> list[str]:
        """Canonical texts of the legal catalogue actions of ``agent`` (default: the one to move)."""
        agent = self.agent_selection if agent is None else agent
        if self._catalogue_size(agent) is None or self._over or agent != self.agent_selection:
            return []
        return [self._catalogue_action(agent, int(i)) for i in np.flatnonzero(self._legal_mask(agent))]

    def toolset(self, agent: str) -> ToolSet:
        return self._toolsets[agent]

    def parser(self, agent: str) -> ToolCallParser:
        return self._parsers[agent]

    def rules(self, agent: str) -> str:
        return self._rules(agent).strip()

    def instructions(self, agent: str) -> str:
        """The system prompt for ``agent``: rules, tools (JSON schemas) and the exact action format."""
        toolset = self._toolsets[agent]
        tool_lines = "\n".join(json.dumps(s["function"], ensure_ascii=False) for s in toolset.schemas())
        example = toolset.names[0]
        parts = [
            self.rules(agent),
            "Tools:\n" + tool_lines,
            ('Make exactly one move per turn by writing <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> '
             f'(for example <tool_call>{{"name": "{example}", "arguments": {{...}}}}</tool_call>).'),
        ]
        if self.native_format_hint:
            parts.append(self.native_format_hint.strip())
        return "\n\n".join(parts)

    # ---- PettingZoo API ---------------------------------------------------------------------------------------
    def observation_space(self, agent: str) -> spaces.Dict:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None:
            self.np_random, self._np_random_seed = seeding.np_random(seed)
        options = dict(options or {})
        setup = options.pop("setup", None)
        if options:
            logger.debug("%s.reset ignores options %s (it reads only 'setup')", type(self).__name__, sorted(options))
        if setup is not None and not isinstance(setup, Mapping):
            raise ConfigError(f"options['setup'] must be a mapping that describes the game, got {type(setup).__name__}.")
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.reward_components = {a: {} for a in self.agents}
        self._inbox = {a: [] for a in self.agents}
        self._invalid_streak = dict.fromkeys(self.agents, 0)
        self._turn_index = dict.fromkeys(self.agents, 0)
        self._steps = 0
        self._over = False
        self._skip_agent_selection = None
        self._new_game(self.np_random, setup)
        self.agent_selection = self._first_agent()
        self._acting = self.agent_selection
        self.infos = {a: {"instructions": self.instructions(a), "tools": self._toolsets[a].schemas()} for a in self.agents}

    def observe(self, agent: str) -> dict[str, Any]:
        size = self._catalogue_size(agent)
        obs: dict[str, Any] = {"observation": self._observation_array(agent), "text": self._observation_text(agent)}
        if size is not None:
            if agent == self.agent_selection and not self._over and agent in self.agents:
                obs["action_mask"] = self._legal_mask(agent).astype(np.int8)
            else:
                obs["action_mask"] = np.zeros(size, dtype=np.int8)
        return obs

    def _observation_text(self, agent: str) -> str:
        parts = list(self._inbox.get(agent, ()))
        parts.append(self._render_state(agent))
        if self._over or agent not in self.agents or self.terminations.get(agent) or self.truncations.get(agent):
            result = self.infos.get(agent, {}).get("outcome", {}).get("result", "over")
            parts.append(f"The game is over for you (result: {result}).")
        elif agent == self.agent_selection:
            parts.append(self._your_move(agent))
        else:
            parts.append(f"Waiting for {self.agent_selection} to move.")
        return "\n\n".join(p for p in parts if p)

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            self._was_dead_step(action)
            return
        if not self.agents:
            raise ConfigError("The game is over and every agent has been removed; call reset() to play again.")
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        self.reward_components = {a: {} for a in self.agents}
        self._inbox[agent] = []
        self._acting = agent
        self._steps += 1
        result = run_turn(action, self._parsers[agent], self._toolsets[agent], max_action_chars=self.max_action_chars)
        self._inbox[agent].append(result.message)
        if result.moved:
            self._invalid_streak[agent] = 0
            if not self._over:
                self.agent_selection = self._next_agent(agent)
        else:
            self._add_reward(agent, "invalid_action", -self.invalid_action_penalty)
            self._invalid_streak[agent] += 1
            if self.max_invalid_actions is not None and self._invalid_streak[agent] >= self.max_invalid_actions:
                self._forfeit(agent)
        if not self._over and self._steps >= self.max_steps:
            self._truncate_all()
        turn = dict(result.info)
        turn.update(kind=result.kind, index=self._turn_index[agent], rewards=dict(self.reward_components[agent]))
        self._turn_index[agent] += 1
        self.infos[agent]["turn"] = turn
        self._accumulate_rewards()

    def _next_agent(self, agent: str) -> str:
        """Who moves after ``agent`` made a legal move (default: the next seat in order)."""
        order = self.agents
        return order[(order.index(agent) + 1) % len(order)]

    def _truncation_outcome(self, agent: str) -> dict[str, Any]:
        return outcome(success=False, score=0.0, end_reason="max_turns", result="truncated")

    def _truncate_all(self) -> None:
        for agent in self.agents:
            self.truncations[agent] = True
            self.infos[agent]["outcome"] = self._truncation_outcome(agent)
            self._inbox[agent].append(f"The game was stopped after {self.max_steps} steps.")
        self._over = True

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = [self._render_state(a) for a in self.possible_agents[:1]]
        lines.append(f"to move: {self.agent_selection}; steps: {self._steps}; over: {self._over}")
        return "\n".join(lines)

    def close(self) -> None:
        """Idempotent; games hold no external resources (engines belong to opponents)."""
        self._closed = True

    def __str__(self) -> str:
        return self.metadata.get("name", type(self).__name__)
