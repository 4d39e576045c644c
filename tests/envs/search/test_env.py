"""Search-v1: tools, bad input, formats, rewards, suites' solvability (its contract: test_registry_conformance)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from agentgym.errors import ConfigError, DependencyNotInstalled
from agentgym.suite import Task
from agentgym.registration.suites import load_suite

ENV_ID = "agentgym/Search-v1"


def _search_data() -> bool:
    try:
        import bm25s  # noqa: F401
        from agentgym.envs.search.sources import source_versions

        source_versions()
    except (ImportError, DependencyNotInstalled):
        return False
    return True


pytestmark = pytest.mark.skipif(not _search_data(), reason="needs agentgym[search] (bm25s and the data packages)")

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="agentgym.envs.search.env:SearchEnv")

PERU = Task("peru", "What currency is used in the country whose capital is Lima?", "Sol",
            {"aliases": ["Sol", "PEN", "Peruvian Sol"],
             "path": [{"query": "Lima capital of which country", "gold": ["country-peru"], "finds": "Peru"},
                      {"query": "currency of Peru", "gold": ["country-peru"], "finds": "Sol"}]})


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture()
def env():
    environment = gym.make(ENV_ID)
    environment.reset(seed=0, options={"task": PERU})
    yield environment
    environment.close()


def test_reset_shows_the_question_and_the_formats() -> None:
    environment = gym.make(ENV_ID)
    obs, info = environment.reset(seed=0, options={"task": PERU})
    assert obs == "Question: What currency is used in the country whose capital is Lima?"
    assert [t["function"]["name"] for t in info["tools"]] == ["search", "open", "answer"]
    for fragment in ("<tool_call>", "<search>", "<answer>", 'search("capital of Peru")', "You have 8 turns.",
                     "names more than one candidate"):
        assert fragment in info["instructions"]
    obs, _ = environment.reset(seed=7)  # no task: a question is generated from the seed
    assert obs.startswith("Question: ")


# ---- tools -------------------------------------------------------------------------------------------------
def test_search_returns_numbered_titled_snippets_with_ids(env) -> None:
    obs, reward, terminated, truncated, info = env.step(call("search", query="currency of Peru", k=3))
    assert info["turn"]["kind"] == "tool_call" and (reward, terminated, truncated) == (0.0, False, False)
    lines = obs.splitlines()
    assert lines[0] == 'Results for "currency of Peru":'
    assert lines[1] == "[1] Peru (country profile) (id: country-peru)"
    assert "The currency of Peru is the Sol (PEN)." in lines[2]
    assert sum(line.startswith("[") for line in lines) == 3


def test_open_by_id_by_result_number_and_by_title(env) -> None:
    env.step(call("search", query="Lima capital of which country"))
    obs, *_ = env.step(call("open", doc_id="country-peru"))
    assert obs.startswith("Peru (country profile) (id: country-peru)\n") and "population of" in obs
    obs, *_ = env.step('open("1")')
    assert "(id: " in obs.splitlines()[0]
    obs, *_ = env.step("<open>Lima</open>")  # an exact title works too
    assert obs.startswith("Lima (id: wiki-lima)")


@pytest.mark.parametrize("action", [
    call("search", query=""),
    call("search", query="   "),
    call("search", query="x" * 100_000),
    call("search", query="capital", k=0),
    call("search", query="capital", k=10**6),
    call("search", query="capital", k=-1),
    call("search", query="capital", k=None),
    call("search", query=["not", "text"]),
    call("open", doc_id="no-such-document"),
    call("open", doc_id="9"),
    call("open", doc_id=""),
    call("answer"),
    "search()",
    "search(capital of Peru)",
    "<search></search>",
])
def test_bad_input_gives_an_error_observation_and_the_episode_continues(action: str) -> None:
    environment = gym.make(ENV_ID, max_action_chars=200_000)
    environment.reset(seed=0, options={"task": PERU})
    obs, reward, terminated, truncated, info = environment.step(action)
    assert obs.startswith("Error") and info["turn"]["kind"] == "invalid"
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, *_ = environment.step(call("search", query="capital of Peru"))
    assert obs.startswith("Results for")


def test_bad_input_messages_say_the_fix(env) -> None:
    assert "empty" in env.step(call("search", query=""))[0]
    assert "between 1 and 20" in env.step(call("search", query="capital", k=10**6))[0]
    assert "Did you mean 'country-peru'" in env.step(call("open", doc_id="country-peruu"))[0]
    huge = env.step(call("search", query="y" * 100_000))[0]  # over the env's action limit: refused before parsing
    assert "characters" in huge and "limit" in huge


def test_query_over_the_limit_is_refused_by_the_tool() -> None:
    environment = gym.make(ENV_ID, max_action_chars=200_000)
    environment.reset(seed=0, options={"task": PERU})
    obs, *_ = environment.step(call("search", query="capital " * 12_500))
    assert obs.startswith("Error: the query has 100000 characters; the limit is 500.")


def test_unmatched_query_is_not_an_error(env) -> None:
    obs, _, _, _, info = env.step(call("search", query="zzqqxx vvwwyy"))
    assert obs.startswith("No documents match") and info["turn"]["kind"] == "tool_call"


# ---- formats and rewards --------------------------------------------------------------------------------------
@pytest.mark.parametrize("action", [
    call("answer", text="Sol"),
    "<answer>the sol</answer>",
    "I think it is answer(PEN)",
    'answer("Peruvian sol")',
])
def test_every_format_and_alias_is_accepted(env, action: str) -> None:
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["turn"]["kind"] == "answer" and obs == "Correct: Sol."
    assert info["outcome"]["success"] is True and info["outcome"]["end_reason"] == "answered"
    assert info["answer"]["em"] == 1.0 and info["outcome"]["f1"] == 1.0


def test_search_r1_tags_search() -> None:
    environment = gym.make(ENV_ID)
    environment.reset(seed=0, options={"task": PERU})
    obs, *_ = environment.step("<think>Find Lima first.</think><search>Lima capital</search>")
    assert obs.startswith('Results for "Lima capital"')
    obs, *_ = environment.step('search("currency of Peru", 2)')
    assert obs.count("\n[") == 2


def test_wrong_answer_reports_f1_and_ends_without_reward(env) -> None:
    obs, reward, terminated, _, info = env.step("<answer>Peruvian nuevo sol</answer>")
    assert (reward, terminated) == (0.0, True)
    assert info["outcome"]["success"] is False and 0 < info["answer"]["f1"] < 1 and info["answer"]["correct"] is False
    assert obs.startswith("Wrong: the expected answer was Sol")


def test_f1_reward_is_refused_and_turn_limit() -> None:
    with pytest.raises(ConfigError, match="padded with the gold's tokens"):
        gym.make(ENV_ID, reward="f1")
    environment = gym.make(ENV_ID, max_turns=2)
    environment.reset(seed=0, options={"task": PERU})
    environment.step(call("search", query="Peru"))
    _, _, terminated, truncated, info = environment.step(call("search", query="Lima"))
    assert (terminated, truncated) == (False, True) and info["outcome"]["end_reason"] == "max_turns"


def test_bad_kwargs_say_the_fix() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'bm25'"):
        gym.make(ENV_ID, retriever="bm52")
    with pytest.raises(ConfigError, match="SimulatedSearchEngine"):
        gym.make(ENV_ID, retriever="simulated")
    with pytest.raises(ConfigError, match="Did you mean 'full'"):
        gym.make(ENV_ID, corpus="fulll")
    with pytest.raises(ConfigError, match="top_k"):
        gym.make(ENV_ID, top_k=30)
    with pytest.raises(ConfigError, match="reward"):
        gym.make(ENV_ID, reward="exact")
    assert gym.make(ENV_ID, reward="em").unwrapped.reward_metric == "grade"  # v0's name for the same decision


def test_simulated_search_engine_in_the_env() -> None:
    from agentgym.tools.retrieval import SimulatedSearchEngine

    from agentgym.policies import ScriptedPolicy

    engine = SimulatedSearchEngine(ScriptedPolicy(lambda m: "Peru facts\nThe currency of Peru is the sol."), noise=0.0)
    environment = gym.make(ENV_ID, retriever=engine)
    environment.reset(seed=0, options={"task": PERU})
    obs, *_ = environment.step(call("search", query="currency of Peru", k=2))
    doc_id = obs.splitlines()[1].split("(id: ")[1].rstrip(")")
    assert doc_id.startswith("sim-")
    obs, *_ = environment.step(call("open", doc_id=doc_id))
    assert "The currency of Peru is the sol." in obs


def test_small_profiles_corpus_and_reference_solver() -> None:
    environment = gym.make(ENV_ID, corpus="profiles")
    obs, _ = environment.reset(seed=0, options={"task": PERU})
    solver = environment.unwrapped.reference_solver()
    actions = []
    for _ in range(4):
        action = solver(obs)
        actions.append(action)
        obs, reward, terminated, truncated, _ = environment.step(action)
        if terminated or truncated:
            break
    assert reward == 1.0 and len(actions) == 3
    assert environment.unwrapped.corpus.name == "profiles" and len(environment.unwrapped.corpus) < 2000


def test_shortcut_solver_answers_without_searching(env) -> None:
    action = env.unwrapped.shortcut_solver()("")
    assert action == "<answer>Peru</answer>"
    _, reward, terminated, _, _ = env.step(action)
    assert (reward, terminated) == (0.0, True)


# ---- suites ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("suite", "split"), [("search-smoke", "train"), ("search-smoke", "test"), ("search-test", "test")])
def test_every_suite_question_is_solvable_along_its_reference_path(suite: str, split: str) -> None:
    report = load_suite(suite).validate(split)
    assert report.ok, str(report)


def test_suites_load_with_the_declared_sizes() -> None:
    smoke, train, test = load_suite("search-smoke"), load_suite("search-train"), load_suite("search-test")
    assert (len(smoke.train), len(smoke.test)) == (18, 18)
    assert (len(train.train), len(train.test), len(test.test)) == (2000, 200, 500)
    assert all(s.env_id == ENV_ID for s in (smoke, train, test))
    assert {t.metadata["hops"] for t in test.test} == {1, 2, 3}


def test_outcome_reports_kind_type_and_answer_position_of_suite_tasks() -> None:
    """Per-type success is visible in every outcome, so comparisons (chance 50 %) are reported apart."""
    tasks = load_suite("search-test").test
    comparison = next(t for t in tasks if t.metadata.get("options_named"))
    environment = gym.make(ENV_ID, corpus="profiles")
    environment.reset(seed=0, options={"task": comparison})
    _, reward, _, _, info = environment.step(call("answer", text=" or ".join(comparison.metadata["options"])))
    assert reward == 0.0 and info["outcome"]["success"] is False  # naming both options is a hedge
    assert info["outcome"]["type"] == "comparison" and info["outcome"]["kind"] == comparison.metadata["kind"]
    assert info["outcome"]["answer_position"] in ("first", "second")
    single = next(t for t in tasks if t.metadata["type"] == "single-hop")
    environment.reset(seed=0, options={"task": single})
    _, reward, _, _, info = environment.step(call("answer", text=single.answer))
    assert reward == 1.0 and info["outcome"]["type"] == "single-hop" and "answer_position" not in info["outcome"]


def test_eval_summary_reports_success_per_question_type() -> None:
    """summarize() splits success by outcome["type"], so comparisons are reported apart from the rest."""
    from agentgym.rollout import run_reference_episode, summarize

    tasks = load_suite("search-test").test
    picked = [next(t for t in tasks if t.metadata["type"] == kind) for kind in ("comparison", "single-hop")]
    environment = gym.make(ENV_ID, corpus="profiles")
    trajectories = [run_reference_episode(environment, task, seed=0) for task in picked]
    summary = summarize(trajectories)
    assert summary["success_by_type"] == {"comparison": 1.0, "single-hop": 1.0}
    assert all(t.outcome["kind"] == task.metadata["kind"] for t, task in zip(trajectories, picked, strict=True))


def test_bm25_index_is_cached_atomically_and_reloaded(tmp_path) -> None:
    """The index folder is built by agentgym.utils.cache.build_once (complete marker, no temporaries) and reloads."""
    from agentgym.envs.search.corpus import load_corpus
    from agentgym.envs.search.index import clear_retriever_cache, corpus_retriever

    corpus = load_corpus("profiles", cache_dir=tmp_path)
    built = corpus_retriever("bm25", corpus, cache_dir=tmp_path)
    folders = [p for p in (tmp_path / "search").iterdir() if p.name.startswith("index-")]
    assert len(folders) == 1 and (folders[0] / ".agentgym-complete").is_file()
    assert not [p for p in (tmp_path / "search").iterdir() if ".building-" in p.name]
    clear_retriever_cache()
    loaded = corpus_retriever("bm25", corpus, cache_dir=tmp_path)
    assert loaded is not built
    assert [h.doc_id for h in loaded.search("capital of Kazakhstan", 3)] == \
        [h.doc_id for h in built.search("capital of Kazakhstan", 3)]
    clear_retriever_cache()
