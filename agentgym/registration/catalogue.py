"""The one catalogue of environment ids.

Every id is registered here with a string entry point, so importing :mod:`agentgym` registers the whole
catalogue without importing any env module (or its heavy dependencies). Ids of other packages come in through
entry-point plugins (:mod:`agentgym.registration.plugins`), registered right after ours. Bump the version suffix when an
env's rewards, tools or termination change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from agentgym.errors import RegistrationError, did_you_mean

__all__ = ["CATALOGUE", "CLIENT_CATALOGUE", "CatalogueEntry", "all_entries", "env_ids", "get_entry", "register_all"]

NAMESPACE = "agentgym"


@dataclass(frozen=True)
class CatalogueEntry:
    """One registered env: id, entry point, a one-line description and default kwargs."""

    id: str
    entry_point: str
    description: str
    family: str
    kwargs: dict[str, Any] = field(default_factory=dict)


CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry(
        "agentgym/Calculator-v0",
        "agentgym.envs.games.calculator:CalculatorEnv",
        "Arithmetic question: call calc(expression), read the result, then answer(value).",
        "games",
    ),
    CatalogueEntry(
        "agentgym/GuessNumber-v0",
        "agentgym.envs.games.guess_number:GuessNumberEnv",
        "Find a secret integer by guessing; each guess is answered 'higher', 'lower' or 'correct'.",
        "games",
    ),
    CatalogueEntry(
        "agentgym/Maze-v0",
        "agentgym.envs.games.maze:MazeEnv",
        "Walk a grid maze to the exit with move(direction); the agent sees its surroundings as text.",
        "games",
    ),
    CatalogueEntry(
        "agentgym/Sokoban-v0",
        "agentgym.envs.games.sokoban:SokobanEnv",
        "Push every box onto a target in a generated text-grid Sokoban room (6x6, 1-2 boxes) with move(direction).",
        "games",
    ),
    CatalogueEntry(
        "agentgym/BabyAI-v0",
        "agentgym.envs.babyai.env:BabyAIEnv",
        "Follow a BabyAI mission in a minigrid world described as text (BALROG style): turn, go forward, pick up.",
        "babyai",
    ),
    CatalogueEntry(
        "agentgym/CodeInterpreter-v1",
        "agentgym.envs.code_interpreter.env:CodeInterpreterEnv",
        "Solve math/algorithmic problems by running Python in a sandbox (SimpleTIR style); answer in \\boxed{}.",
        "code_interpreter",
    ),
    CatalogueEntry(
        "agentgym/SWE-v1",
        "agentgym.envs.swe.env:SWEEnv",
        "Fix a bug injected into a real Python library; graded by its hidden tests (bash, view, str_replace, submit).",
        "swe",
    ),
    CatalogueEntry(
        "agentgym/Chess-vs-Stockfish-v0",
        "agentgym.envs.multi_agent.selfplay:ChessVsStockfishEnv",
        'Chess against Stockfish over UCI (skill 0 by default) as White or Black: move("e2e4").',
        "multi_agent",
    ),
    CatalogueEntry(
        "agentgym/Negotiation-SelfPlay-v0",
        "agentgym.envs.multi_agent.selfplay:NegotiationSelfPlayEnv",
        'Deal or no deal against a scripted negotiator: propose(book, hat, ball), accept(), walk_away().',
        "multi_agent",
    ),
    CatalogueEntry(
        "agentgym/TicTacToe-SelfPlay-v0",
        "agentgym.envs.multi_agent.selfplay:TicTacToeSelfPlayEnv",
        'Tic-tac-toe against a scripted bot (win, block, centre): play(cell).',
        "multi_agent",
    ),
    CatalogueEntry(
        "agentgym/ConnectFour-SelfPlay-v0",
        "agentgym.envs.multi_agent.selfplay:ConnectFourSelfPlayEnv",
        'Connect-four against a scripted bot (win, block, centre): play(column).',
        "multi_agent",
    ),
    CatalogueEntry(
        "agentgym/Referential-SelfPlay-v0",
        "agentgym.envs.multi_agent.selfplay:ReferentialSelfPlayEnv",
        'Describe a target object so that a scripted listener picks it: describe(message).',
        "multi_agent",
    ),
    CatalogueEntry(
        "agentgym/PrisonersDilemma-SelfPlay-v0",
        "agentgym.envs.multi_agent.selfplay:PrisonersDilemmaSelfPlayEnv",
        "Iterated prisoner's dilemma against tit for tat: cooperate() or defect().",
        "multi_agent",
    ),
    CatalogueEntry(
        "agentgym/WebShop-v1",
        "agentgym.envs.web.env:WebShopEnv",
        'Buy what a WebShop-style instruction asks in a local grocery shop, in a real Chromium driven through accessibility snapshots.',
        "web",
    ),
    CatalogueEntry(
        "agentgym/WebShop-text-v1",
        "agentgym.envs.web.env:WebShopTextEnv",
        'The same shop rendered as the same accessibility snapshots without a browser, for fast RL.',
        "web",
    ),
    CatalogueEntry(
        "agentgym/MiniWoB-v0",
        "agentgym.envs.gui.env:MiniWoBEnv",
        "MiniWoB++ web tasks by pixels: screenshot in, click(x, y)/type/key/scroll/drag out; the page's own reward.",
        "gui",
    ),
    CatalogueEntry(
        "agentgym/Search-v1",
        "agentgym.envs.search.env:SearchEnv",
        "Answer 1-3 hop questions over 11k real Wikipedia/fact documents with search(query, k), open(doc_id), answer(text); "
        "hedged answers fail.",
        "search",
    ),
    CatalogueEntry(
        "agentgym/TextWorld-v0",
        "agentgym.envs.textworld.env:TextWorldEnv",
        'TextWorld cooking and household games generated offline: command("open fridge"); the game\'s own score.',
        "textworld",
    ),
    CatalogueEntry(
        "agentgym/ScienceWorld-v0",
        "agentgym.envs.scienceworld.env:ScienceWorldEnv",
        'ScienceWorld\'s 30 science task types (Java simulator): command("open door to kitchen"); the simulator\'s score.',
        "scienceworld",
    ),
)


#: Ids that are clients of a server rather than envs of their own: registered like the others, but they need
#: arguments (``url=...``) to be made, so :func:`env_ids` (the ids every conformance test makes bare) leaves them out.
CLIENT_CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry(
        "agentgym/Remote-v0",
        "agentgym.serving.remote_env:RemoteEnv",
        "Any env served by 'agentgym serve-env' (OpenEnv's protocol): gym.make('agentgym/Remote-v0', url=...).",
        "remote",
    ),
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


def register_all() -> None:
    """Register every catalogue entry with Gymnasium, then the env ids of installed plugins (idempotent)."""
    for entry in CATALOGUE + CLIENT_CATALOGUE:
        if entry.id in gym.registry:
            continue
        gym.register(id=entry.id, entry_point=entry.entry_point, kwargs=dict(entry.kwargs), disable_env_checker=False)
    from agentgym.registration.plugins import load_plugins

    load_plugins()


def all_entries() -> list[CatalogueEntry]:
    """Our catalogue followed by the env ids that installed plugins declare (see :mod:`agentgym.registration.plugins`)."""
    from agentgym.registration.plugins import plugin_entries

    return list(CATALOGUE) + list(CLIENT_CATALOGUE) + plugin_entries()
