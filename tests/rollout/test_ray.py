"""Env workers on Ray: the engine runs envs as Ray actors on a two-node local cluster (started and stopped by the
test), gets the same trajectories as in-process envs, and a node killed mid-episode ends only its episodes."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from agentgym.policies import ScriptedPolicy  # noqa: E402
from agentgym.rollout.ray_envs import RayEnv  # noqa: E402
from agentgym.rollout import DISCARD_THREAD_NAME, EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head node and a second node process joining it, on this machine (what `ray start` does on two)."""
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = c.add_node(num_cpus=2)
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    c.worker = worker
    try:
        yield c
    finally:
        _wait_for_discarded_envs()
        ray.shutdown()
        c.shutdown()


def _wait_for_discarded_envs(timeout_s: float = 30.0) -> None:
    """Envs the engine discarded close on daemon threads after the run returns; let them finish before the
    cluster goes (they end on their own within RayEnv's 10 s close wait)."""
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name == DISCARD_THREAD_NAME:
            thread.join(max(deadline - time.monotonic(), 0.0))


class PlacementRecorder(ScriptedPolicy):
    """Binary search on GuessNumber, recording which node holds each episode's env."""

    def __init__(self) -> None:
        super().__init__(self.reply)
        self.nodes: dict[str, str] = {}
        self.pids: dict[str, int] = {}
        self.on_call: Any = None
        self.calls = 0

    def begin_episode(self, episode_id: str, env: Any) -> None:
        if hasattr(env, "where"):
            where = env.where()
            self.nodes[episode_id], self.pids[episode_id] = where["node_id"], where["pid"]

    def reply(self, messages: Any) -> str:
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        lo, hi = 1, 100
        for i, m in enumerate(messages):
            if m["role"] == "assistant" and i + 1 < len(messages):
                guessed = int(m["content"][6:-1])
                feedback = messages[i + 1]["content"].lower()
                lo, hi = (guessed + 1, hi) if "higher" in feedback else (lo, guessed - 1) if "lower" in feedback else (lo, hi)
        return f"guess({(lo + hi) // 2})"


def _specs(n: int) -> list[EpisodeSpec]:
    suite = load_suite("games-guess")
    return [EpisodeSpec(suite.env_id, task=t, seed=i, group_id=t.id, env_kwargs=dict(suite.env_kwargs))
            for i, t in enumerate(suite.split("train")[:n])]


def test_ray_env_workers_match_in_process_envs_and_spread_over_nodes(cluster: Any) -> None:
    specs = _specs(12)
    local = RolloutEngine(PlacementRecorder(), RolloutConfig(max_in_flight=12)).run(specs)
    policy = PlacementRecorder()
    remote = RolloutEngine(policy, RolloutConfig(max_in_flight=12, env_backend="ray")).run(specs)
    assert [t.error for t in remote] == [None] * 12
    assert [(t.success, [turn.action for turn in t.turns], [turn.observation for turn in t.turns])
            for t in remote] == [(t.success, [turn.action for turn in t.turns], [turn.observation for turn in t.turns])
                                 for t in local]
    assert [[turn.state_key for turn in t.turns] for t in remote] == [[turn.state_key for turn in t.turns] for t in local]
    assert len(set(policy.nodes.values())) == 2, "SPREAD puts env workers on both nodes"
    for env_id in ("agentgym/GuessNumber-v0", "agentgym/Maze-v0"):  # constrain_actions asks the remote env
        env = RayEnv(env_id)
        try:
            here = gym.make(env_id).unwrapped
            env.reset(seed=0)
            here.reset(seed=0)
            choices = here.action_choices()  # guessing is free text: no choices
            assert env.action_choices() == choices
            # an engine truncation (the context limit) is scored by the env in its actor, as here
            action = choices[0] if choices else "guess(50)"
            env.step(action)
            here.step(action)
            assert env.truncate_episode("context_limit") == here.truncate_episode("context_limit")
        finally:
            env.close()


def test_a_node_killed_mid_episode_ends_only_its_episodes(cluster: Any) -> None:
    specs = _specs(10)
    policy = PlacementRecorder()
    worker_node = cluster.worker.node_id

    killed = []

    def kill_worker_node(calls: int) -> None:
        # The first reply after an episode on the worker node has begun: that episode has not stepped yet.
        if not killed and worker_node in policy.nodes.values():
            killed.append(set(finished))
            cluster.remove_node(cluster.worker, allow_graceful=False)
            # A machine that dies takes its worker processes with it; on one machine they must be killed too.
            for tid, pid in policy.pids.items():
                if policy.nodes[tid] == worker_node:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    finished: list[str] = []
    policy.on_call = kill_worker_node
    started = time.monotonic()
    engine = RolloutEngine(policy, RolloutConfig(max_in_flight=10, env_backend="ray", step_timeout_s=60))
    trajectories = engine.run(specs, on_trajectory=lambda t: finished.append(t.traj_id))
    assert time.monotonic() - started < 180, "no hang"
    assert killed, "the node was killed while episodes ran"
    on_worker = {tid for tid, node in policy.nodes.items() if node == worker_node}
    errored = {t.traj_id for t in trajectories if t.end_reason == "error"}
    assert errored & on_worker, "an episode under way on the killed node ended with an error"
    for t in trajectories:
        if t.traj_id in on_worker:
            continue  # under way on the killed node (ended in error) or already finished before it died
        if t.turns:  # it ran on the surviving head node: untouched
            assert t.error is None and t.success, t
        else:  # its env was being created on the node when it died: it never started
            assert t.end_reason == "error" and t.traj_id not in policy.nodes, t


def test_an_env_left_open_after_ray_shutdown_never_reconnects_ray(cluster: Any) -> None:
    """Ray's ``.remote()`` re-runs ``ray.init()`` when Ray is down; from a thread still closing an env while the
    cluster went down, that re-joined a dying cluster and Ray ended the whole process (a CI run lost its test
    worker this way). A RayEnv used after ``ray.shutdown()`` raises a clear error and its close is a no-op."""
    env = RayEnv("agentgym/GuessNumber-v0")
    env.reset(seed=0)
    ray.shutdown()
    try:
        with pytest.raises(RuntimeError, match="Ray was shut down"):
            env.step("guess(50)")
        env.close()
        assert not ray.is_initialized(), "a call on the env connected Ray again"
    finally:
        if not ray.is_initialized():
            ray.init(address=cluster.address, log_to_driver=False)
