"""The base class of simultaneous-move text games on PettingZoo's Parallel API.

Every live agent sends one reply per step; each reply is parsed and run with the same parser, tools and
turn kinds as in turn-based games. A reply that makes no legal move cannot be retried (the others have
already moved), so the game plays the seat's ``default_move`` instead and charges the named
``invalid_action`` penalty; after ``max_invalid_actions`` bad replies in a row the game ends.
"""

from __future__ import annotations

import json
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
from .base import GameConfigMixin
from .spaces import CatalogueText, text_observation_space
from .turns import run_turn

require_pettingzoo()
from pettingzoo import ParallelEnv

__all__ = ["TextParallelEnv"]


class TextParallelEnv(ParallelEnv, GameConfigMixin):
    """A simultaneous-move game for text agents.

    Subclasses implement ``_build_tools``, ``_new_game``, ``_resolve`` (apply the round's moves, which tools
    stored with :meth:`_record_move`), ``_default_move``, the observation hooks and ``_rules``; they end the
    game by calling :meth:`_end_game` from ``_resolve``.

    Args:
        agents: Seat names.
        invalid_action_penalty: Subtracted from an agent's reward for each bad reply.
        max_invalid_actions: Consecutive bad replies by one agent after which the game ends (``None``: never).
        max_steps: Steps after which every agent is truncated.
        max_action_chars: Longer replies are rejected as invalid.
        render_mode: ``"ansi"`` or ``None``.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "text_parallel_v0", "render_modes": ["ansi"]}
    description: ClassVar[str] = ""
    native_format_hint: ClassVar[str] = ""
    cheap_steps: ClassVar[bool] = True

    def __init__(self, *, agents: Sequence[str], invalid_action_penalty: float = 0.1,
                 max_invalid_actions: int | None = 3, max_steps: int = 200, max_action_chars: int = 4000,
                 render_mode: str | None = None) -> None:
        self._check_common(invalid_action_penalty, max_invalid_actions, max_steps, max_action_chars)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}.")
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.max_invalid_actions = max_invalid_actions
        self.max_steps = int(max_steps)
        self.max_action_chars = int(max_action_chars)
        self.render_mode = render_mode
        self.possible_agents: list[str] = list(agents)
        self.agents: list[str] = []
        self.np_random, self._np_random_seed = seeding.np_random(None)
        self.reward_components: dict[str, dict[str, float]] = {}
        self._rewards: dict[str, float] = {}
        self._moves: dict[str, Any] = {}
        self._acting = self.possible_agents[0]
        self._over = False
        self._truncated = False
        self._steps = 0
        self._inbox: dict[str, list[str]] = {}
        self._invalid_streak: dict[str, int] = {}
        self._outcomes: dict[str, dict[str, Any]] = {}
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

    # ---- hooks --------------------------------------------------------------------------------------------
    def _build_tools(self, agent: str) -> ToolSet:
        raise NotImplementedError

    def _build_parser(self, agent: str) -> ToolCallParser:
        return CompositeParser([HermesParser(), FunctionCallParser(self._toolsets[agent].names)])

    def _new_game(self, rng: np.random.Generator, setup: Mapping[str, Any] | None) -> None:
        raise NotImplementedError

    def _resolve(self, moves: Mapping[str, Any]) -> None:
        """Apply one round of moves (one per live agent) and tell agents what happened."""
        raise NotImplementedError

    def _default_move(self, agent: str) -> Any:
        """The move played for an agent whose reply made no legal move."""
        raise NotImplementedError

    # ---- helpers for tools and _resolve -------------------------------------------------------------------------
    @property
    def acting_agent(self) -> str:
        return self._acting

    def _record_move(self, move: Any) -> None:
        """Store the acting agent's move for this round (tools call this)."""
        self._moves[self._acting] = move

    def _add_reward(self, agent: str, name: str, value: float) -> None:
        self._rewards[agent] = self._rewards.get(agent, 0.0) + float(value)
        components = self.reward_components.setdefault(agent, {})
        components[name] = components.get(name, 0.0) + float(value)

    def _tell(self, agent: str, text: str) -> None:
        self._inbox[agent].append(text)

    def _end_game(self, outcomes: Mapping[str, dict[str, Any]], summary: str) -> None:
        for agent in self.agents:
            self._outcomes[agent] = dict(outcomes[agent])
            self._inbox[agent].append(f"Game over. {summary}")
        self._over = True

    # ---- queries ----------------------------------------------------------------------------------------------------
    def toolset(self, agent: str) -> ToolSet:
        return self._toolsets[agent]

    def rules(self, agent: str) -> str:
        return self._rules(agent).strip()

    def instructions(self, agent: str) -> str:
        toolset = self._toolsets[agent]
        tool_lines = "\n".join(json.dumps(s["function"], ensure_ascii=False) for s in toolset.schemas())
        parts = [self.rules(agent), "Tools:\n" + tool_lines,
                 'Make exactly one move per turn by writing <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>.']
        if self.native_format_hint:
            parts.append(self.native_format_hint.strip())
        return "\n\n".join(parts)

    def legal_actions(self, agent: str) -> list[str]:
        if self._catalogue_size(agent) is None or self._over:
            return []
        return [self._catalogue_action(agent, int(i)) for i in np.flatnonzero(self._legal_mask(agent))]

    @property
    def game_over(self) -> bool:
        return self._over

    # ---- PettingZoo API ---------------------------------------------------------------------------------------------
    def observation_space(self, agent: str) -> spaces.Dict:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._action_spaces[agent]

    def _observe(self, agent: str) -> dict[str, Any]:
        obs: dict[str, Any] = {"observation": self._observation_array(agent), "text": self._observation_text(agent)}
        size = self._catalogue_size(agent)
        if size is not None:
            obs["action_mask"] = (self._legal_mask(agent).astype(np.int8) if not self._over
                                  else np.zeros(size, dtype=np.int8))
        return obs

    def _observation_text(self, agent: str) -> str:
        parts = [*self._inbox.get(agent, ()), self._render_state(agent)]
        parts.append(f"The game is over (result: {self._outcomes[agent].get('result')})." if self._over
                     else self._your_move(agent))
        return "\n\n".join(p for p in parts if p)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            self.np_random, self._np_random_seed = seeding.np_random(seed)
        setup = (options or {}).get("setup")
        if setup is not None and not isinstance(setup, Mapping):
            raise ConfigError(f"options['setup'] must be a mapping, got {type(setup).__name__}.")
        self.agents = list(self.possible_agents)
        self._inbox = {a: [] for a in self.agents}
        self._invalid_streak = dict.fromkeys(self.agents, 0)
        self._outcomes = {}
        self._over = False
        self._steps = 0
        self.reward_components = {a: {} for a in self.agents}
        self._new_game(self.np_random, setup)
        infos = {a: {"instructions": self.instructions(a), "tools": self._toolsets[a].schemas()} for a in self.agents}
        return {a: self._observe(a) for a in self.agents}, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, float], dict[str, bool],
                                                         dict[str, bool], dict[str, Any]]:
        if not self.agents:
            raise ConfigError("Every agent is done; call reset() to play again.")
        live = list(self.agents)
        self._rewards = dict.fromkeys(live, 0.0)
        self.reward_components = {a: {} for a in live}
        self._moves = {}
        turns: dict[str, dict[str, Any]] = {}
        self._steps += 1
        for agent in live:
            self._inbox[agent] = []
            self._acting = agent
            result = run_turn(actions.get(agent), self._parsers[agent], self._toolsets[agent],
                              max_action_chars=self.max_action_chars)
            if not result.moved:
                self._moves[agent] = self._default_move(agent)
                self._add_reward(agent, "invalid_action", -self.invalid_action_penalty)
                self._invalid_streak[agent] += 1
                message = f"{result.message} Your move this round defaulted to {self._moves[agent]}."
            else:
                self._invalid_streak[agent] = 0
                message = result.message
            self._inbox[agent].append(message)
            turns[agent] = {**result.info, "kind": result.kind}
        self._resolve(dict(self._moves))
        if not self._over:
            quitters = [a for a in live if self.max_invalid_actions is not None
                        and self._invalid_streak[a] >= self.max_invalid_actions]
            if quitters:
                self._forfeit(quitters)
        truncated = not self._over and self._steps >= self.max_steps
        if truncated:
            self._end_game({a: {"success": False, "score": 0.0, "end_reason": "max_turns", "result": "truncated"}
                            for a in live}, f"Stopped after {self.max_steps} steps.")
        observations = {a: self._observe(a) for a in live}
        rewards = {a: float(self._rewards.get(a, 0.0)) for a in live}
        terminations = {a: self._over and not truncated for a in live}
        truncations = dict.fromkeys(live, truncated)
        infos: dict[str, Any] = {}
        for agent in live:
            turns[agent]["rewards"] = dict(self.reward_components[agent])
            infos[agent] = {"turn": turns[agent]}
            if self._over:
                infos[agent]["outcome"] = dict(self._outcomes[agent])
        if self._over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def _forfeit(self, agents: Sequence[str]) -> None:
        """End the game because ``agents`` kept making bad replies (default: they fail, the others do not win)."""
        self._end_game({a: {"success": False, "score": 0.0, "end_reason": "failed",
                            "result": "forfeit" if a in agents else "opponent_forfeit"} for a in self.agents},
                       f"{', '.join(agents)} made {self.max_invalid_actions} invalid replies in a row.")

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return self._render_state(self.possible_agents[0])

    def close(self) -> None:
        """Idempotent; nothing external to release."""
