"""Each env is described once, in its class docstring: every registered id's docstring has the fixed sections,
its ``## Tools`` names the env's real tools, and ``agentgym list`` shows its summary line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import FrozenInstanceError

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.registration.multi_agent import MULTI_AGENT_CATALOGUE, make_multi_agent, make_multi_agent_parallel
from agentgym.errors import RegistrationError
from agentgym.registration.catalogue import CATALOGUE, get_entry
from agentgym.registration.env_docs import (
    SECTIONS,
    EnvDoc,
    entry_point_doc,
    entry_point_summary,
    env_doc,
    parse_env_docstring,
)

#: Ids whose env needs a system program to be made: (program, why); skipped only where it is missing (`make test`
#: installs both), and their docstrings are still checked.
NEEDS = {
    "agentgym/WebShop-v1": ("chromium", "needs a browser (Playwright's Chromium)"),
    "agentgym/MiniWoB-v0": ("chromium", "needs a browser (Playwright's Chromium)"),
    "agentgym/ScienceWorld-v0": ("java", "needs Java (the ScienceWorld simulator)"),
}
#: Cheap settings for ids whose default construction loads something big.
CHEAP_KWARGS = {"agentgym/Search-v1": {"corpus": "profiles"}}

GYM_IDS = [e.id for e in CATALOGUE]
GAMES = {g.id: g for g in MULTI_AGENT_CATALOGUE}


def _required_tools(doc: EnvDoc) -> list[str]:
    """The documented tools of a default-made env (those marked ``(only with ...)`` need other arguments)."""
    return sorted(t.name for t in doc.tools if not t.optional)


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_docstring_has_every_section(env_id: str) -> None:
    doc = env_doc(env_id)
    assert doc.env_id == env_id and doc.class_path == get_entry(env_id).entry_point
    assert doc.summary and "\n" not in doc.summary
    for text in (doc.description, doc.reward, doc.episode_end, doc.arguments, doc.version_history):
        assert text.strip()
    assert doc.tools


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_documented_tools_are_the_real_tools(env_id: str) -> None:
    doc = env_doc(env_id)
    program, why = NEEDS.get(env_id, ("", ""))
    if program and shutil.which(program) is None:
        pytest.skip(why)
    env = gym.make(env_id, **CHEAP_KWARGS.get(env_id, {}))
    try:
        assert _required_tools(doc) == sorted(env.unwrapped.toolset.names), (
            f"{doc.class_path}'s '## Tools' must list the env's tools (mark those that need arguments "
            "'(only with ...)')")
    finally:
        env.close()


def test_optional_tools_appear_with_their_arguments() -> None:
    doc = env_doc("agentgym/Referential-SelfPlay-v0")
    env = gym.make("agentgym/Referential-SelfPlay-v0", learner="listener_0")
    assert {t.name for t in doc.tools if t.optional} == set(env.unwrapped.toolset.names)


@pytest.mark.parametrize("game_id", list(GAMES))
def test_multi_agent_games_are_documented(game_id: str) -> None:
    """PettingZoo games are not Gymnasium ids: their docs come from the registry's entry points; ``## Tools``
    lists every seat's tools."""
    game = GAMES[game_id]
    entry_points = [game.aec_entry_point] + ([game.parallel_entry_point] if game.parallel_entry_point else [])
    for entry_point, make in zip(entry_points, (make_multi_agent, make_multi_agent_parallel)):
        doc = entry_point_doc(entry_point, game_id)
        env = make(game_id)
        real = {name for agent in env.possible_agents for name in env.toolset(agent).names}
        assert set(_required_tools(doc)) == real, entry_point


def test_agentgym_list_shows_each_summary() -> None:
    env = {**os.environ, "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-m", "agentgym.cli", "list"], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout
    flat = " ".join(out.split())
    for entry in CATALOGUE:
        assert entry.summary and " ".join(entry.summary.split()) in flat, entry.id
    for game in MULTI_AGENT_CATALOGUE:
        assert " ".join(entry_point_summary(game.aec_entry_point).split()) in flat, game.id


def test_summary_is_read_without_importing_the_env() -> None:
    code = ("import sys, agentgym\nfrom agentgym.registration.catalogue import CATALOGUE\n"
            "summaries = [e.summary for e in CATALOGUE]\n"
            "assert all(summaries), summaries\n"
            "loaded = [m for m in sys.modules if m.startswith('agentgym.envs.')]\n"
            "assert not loaded, loaded\n"
            "assert 'agentgym.registration.summaries' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_import_agentgym_does_not_load_env_docs() -> None:
    code = "import sys, agentgym\nassert 'agentgym.registration.env_docs' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_summary_equals_the_imported_class_docstring() -> None:
    for entry in CATALOGUE:
        assert entry.summary == env_doc(entry.id).summary, entry.id


def test_a_missing_section_is_named() -> None:
    doc = "Summary.\n\n## Description\n\nx\n\n## Tools\n\n- `a()`: b\n\n## Reward\n\n1\n\n## Arguments\n\n- none\n"
    with pytest.raises(RegistrationError, match="## Episode end"):
        parse_env_docstring(doc, where="mod:Cls")
    with pytest.raises(RegistrationError, match="no docstring"):
        parse_env_docstring(None, where="mod:Cls")
    with pytest.raises(RegistrationError, match="Did you mean"):
        env_doc("agentgym/Calculater-v0")


def test_env_doc_is_frozen() -> None:
    doc = env_doc("agentgym/Calculator-v0")
    assert doc.tool_names == ("calc", "answer") and set(SECTIONS) >= {"Tools", "Reward"}
    with pytest.raises(FrozenInstanceError):
        doc.summary = "x"  # type: ignore[misc]
