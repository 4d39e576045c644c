"""The one catalogue of environment ids.

Every id is registered here with a string entry point, so importing :mod:`agentgym` registers the whole
catalogue without importing any env module (or its heavy dependencies). Ids of other packages come in through
entry-point plugins (:mod:`agentgym.registration.plugins`), registered right after ours. Bump the version suffix when an
env's rewards, tools or termination change (and add a line to its docstring's ``## Version history``).

The entries hold no prose: each env describes itself once, in its class docstring, and ``agentgym list`` shows
that docstring's summary line (:attr:`CatalogueEntry.summary`).
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.registration import WrapperSpec

from agentgym.errors import RegistrationError, did_you_mean
from agentgym.registration.entry import CatalogueEntry

__all__ = ["CATALOGUE", "CLIENT_CATALOGUE", "CatalogueEntry", "all_entries", "env_ids", "get_entry", "register_all"]

NAMESPACE = "agentgym"


CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry("agentgym/Calculator-v0", "agentgym.envs.games.calculator:CalculatorEnv", family="games"),
    CatalogueEntry("agentgym/GuessNumber-v0", "agentgym.envs.games.guess_number:GuessNumberEnv", family="games"),
    CatalogueEntry("agentgym/Maze-v0", "agentgym.envs.games.maze:MazeEnv", family="games"),
    CatalogueEntry("agentgym/Sokoban-v0", "agentgym.envs.games.sokoban:SokobanEnv", family="games"),
    CatalogueEntry("agentgym/BabyAI-v0", "agentgym.envs.babyai.env:BabyAIEnv", family="babyai"),
    CatalogueEntry("agentgym/CodeInterpreter-v1",
                   "agentgym.envs.code_interpreter.env:CodeInterpreterEnv", family="code_interpreter"),
    CatalogueEntry("agentgym/SWE-v1", "agentgym.envs.swe.env:SWEEnv", family="swe"),
    CatalogueEntry("agentgym/Chess-vs-Stockfish-v0",
                   "agentgym.envs.multi_agent.selfplay:ChessVsStockfishEnv", family="multi_agent"),
    CatalogueEntry("agentgym/Negotiation-SelfPlay-v0",
                   "agentgym.envs.multi_agent.selfplay:NegotiationSelfPlayEnv", family="multi_agent"),
    CatalogueEntry("agentgym/TicTacToe-SelfPlay-v0",
                   "agentgym.envs.multi_agent.selfplay:TicTacToeSelfPlayEnv", family="multi_agent"),
    CatalogueEntry("agentgym/ConnectFour-SelfPlay-v0",
                   "agentgym.envs.multi_agent.selfplay:ConnectFourSelfPlayEnv", family="multi_agent"),
    CatalogueEntry("agentgym/Referential-SelfPlay-v0",
                   "agentgym.envs.multi_agent.selfplay:ReferentialSelfPlayEnv", family="multi_agent"),
    CatalogueEntry("agentgym/PrisonersDilemma-SelfPlay-v0",
                   "agentgym.envs.multi_agent.selfplay:PrisonersDilemmaSelfPlayEnv", family="multi_agent"),
    CatalogueEntry("agentgym/WebShop-v1", "agentgym.envs.web.env:WebShopEnv", family="web"),
    CatalogueEntry("agentgym/WebShop-text-v1", "agentgym.envs.web.env:WebShopTextEnv", family="web"),
    CatalogueEntry("agentgym/MiniWoB-v0", "agentgym.envs.gui.env:MiniWoBEnv", family="gui"),
    CatalogueEntry("agentgym/Search-v1", "agentgym.envs.search.env:SearchEnv", family="search"),
    CatalogueEntry("agentgym/Report-v0", "agentgym.envs.report.env:ReportEnv", family="report"),
    CatalogueEntry("agentgym/Support-v0", "agentgym.envs.dialogue.env:SupportEnv", family="dialogue"),
    CatalogueEntry("agentgym/TextWorld-v0", "agentgym.envs.textworld.env:TextWorldEnv", family="textworld"),
    CatalogueEntry("agentgym/ScienceWorld-v0", "agentgym.envs.scienceworld.env:ScienceWorldEnv", family="scienceworld"),
    CatalogueEntry("agentgym/LongQuest-v0", "agentgym.envs.quest.env:LongQuestEnv", family="quest"),
)


#: Ids that are clients of a server rather than envs of their own: registered like the others, but they need
#: arguments (``url=...``) to be made, so :func:`env_ids` (the ids every conformance test makes bare) leaves them out.
CLIENT_CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry("agentgym/Remote-v0", "agentgym.serving.remote_env:RemoteEnv", family="remote"),
)


def env_ids() -> list[str]:
    """The ids of the envs themselves (not :data:`CLIENT_CATALOGUE`): each can be made with no arguments."""
    return [e.id for e in CATALOGUE]


def get_entry(env_id: str) -> CatalogueEntry:
    """Look up an id (with or without the ``agentgym:`` module prefix); unknown ids get 'did you mean'."""
    bare = env_id.split(":", 1)[1] if env_id.startswith("agentgym:") else env_id
    for entry in CATALOGUE + CLIENT_CATALOGUE:
        if entry.id == bare:
            return entry
    raise RegistrationError(
        f"Unknown environment id {env_id!r}.{did_you_mean(bare, env_ids())} Run 'agentgym list' to see all ids."
    )


# A TimeLimit from ``gym.make(id, max_episode_steps=N)`` truncates without telling the env; this wrapper hands the
# limit to the env so the last step still carries ``info["outcome"]`` (a string entry point: nothing imported here).
_OUTCOME_ON_TIME_LIMIT = WrapperSpec(name="OutcomeOnTimeLimit", entry_point="agentgym.env:OutcomeOnTimeLimit", kwargs={})


def register_all() -> None:
    """Register every catalogue entry with Gymnasium, then the env ids of installed plugins (idempotent)."""
    for entry in CATALOGUE + CLIENT_CATALOGUE:
        if entry.id in gym.registry:
            continue
        gym.register(id=entry.id, entry_point=entry.entry_point, kwargs=dict(entry.kwargs), disable_env_checker=False,
                     additional_wrappers=(_OUTCOME_ON_TIME_LIMIT,))
    from agentgym.registration.plugins import load_plugins

    load_plugins()


def all_entries() -> list[CatalogueEntry]:
    """Our catalogue followed by the env ids that installed plugins declare (see :mod:`agentgym.registration.plugins`)."""
    from agentgym.registration.plugins import plugin_entries

    return list(CATALOGUE) + list(CLIENT_CATALOGUE) + plugin_entries()
