"""Ray env workers with their defaults on a small node: a local Ray with 2 CPUs, 32 episodes, nothing configured.

Building an env on Ray starts a worker process and imports agentgym in it; on a small node those starts queue.
With the defaults every episode must finish, and no actor may outlive the run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from agentgym.policies import ScriptedPolicy  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.rollout import DISCARD_THREAD_NAME, EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.rollout.ray_envs import DEFAULT_ACTOR_OPTIONS, RayEnv, ray_env_capacity  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def small_node() -> Iterator[None]:
    if ray.is_initialized():
        ray.shutdown()
    # address="local": a new 2-CPU instance even while another test's cluster is up on this machine (without it,
    # ray.init() joins the newest cluster recorded in Ray's temp dir and refuses num_cpus).
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _binary_search(messages: list[dict[str, str]]) -> str:
    lo, hi = 1, 100
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and i + 1 < len(messages):
            guessed = int(m["content"][6:-1])
            feedback = messages[i + 1]["content"].lower()
            lo, hi = (guessed + 1, hi) if "higher" in feedback else (lo, guessed - 1) if "lower" in feedback else (lo, hi)
    return f"guess({(lo + hi) // 2})"


def _wait_for_all_cpus_free(timeout_s: float = 60.0) -> float:
    """Free CPUs once every actor is gone (each reserves some: a live one keeps its share)."""
    for thread in threading.enumerate():
        if thread.name == DISCARD_THREAD_NAME:
            thread.join(timeout_s)
    deadline = time.monotonic() + timeout_s
    free = 0.0
    while time.monotonic() < deadline:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= ray.cluster_resources()["CPU"]:
            break
        time.sleep(0.5)
    return free


def test_defaults_reserve_cpu_so_capacity_follows_the_node(small_node: None) -> None:
    assert DEFAULT_ACTOR_OPTIONS["num_cpus"] > 0
    assert ray_env_capacity() == int(2 // DEFAULT_ACTOR_OPTIONS["num_cpus"])
    assert ray_env_capacity({"num_cpus": 1}) == 2
    assert ray_env_capacity({"num_cpus": 0}) is None


def test_32_episodes_with_defaults_on_a_2_cpu_node_and_no_actor_left(small_node: None) -> None:
    suite = load_suite("games-guess")
    tasks = suite.split("train")
    specs = [EpisodeSpec(suite.env_id, task=tasks[i % len(tasks)], seed=i, env_kwargs=dict(suite.env_kwargs))
             for i in range(32)]
    engine = RolloutEngine(ScriptedPolicy(_binary_search), RolloutConfig(env_backend="ray"))
    trajectories = engine.run(specs)
    assert [t.error for t in trajectories] == [None] * 32
    assert all(t.success for t in trajectories)
    assert _wait_for_all_cpus_free() == ray.cluster_resources()["CPU"], "an env actor outlived the run"


def test_an_actor_that_cannot_start_is_killed_with_a_clear_error(small_node: None) -> None:
    with pytest.raises(TimeoutError, match="did not start within"):
        RayEnv("agentgym/GuessNumber-v0", actor_options={"num_cpus": 3}, start_timeout_s=3)
    assert _wait_for_all_cpus_free() == 2.0
    # a pending actor that had been killed never starts later: 2 CPUs stay free
    time.sleep(2)
    assert ray.available_resources().get("CPU", 0.0) == 2.0
