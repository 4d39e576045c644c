"""The support env: the simulated customer answers only what is asked, the suite validates, and the rubric scores
how the conversation went."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.envs.dialogue.rubric import support_rubric
from agentgym.errors import TaskError
from agentgym.policies.scripted import ReferencePolicy, ScriptedPolicy
from agentgym.registration.suites import load_suite
from agentgym.rewards.scripted_judge import naive_judge_reply
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.rollout.judging import PolicyJudge, judge_trajectories
from agentgym.testing import check_agent_env


def say(message: str) -> str:
    return "<tool_call>" + json.dumps({"name": "say", "arguments": {"message": message}}) + "</tool_call>"


def test_conformance_and_suite_validates() -> None:
    check_agent_env("agentgym/Support-v0", fuzz_examples=10)
    suite = load_suite("support-smoke")
    assert suite.validate().ok
    assert not {t.answer["order_id"] for t in suite.train} & {t.answer["order_id"] for t in suite.test}


def test_customer_reveals_only_what_is_asked_and_minds_repeats() -> None:
    env = gym.make("agentgym/Support-v0")
    env.reset(seed=1)
    observation, *_ = env.step(say("Hello there!"))
    assert "don't follow" in observation
    observation, *_ = env.step(say("What is your order number?"))
    assert "order number is" in observation and "refund" not in observation
    observation, *_ = env.step(say("And your order number again?"))
    assert "already told you" in observation
    observation, _, terminated, _, _ = env.step('resolve("A-1", "cash back")')
    assert not terminated and "must be one of" in observation


def test_bad_split_is_a_clear_error() -> None:
    with pytest.raises(TaskError, match="train or test"):
        gym.make("agentgym/Support-v0", split="dev")


def test_rubric_scores_the_conversation() -> None:
    specs = [EpisodeSpec("agentgym/Support-v0", seed=s, group_id="g") for s in range(3)]
    reference = RolloutEngine(ReferencePolicy(), RolloutConfig(progress=False)).run(specs)
    nagging = [say("What is your order number?")] * 3 + ['resolve("A-0000", "refund")']
    rude = RolloutEngine(ScriptedPolicy(nagging), RolloutConfig(progress=False)).run(specs)
    judge = PolicyJudge(ScriptedPolicy(naive_judge_reply))
    scored, stats = judge_trajectories(reference + rude, support_rubric(judge), judge)
    assert stats["judge_errors"] == 0
    good, bad = scored[:3], scored[3:]
    assert all(t.score == pytest.approx(1.0) for t in good)
    for t in bad:
        breakdown = t.outcome["rubric"]["breakdown"]
        assert breakdown["support/resolved"] == 0.0 and breakdown["support/asked_once"] == pytest.approx(1 / 3)
        assert breakdown["support/courteous"] == 0.0 and t.score < 0.3
