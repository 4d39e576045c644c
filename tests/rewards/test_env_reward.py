"""``gym.make(id, reward=rubric)``: the rubric scores any env's episodes and the reward rule still holds."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the ids
from agentgym.errors import ConfigError
from agentgym.policies.scripted import ReferencePolicy, ScriptedPolicy
from agentgym.rewards import Check, JudgeCriterion, Rubric
from agentgym.rewards.scripted_judge import naive_judge_reply
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.rollout.judging import PolicyJudge

CORRECT = Check("correct", lambda s: float(s.outcome["score"]), weight=3.0)
SHOWS_WORK = JudgeCriterion("shows_work", "Did the agent use the [calc] tool before answering?",
                            fields=("task", "answer", "transcript"))
#: Named by a suite YAML as ``env_kwargs: {reward: "tests.rewards.test_env_reward:NAMED"}``.
NAMED = Rubric("named", (Check("half", lambda s: 0.5),))


def _play(env: gym.Env, actions: list[str]) -> tuple[float, dict]:
    env.reset(seed=3)
    total, info = 0.0, {}
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        total += reward
        if terminated or truncated:
            break
    return total, info


def _reference_actions(seed: int = 3) -> list[str]:
    env = gym.make("agentgym/Calculator-v0")
    observation, _ = env.reset(seed=seed)
    solve = env.unwrapped.reference_solver()
    actions = []
    for _ in range(5):
        action = solve(observation)
        actions.append(action)
        observation, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return actions
    raise AssertionError("the reference solver did not finish")


def test_rubric_reward_keeps_the_reward_rule() -> None:
    judge = PolicyJudge(ScriptedPolicy(naive_judge_reply))
    env = gym.make("agentgym/Calculator-v0", reward=Rubric("calc", (CORRECT, SHOWS_WORK), judge=judge))
    total, info = _play(env, _reference_actions())
    outcome = info["outcome"]
    assert outcome["checker_score"] == 1.0 and outcome["rubric"]["breakdown"]["calc/shows_work"] == 1.0
    assert outcome["score"] == pytest.approx(1.0) and total == pytest.approx(outcome["score"])
    total, info = _play(env, ["answer(0)"])  # no calc call, wrong: the judge says no work shown
    assert info["outcome"]["rubric"]["breakdown"]["calc/shows_work"] == 0.0
    assert total == pytest.approx(info["outcome"]["score"])


def test_judge_error_in_env_ends_the_episode_as_an_error() -> None:
    judge = PolicyJudge(ScriptedPolicy(["no idea"]), retries=0)
    env = gym.make("agentgym/Calculator-v0", reward=Rubric("calc", (SHOWS_WORK,), judge=judge))
    total, info = _play(env, ["answer(0)"])
    assert info["outcome"]["end_reason"] == "error" and info["outcome"]["judge_error"].startswith("judge_error")
    assert total == pytest.approx(info["outcome"]["score"])


def test_a_rubric_named_by_string_and_bad_names() -> None:
    env = gym.make("agentgym/Calculator-v0", reward="tests.rewards.test_env_reward:NAMED")
    total, info = _play(env, ["answer(0)"])
    assert total == pytest.approx(0.5) and info["outcome"]["score"] == 0.5
    with pytest.raises(ConfigError, match="module:name"):
        gym.make("agentgym/Calculator-v0", reward="no colon")
    with pytest.raises(ConfigError, match="not a Rubric"):
        gym.make("agentgym/Calculator-v0", reward="tests.rewards.test_env_reward:CORRECT")


def test_engine_episodes_with_an_in_env_judge() -> None:
    """The engine steps Calculator inline on its event loop; the in-env judge must still run."""
    judge = PolicyJudge(ScriptedPolicy(naive_judge_reply))
    rubric = Rubric("calc", (CORRECT, SHOWS_WORK), judge=judge)
    specs = [EpisodeSpec(env_id="agentgym/Calculator-v0", seed=s, env_kwargs={"reward": rubric}) for s in range(3)]
    out = RolloutEngine(ReferencePolicy(), RolloutConfig(progress=False)).run(specs)
    for t in out:
        assert t.error is None and t.score == pytest.approx(1.0), t.outcome
        assert sum(turn.reward for turn in t.turns) == pytest.approx(t.score)
    assert judge.calls == 3


def test_a_suite_yaml_names_the_rubric(tmp_path) -> None:
    from agentgym.registration.suites import load_suite
    from agentgym.rollout import episodes_for_suite

    path = tmp_path / "calc-rubric.yaml"
    path.write_text("name: calc-rubric\nversion: 1\nenv: agentgym/Calculator-v0\nseed: 0\n"
                    "generator: agentgym.envs.games.calculator:generate_tasks\n"
                    "env_kwargs: {reward: 'tests.rewards.test_env_reward:NAMED'}\n"
                    "splits:\n  test:\n    count: 3\n")
    suite = load_suite(str(path))
    out = RolloutEngine(ReferencePolicy(), RolloutConfig(progress=False)).run(episodes_for_suite(suite, "test"))
    assert [t.score for t in out] == [0.5, 0.5, 0.5]
    assert all(t.outcome["checker_score"] == 1.0 and sum(turn.reward for turn in t.turns) == 0.5 for t in out)
