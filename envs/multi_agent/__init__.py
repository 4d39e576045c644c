"""Multi-agent text games on the PettingZoo API, real opponents (Stockfish over UCI) and self-play.

* Games (``make_multi_agent(id)``): negotiation (deal or no deal), tic-tac-toe and connect-four and chess
  on OpenSpiel's rules, a cooperative referential game, and the iterated prisoner's dilemma (also as a
  simultaneous-move Parallel env via ``make_multi_agent_parallel``). Observations are dicts with a numeric
  ``observation``, an ``action_mask`` and the ``text`` a model reads; actions are the model's raw text,
  parsed like single-agent actions.
* :class:`SelfPlay` turns one seat into a single-agent ``AgentEnv`` (``agentgym/Chess-vs-Stockfish-v0``,
  ``agentgym/Negotiation-SelfPlay-v0``, ...) so every single-agent trainer can train on it.
* Whole games with one policy per seat are played by the rollout layer's multi-agent engine
  (:class:`agentgym.rollout.MultiAgentRolloutEngine`); envs never import the rollout layer, and the engine's
  names here are deprecated aliases kept for one release.

Everything but :mod:`.registry` needs the ``agentgym[multiagent]`` extra (PettingZoo, OpenSpiel);
attributes load lazily so that ``agentgym list`` works without it.
"""

from __future__ import annotations

from agentgym.utils.lazy import lazy_attributes

from agentgym.registration.multi_agent import (
    MULTI_AGENT_CATALOGUE,
    SELFPLAY_ENTRIES,
    make_multi_agent,
    make_multi_agent_parallel,
    multi_agent_ids,
)

__all__ = [
    "MULTI_AGENT_CATALOGUE",
    "SELFPLAY_ENTRIES",
    "CheckpointOpponent",
    "ChessEnv",
    "ConnectFourEnv",
    "League",
    "NegotiationEnv",
    "Opponent",
    "PolicyOpponent",
    "PrisonersDilemmaEnv",
    "PrisonersDilemmaParallelEnv",
    "RandomOpponent",
    "ReferentialEnv",
    "ScriptedOpponent",
    "SelfPlay",
    "StockfishConfig",
    "StockfishEngine",
    "StockfishOpponent",
    "TextAECEnv",
    "TextParallelEnv",
    "TicTacToeEnv",
    "make_multi_agent",
    "make_multi_agent_parallel",
    "multi_agent_ids",
]

_LAZY = {
    "TextAECEnv": "base",
    "TextParallelEnv": "parallel",
    "ChessEnv": "chess",
    "TicTacToeEnv": "board_games",
    "ConnectFourEnv": "board_games",
    "NegotiationEnv": "negotiation",
    "ReferentialEnv": "referential",
    "PrisonersDilemmaEnv": "prisoners_dilemma",
    "PrisonersDilemmaParallelEnv": "prisoners_dilemma",
    "StockfishConfig": "stockfish",
    "StockfishEngine": "stockfish",
    "Opponent": "opponents",
    "RandomOpponent": "opponents",
    "ScriptedOpponent": "opponents",
    "StockfishOpponent": "opponents",
    "PolicyOpponent": "opponents",
    "CheckpointOpponent": "opponents",
    "League": "opponents",
    "SelfPlay": "selfplay",
    # Deprecated: the engine moved to agentgym.rollout.multi_agent; these go through the old module path, which warns.
    "MultiAgentEpisodeSpec": "rollout",
    "MultiAgentRolloutConfig": "rollout",
    "MultiAgentRolloutEngine": "rollout",
}


__getattr__, __dir__ = lazy_attributes(__name__, {name: f"{__name__}.{module}" for name, module in _LAZY.items()})
