"""The report env: its suite validates, its checker counts facts, and its rubric rewards grounded, complete reports."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.envs.report.rubric import report_rubric
from agentgym.policies.scripted import ReferencePolicy, ScriptedPolicy
from agentgym.registration.suites import load_suite
from agentgym.rewards.scripted_judge import naive_judge_reply
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.rollout.judging import PolicyJudge
from agentgym.testing import check_agent_env


def test_conformance_and_suite_validates() -> None:
    check_agent_env("agentgym/Report-v0", fuzz_examples=10)
    report = load_suite("report-smoke").validate()
    assert report.ok, str(report)
    suite = load_suite("report-smoke")
    assert not {t.metadata["country"] for t in suite.train} & {t.metadata["country"] for t in suite.test}


def _play(env: gym.Env, report: str | None) -> dict:
    observation, _ = env.reset(seed=4)
    solve = env.unwrapped.reference_solver()
    observation, *_ = env.step(solve(observation))  # open the country's profile
    action = solve(observation) if report is None else f'submit({report!r})'
    _, _, terminated, _, info = env.step(action)
    assert terminated
    return info


def test_checker_counts_the_facts() -> None:
    env = gym.make("agentgym/Report-v0")
    assert _play(env, None)["outcome"]["score"] == 1.0
    assert _play(env, "A fine country with friendly people.")["outcome"]["score"] == 0.0


def test_rubric_rewards_grounded_complete_reports() -> None:
    judge = PolicyJudge(ScriptedPolicy(naive_judge_reply))
    env = gym.make("agentgym/Report-v0", reward=report_rubric(judge))
    good = _play(env, None)["outcome"]
    assert good["score"] == pytest.approx(1.0) and good["rubric"]["breakdown"]["report/complete"] == 1.0
    # the reference report plus an invented figure: the grounding check catches the number no document showed
    observation, _ = env.reset(seed=4)
    solve = env.unwrapped.reference_solver()
    observation, *_ = env.step(solve(observation))
    facts = observation.split("\n", 1)[1]
    invented = _play(env, facts + " Its population grew by 987,654 last year.")["outcome"]["rubric"]["breakdown"]
    assert invented["report/facts"] == 1.0 and 0.0 < invented["report/grounded"] < 1.0
    vague = _play(env, "A fine country with friendly people.")["outcome"]["rubric"]["breakdown"]
    assert vague["report/facts"] == 0.0 and vague["report/complete"] < 1.0


def test_bad_reports_get_errors_not_crashes() -> None:
    env = gym.make("agentgym/Report-v0", max_report_chars=100)
    env.reset(seed=0)
    observation, _, terminated, _, info = env.step('submit("' + "y" * 150 + '")')
    assert not terminated and "limit is 100" in observation
    observation, _, terminated, _, _ = env.step('submit("  ")')
    assert not terminated and "empty" in observation


def test_reference_policy_through_the_engine() -> None:
    specs = [EpisodeSpec("agentgym/Report-v0", seed=s, env_kwargs={"reward": report_rubric()}) for s in range(3)]
    out = RolloutEngine(ReferencePolicy(), RolloutConfig(progress=False)).run(specs)
    assert all(t.error is None and t.score == pytest.approx(1.0) for t in out)


def test_a_report_that_lists_the_world_states_nothing() -> None:
    """Naming every currency, language and country (it fits in the length cap) must not state a country's facts:
    each fact's share is scaled by the share of the report's names of that kind that are right."""
    import random
    from collections import Counter

    from agentgym.envs.report.tasks import fact_coverage, generate_report_tasks
    from agentgym.envs.search.sources import load_world

    world = load_world()
    currencies = Counter(c.currency for c in world.countries.values())
    languages = Counter(x for c in world.countries.values() for x in c.languages)
    stuffed = ("Currency: " + ", ".join(x for x, _ in currencies.most_common(12)) + ". Languages: "
               + ", ".join(x for x, _ in languages.most_common(12)) + ". Borders: ")
    for name in sorted({c.name for c in world.countries.values()}, key=len):
        if len(stuffed) + len(name) + 2 > 2000:
            break
        stuffed += name + ", "
    tasks = [t for t in generate_report_tasks(random.Random(0), 60, entities="test") if t.answer["neighbours"]]
    scores = [sum(fact_coverage(stuffed, t.answer).values()) / 4 for t in tasks]
    assert sum(scores) / len(scores) < 0.1, scores  # 0.64 when names were matched anywhere, right or wrong


def test_facts_are_whole_words() -> None:
    from agentgym.envs.report.tasks import fact_coverage

    facts = {"capital": [["Paris"]], "currency": [["Euro", "EUR"]], "languages": [["French"]],
             "neighbours": [["Spain"]]}
    assert fact_coverage("Europe, Parisian, Frenchness, Spaniards.", facts) == {
        "capital": 0.0, "currency": 0.0, "languages": 0.0, "neighbours": 0.0}
    assert fact_coverage("Paris; the euro (EUR); French; it borders Spain.", facts) == {
        "capital": 1.0, "currency": 1.0, "languages": 1.0, "neighbours": 1.0}
