"""The catalogue of multi-agent ids and ``make_multi_agent`` / ``make_multi_agent_parallel``.

Multi-agent games are PettingZoo envs, not Gymnasium envs, so they are not in ``gym.registry``; this
module is their registry. Like the single-agent catalogue it holds only strings (ids, entry points,
descriptions), so importing it costs nothing and needs neither PettingZoo nor OpenSpiel: ``agentgym list``
can show the ids on any install, and ``make_multi_agent`` imports a game only when it is made.

The single-agent views of these games (``SelfPlay``) are ordinary Gymnasium ids in the main catalogue
(``agentgym/Chess-vs-Stockfish-v0``, ...); :data:`SELFPLAY_ENTRIES` lists them for that catalogue.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import RegistrationError, did_you_mean

__all__ = [
    "MULTI_AGENT_CATALOGUE",
    "SELFPLAY_ENTRIES",
    "MultiAgentEntry",
    "SelfPlayEntry",
    "get_multi_agent_entry",
    "make_multi_agent",
    "make_multi_agent_parallel",
    "multi_agent_ids",
]

_PKG = "agentgym.envs.multi_agent"


@dataclass(frozen=True)
class MultiAgentEntry:
    """One multi-agent game id.

    Attributes:
        id: ``agentgym/<Name>-v<N>``.
        aec_entry_point: ``module:Class`` of the turn-based (AEC) form.
        parallel_entry_point: ``module:Class`` of the simultaneous-move (Parallel) form, if the game has one.
        description: One line for ``agentgym list``.
        family: Always ``multi_agent``.
        kwargs: Default constructor arguments.
    """

    id: str
    aec_entry_point: str
    parallel_entry_point: str | None
    description: str
    family: str = "multi_agent"
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SelfPlayEntry:
    """A single-agent (SelfPlay) id for the main Gymnasium catalogue (same fields as ``CatalogueEntry``)."""

    id: str
    entry_point: str
    description: str
    family: str = "multi_agent"


MULTI_AGENT_CATALOGUE: tuple[MultiAgentEntry, ...] = (
    MultiAgentEntry("agentgym/Negotiation-v0", f"{_PKG}.negotiation:NegotiationEnv", None,
                    "Deal or no deal: split books, hats and balls with private values; propose, accept or walk away."),
    MultiAgentEntry("agentgym/TicTacToe-v0", f"{_PKG}.board_games:TicTacToeEnv", None,
                    "Tic-tac-toe on OpenSpiel's rules between two text agents: play(cell)."),
    MultiAgentEntry("agentgym/ConnectFour-v0", f"{_PKG}.board_games:ConnectFourEnv", None,
                    "Connect-four on OpenSpiel's rules between two text agents: play(column)."),
    MultiAgentEntry("agentgym/Chess-v0", f"{_PKG}.chess:ChessEnv", None,
                    "Chess on OpenSpiel's rules between two text agents: move(\"e2e4\") in UCI or SAN."),
    MultiAgentEntry("agentgym/Referential-v0", f"{_PKG}.referential:ReferentialEnv", None,
                    "Cooperative: a speaker describes a target object, a listener (other order) must pick it."),
    MultiAgentEntry("agentgym/PrisonersDilemma-v0", f"{_PKG}.prisoners_dilemma:PrisonersDilemmaEnv",
                    f"{_PKG}.prisoners_dilemma:PrisonersDilemmaParallelEnv",
                    "Iterated prisoner's dilemma: cooperate() or defect(); simultaneous in the parallel form."),
)

SELFPLAY_ENTRIES: tuple[SelfPlayEntry, ...] = (
    SelfPlayEntry("agentgym/Chess-vs-Stockfish-v0", f"{_PKG}.selfplay:ChessVsStockfishEnv",
                  "Chess against Stockfish over UCI (skill 0 by default) as White or Black: move(\"e2e4\")."),
    SelfPlayEntry("agentgym/Negotiation-SelfPlay-v0", f"{_PKG}.selfplay:NegotiationSelfPlayEnv",
                  "Deal or no deal against a scripted negotiator: propose(book, hat, ball), accept(), walk_away()."),
    SelfPlayEntry("agentgym/TicTacToe-SelfPlay-v0", f"{_PKG}.selfplay:TicTacToeSelfPlayEnv",
                  "Tic-tac-toe against a scripted bot (win, block, centre): play(cell)."),
    SelfPlayEntry("agentgym/ConnectFour-SelfPlay-v0", f"{_PKG}.selfplay:ConnectFourSelfPlayEnv",
                  "Connect-four against a scripted bot (win, block, centre): play(column)."),
    SelfPlayEntry("agentgym/Referential-SelfPlay-v0", f"{_PKG}.selfplay:ReferentialSelfPlayEnv",
                  "Describe a target object so that a scripted listener picks it: describe(message)."),
    SelfPlayEntry("agentgym/PrisonersDilemma-SelfPlay-v0", f"{_PKG}.selfplay:PrisonersDilemmaSelfPlayEnv",
                  "Iterated prisoner's dilemma against tit for tat: cooperate() or defect()."),
)


def multi_agent_ids() -> list[str]:
    """Every multi-agent (PettingZoo) id."""
    return [e.id for e in MULTI_AGENT_CATALOGUE]


def get_multi_agent_entry(env_id: str) -> MultiAgentEntry:
    """Look up an id; unknown ids get 'did you mean' (also pointing at SelfPlay ids made with gym.make)."""
    for entry in MULTI_AGENT_CATALOGUE:
        if entry.id == env_id:
            return entry
    hint = ""
    if any(e.id == env_id for e in SELFPLAY_ENTRIES):
        hint = " It is a single-agent (SelfPlay) id: make it with gym.make or agentgym.make."
    raise RegistrationError(f"Unknown multi-agent id {env_id!r}.{did_you_mean(env_id, multi_agent_ids())}{hint} "
                            "Run 'agentgym list' to see all ids.")


def _load(entry_point: str) -> Any:
    module_name, _, attr = entry_point.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def make_multi_agent(env_id: str, **kwargs: Any) -> Any:
    """Make the turn-based (AEC) form of a multi-agent game, e.g. ``make_multi_agent("agentgym/Negotiation-v0")``."""
    entry = get_multi_agent_entry(env_id)
    return _load(entry.aec_entry_point)(**{**entry.kwargs, **kwargs})


def make_multi_agent_parallel(env_id: str, **kwargs: Any) -> Any:
    """Make the simultaneous-move (Parallel) form of a game that has one (e.g. the prisoner's dilemma)."""
    entry = get_multi_agent_entry(env_id)
    if entry.parallel_entry_point is None:
        with_parallel = [e.id for e in MULTI_AGENT_CATALOGUE if e.parallel_entry_point]
        raise RegistrationError(f"{env_id} is turn-based and has no parallel form; ids with one: {with_parallel}. Use "
                                "make_multi_agent for the AEC form.")
    return _load(entry.parallel_entry_point)(**{**entry.kwargs, **kwargs})
