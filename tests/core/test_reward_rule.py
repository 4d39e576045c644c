"""The reward rule and the default parsing of AgentEnv.

One definition of return: an episode's step rewards sum to ``outcome["score"]``, the number the trainers use,
however an env mixes ``add_reward`` and ``finish(score=...)``. Checked on hand-built envs (each way of paying)
and on every registered id, driven by its reference solver and by garbage until the turn limit.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import agentgym
from agentgym.env import AgentEnv
from agentgym.suite import Task
from agentgym.testing import EnvCheckError, check_agent_env, garbage_actions
from agentgym.toolset import ToolSet, tool


class _PayEnv(AgentEnv):
    """``step(n)`` pays a shaping reward of n; ``done(ok, score)`` finishes. The default parser is not overridden."""

    description = "test env: rewards"

    @tool
    def step_reward(self, n: float) -> str:
        """Pay n now.

        Args:
            n: Reward for this step.
        """
        self.add_reward("shaping", n)
        return f"paid {n}"

    @tool
    def done(self, ok: bool, score: float | None = None) -> str:
        """End the episode.

        Args:
            ok: Success.
            score: The episode's worth (default: 1.0 if ok else 0.0).
        """
        self.mark_answer()
        self.finish(success=ok, score=score)
        return "over"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.step_reward, self.done])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return Task("t", "pay")

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Pay, then finish."

    def reference_solver(self) -> Any:
        return lambda observation: 'done(True, 1.0)'


def _episode(env: AgentEnv, actions: list[str]) -> tuple[list[float], dict[str, Any], list[dict[str, float]]]:
    env.reset(seed=0)
    rewards, components = [], []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        components.append(info["turn"]["rewards"])
        if terminated or truncated:
            return rewards, info["outcome"], components
    raise AssertionError("the episode did not end")


def test_finish_alone_pays_the_score() -> None:
    """The issue's case: finish(success=True, score=1.0) used to end the episode with reward 0.0."""
    rewards, outcome, components = _episode(_PayEnv(), ['done(True, 1.0)'])
    assert rewards == [1.0] and outcome["score"] == 1.0 and components == [{"outcome": 1.0}]
    rewards, outcome, _ = _episode(_PayEnv(), ['done(True)'])  # default score = float(success)
    assert rewards == [1.0] and outcome["score"] == 1.0


def test_add_reward_moves_credit_but_not_the_return() -> None:
    rewards, outcome, components = _episode(_PayEnv(), ["step_reward(0.25)", "step_reward(0.5)", "done(True, 0.6)"])
    assert rewards[:2] == [0.25, 0.5]
    assert math.isclose(sum(rewards), 0.6) and outcome["score"] == 0.6
    assert components[-1] == {"outcome": pytest.approx(-0.15)}


def test_env_that_pays_its_score_itself_gets_no_outcome_component() -> None:
    rewards, outcome, components = _episode(_PayEnv(), ["step_reward(0.5)", "step_reward(0.5)", "done(True)"])
    assert rewards == [0.5, 0.5, 0.0] and outcome["score"] == 1.0 and components[-1] == {}


def test_truncation_without_finish_returns_zero() -> None:
    env = _PayEnv(max_turns=2)
    rewards, outcome, components = _episode(env, ["step_reward(-0.5)", "step_reward(2)"])
    assert outcome == {"success": False, "score": 0.0, "end_reason": "max_turns"}
    assert rewards == [-0.5, 0.5] and components[-1] == {"shaping": 2.0, "outcome": -1.5}


def test_default_parser_reads_every_format_and_void_turns_list_them() -> None:
    env = _PayEnv()
    replies = [
        '<tool_call>{"name": "done", "arguments": {"ok": true}}</tool_call>',
        '{"name": "done", "parameters": {"ok": true}}',
        '[TOOL_CALLS][{"name": "done", "arguments": {"ok": true}}]',
        'done(True)',
    ]
    for reply in replies:
        rewards, outcome, _ = _episode(env, [reply])
        assert outcome["success"] and rewards == [1.0], reply
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("I think the answer is 3.")
    assert info["turn"]["kind"] == "void" and reward == 0.0 and not terminated and not truncated
    for fragment in ("<tool_call>", "Llama 3.1", "[TOOL_CALLS]", 'step_reward("...")'):
        assert fragment in observation, (fragment, observation)


def test_checker_catches_a_broken_reward_rule() -> None:
    class _Cheat(_PayEnv):
        def step(self, action: Any) -> Any:  # pays 1 per step whatever the score says
            obs, _, terminated, truncated, info = super().step(action)
            return obs, 1.0, terminated, truncated, info

    gym.register(id="agentgym-test/Cheat-v0", entry_point=_Cheat)
    try:
        with pytest.raises(EnvCheckError, match="sum to"):
            check_agent_env("agentgym-test/Cheat-v0", fuzz_examples=0)
    finally:
        gym.registry.pop("agentgym-test/Cheat-v0", None)


@pytest.mark.parametrize("env_id", agentgym.env_ids())
def test_every_registered_env_follows_the_rule(env_id: str) -> None:
    """The reference solver's episode and a garbage episode that runs into the turn limit."""
    env = gym.make(env_id)
    try:
        observation, _ = env.reset(seed=0)
        solver = env.unwrapped.reference_solver()
        total, done = 0.0, False
        for _ in range(300):
            observation, reward, terminated, truncated, info = env.step(solver(observation))
            total += reward
            if terminated or truncated:
                done = True
                break
        assert done
        assert math.isclose(total, info["outcome"]["score"], abs_tol=1e-6), (total, info["outcome"])
        env.reset(seed=1)
        total = 0.0
        for action in garbage_actions([t.name for t in env.unwrapped.toolset]) * 5:
            _, reward, terminated, truncated, info = env.step(action)
            total += reward
            if terminated or truncated:
                break
        assert terminated or truncated
        assert math.isclose(total, info["outcome"]["score"], abs_tol=1e-6), (total, info["outcome"])
    finally:
        env.close()
