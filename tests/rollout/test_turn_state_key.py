"""Every turn records the env's anchor state (``state_key()`` before the action), whatever the policy and sampler:
GiGPO groups a task's turns by it, so it must be right, shared across a group's rollouts, and survive storage."""

from __future__ import annotations

import json
import threading

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers the env ids
from agentgym.rollout.branching import BranchingConfig, BranchingSampler
from agentgym.policies import ScriptedPolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, read_state_key
from agentgym.suite import Task
from agentgym.registration.suites import load_suite
from agentgym.trajectory import Trajectory
from tests.helpers.envs import EchoEnv

MOVES = ['<tool_call>{"name": "move", "arguments": {"direction": "%s"}}</tool_call>' % d
         for d in ("east", "south", "west", "north", "east", "south")]
ECHO_THEN_STOP = ['<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>',
                  '<tool_call>{"name": "stop", "arguments": {}}</tool_call>']


class ThreadProbeEnv(EchoEnv):
    """Echo env (not ``cheap_steps``: its calls run on the engine's env workers) that notes which thread read
    its key and which stepped it."""

    threads: list[tuple[str, str]] = []

    def state_key(self) -> str:
        self._key_thread = threading.current_thread().name
        return super().state_key()

    def step(self, action):  # type: ignore[no-untyped-def]
        ThreadProbeEnv.threads.append((self._key_thread, threading.current_thread().name))
        return super().step(action)


class BrokenKeyEnv(EchoEnv):
    """Echo env whose ``state_key`` always raises."""

    def state_key(self) -> str:
        raise RuntimeError("no key today")


for _name, _cls in (("ThreadProbe-v0", ThreadProbeEnv), ("BrokenKey-v0", BrokenKeyEnv)):
    if f"agentgym-test/{_name}" not in gym.registry:
        gym.register(id=f"agentgym-test/{_name}", entry_point=_cls)


def _maze_specs(group_size: int, group_id: str = "g") -> list[EpisodeSpec]:
    suite = load_suite("games-maze")
    task = suite.split("train")[0]
    return [EpisodeSpec(suite.env_id, task=task, seed=g, group_id=group_id, env_kwargs=dict(suite.env_kwargs))
            for g in range(group_size)]


def _episodes(group_size: int = 2) -> list[Trajectory]:
    policy = ScriptedPolicy(MOVES)  # text only: no tokenizer, like OpenAIPolicy in chat mode
    return RolloutEngine(policy, RolloutConfig(max_in_flight=4)).run(_maze_specs(group_size))


def _replayed_keys(trajectory: Trajectory, task: Task) -> list[str]:
    """The keys a manual replay of the trajectory's actions sees: ``state_key()`` after k steps, for every k."""
    env = gym.make("agentgym/Maze-v0", **dict(load_suite("games-maze").env_kwargs))
    keys = []
    try:
        env.reset(seed=trajectory.seed, options={"task": task})
        for turn in trajectory.turns:
            keys.append(env.unwrapped.state_key())
            env.step(turn.action)
    finally:
        env.close()
    return keys


def test_each_turn_records_the_state_the_action_was_chosen_in() -> None:
    trajectories = _episodes()
    first = trajectories[0]
    # a text-only trajectory (no token ids, as from OpenAIPolicy in chat mode) still has keys: they come from the env
    assert len(first.turns) > 1 and not first.has_tokens
    assert all(t.state_key is not None for t in first.turns)
    assert [t.state_key for t in first.turns] == _replayed_keys(first, load_suite("games-maze").split("train")[0])
    assert len({t.state_key for t in first.turns}) > 1  # the moves changed the state, and the keys with it
    # the group's rollouts start in the same cell: the anchor GiGPO compares them at
    assert trajectories[0].turns[0].state_key == trajectories[1].turns[0].state_key


def test_state_keys_survive_a_json_round_trip_and_old_files_read_as_none() -> None:
    traj = _episodes(1)[0]
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert [t.state_key for t in again.turns] == [t.state_key for t in traj.turns]
    old = traj.to_dict()
    for turn in old["turns"]:
        turn.pop("state_key")
    assert all(t.state_key is None for t in Trajectory.from_dict(old).turns)


@pytest.mark.parametrize("fork", ["auto", "replay"])
def test_branching_trajectories_carry_keys_on_shared_and_own_turns(fork: str) -> None:
    task = load_suite("games-maze").split("train")[0]
    sampler = BranchingSampler(ScriptedPolicy(MOVES), RolloutConfig(),
                               BranchingConfig(budget=4, initial_rollouts=2, branch_probability=1.0,
                                               entropy_weight=0.0, fork=fork))
    trajectories = sampler.run(_maze_specs(4))
    branches = [t for t in trajectories if t.metadata["tree"]["origin"] == "branch"]
    assert branches, "the test needs at least one branch (copied or replayed env)"
    assert sampler.stats["fork_copies" if fork == "auto" else "fork_replays"] == len(branches)
    for traj in trajectories:
        assert traj.error is None and traj.turns
        assert [t.state_key for t in traj.turns] == _replayed_keys(traj, task)


def test_the_key_is_read_on_the_worker_that_steps_the_env() -> None:
    ThreadProbeEnv.threads.clear()
    specs = [EpisodeSpec("agentgym-test/ThreadProbe-v0", seed=s) for s in range(3)]
    trajectories = RolloutEngine(ScriptedPolicy(ECHO_THEN_STOP), RolloutConfig(env_workers=2)).run(specs)
    assert all(t.success and all(turn.state_key for turn in t.turns) for t in trajectories)
    assert ThreadProbeEnv.threads and all(key == step for key, step in ThreadProbeEnv.threads)
    assert all(step.startswith("agentgym-env") for _, step in ThreadProbeEnv.threads)  # not the event loop's


def test_a_failing_state_key_is_a_missing_anchor_not_a_failed_episode() -> None:
    specs = [EpisodeSpec("agentgym-test/BrokenKey-v0", seed=0)]
    [traj] = RolloutEngine(ScriptedPolicy(ECHO_THEN_STOP)).run(specs)
    assert traj.success and traj.error is None and len(traj.turns) == 2
    assert all(turn.state_key is None for turn in traj.turns)
    assert read_state_key(object()) is None  # an env without state_key() has no anchor
