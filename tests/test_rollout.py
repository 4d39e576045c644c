"""The rollout engine: batching across episodes, isolation of failing envs, groups, streaming."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from agentgym.errors import ConfigError
from agentgym.policies import Generation, GenerationRequest, Policy, ScriptedPolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.storage import TrajectoryWriter, read_trajectories

ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
STOP = '<tool_call>{"name": "stop", "arguments": {}}</tool_call>'


class CountingPolicy(ScriptedPolicy):
    """Scripted replies that also record batch sizes."""

    def __init__(self, replies: Sequence[str], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(replies, **kwargs)
        self.batch_sizes: list[int] = []

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.batch_sizes.append(len(requests))
        return await super().act(requests)


def test_engine_batches_policy_calls_across_episodes() -> None:
    policy = CountingPolicy([ECHO, STOP], delay_s=0.01)
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i) for i in range(40)]
    trajectories = RolloutEngine(policy, RolloutConfig(max_in_flight=40)).run(specs)
    assert len(trajectories) == 40 and all(t.success for t in trajectories)
    assert [t.seed for t in trajectories] == list(range(40)), "results keep the order of the specs"
    assert sum(policy.batch_sizes) == 80
    assert len(policy.batch_sizes) < 20, f"expected batched calls, got {policy.batch_sizes}"
    assert all(len(t.turns) == 2 and t.turns[0].info["kind"] == "tool_call" for t in trajectories)


def test_failing_or_hanging_env_ends_only_its_own_episode(tmp_path: Path) -> None:
    def reply(messages):  # type: ignore[no-untyped-def]
        task = messages[1]["content"]
        n = int(task.split()[1].rstrip("."))
        return {0: "crash", 1: "hang", 2: "die"}.get(n % 5, STOP)

    specs = [EpisodeSpec("agentgym-test/Flaky-v0", seed=i) for i in range(30)]
    config = RolloutConfig(max_in_flight=30, step_timeout_s=1.0)
    start = time.perf_counter()
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        trajectories = RolloutEngine(ScriptedPolicy(reply), config).run(specs, writer=writer)
    assert time.perf_counter() - start < 4.5, "a hanging env must not hold up the run beyond its timeout"
    assert len(trajectories) == 30
    by_kind: dict[str, list[str]] = {}
    for t in trajectories:
        by_kind.setdefault(t.end_reason, []).append(t.error or "")
        if t.end_reason == "error":
            assert t.error and ("simulated" in t.error or "step_timeout_s" in t.error)
    assert set(by_kind) <= {"error", "answered"}
    assert "answered" in by_kind and "error" in by_kind
    summary = summarize(trajectories)
    assert summary["errors"] == len(by_kind["error"])
    assert len(list(read_trajectories(tmp_path / "t.jsonl"))) == 30


def test_policy_failure_ends_episodes_with_error() -> None:
    class Broken(Policy):
        name = "broken"

        async def act(self, requests):  # type: ignore[no-untyped-def]
            raise ConnectionError("server down")

    trajectories = RolloutEngine(Broken()).run([EpisodeSpec("agentgym-test/Echo-v0", seed=0)])
    assert trajectories[0].end_reason == "error" and "server down" in (trajectories[0].error or "")


def test_groups_and_reference_policy_on_task_specs() -> None:
    from agentgym.policies import ReferencePolicy
    from agentgym.suite import Task

    task = Task(id="t0", prompt="Say 1.")
    specs = [EpisodeSpec("agentgym-test/Echo-v0", task=task, seed=s, group_id="g0") for s in range(4)]
    trajectories = RolloutEngine(ReferencePolicy()).run(specs)
    assert {t.group_id for t in trajectories} == {"g0"} and all(t.task_id == "t0" for t in trajectories)
    assert all(t.success for t in trajectories)


def test_rollout_config_validation() -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        RolloutConfig(max_in_flight=0)
    with pytest.raises(ConfigError, match="step_timeout_s"):
        RolloutConfig(step_timeout_s=0)
