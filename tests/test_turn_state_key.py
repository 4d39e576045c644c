"""Every turn records the env's anchor state (``state_key()`` before the action), whatever the policy: GiGPO
groups a task's turns by it, so it must be right, shared across a group's rollouts, and survive storage."""

from __future__ import annotations

import json

import gymnasium as gym

import agentgym  # noqa: F401 - registers the env ids
from agentgym.policies import ScriptedPolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, read_state_key
from agentgym.suite import load_suite
from agentgym.trajectory import Trajectory

MOVES = ['<tool_call>{"name": "move", "arguments": {"direction": "%s"}}</tool_call>' % d
         for d in ("east", "south", "west", "north", "east", "south")]


def _episodes(group_size: int = 2) -> list[Trajectory]:
    suite = load_suite("games-maze")
    task = suite.split("train")[0]
    specs = [EpisodeSpec(suite.env_id, task=task, seed=g, group_id="g", env_kwargs=dict(suite.env_kwargs))
             for g in range(group_size)]
    policy = ScriptedPolicy(MOVES)  # text only: no tokenizer, like OpenAIPolicy in chat mode
    return RolloutEngine(policy, RolloutConfig(max_in_flight=4)).run(specs)


def test_each_turn_records_the_state_the_action_was_chosen_in() -> None:
    trajectories = _episodes()
    first = trajectories[0]
    assert first.turns and not first.has_tokens
    env = gym.make("agentgym/Maze-v0")
    try:
        env.reset(seed=first.seed, options={"task": load_suite("games-maze").split("train")[0]})
        for turn in first.turns:
            assert turn.state_key == read_state_key(env) and turn.state_key is not None
            env.step(turn.action)
    finally:
        env.close()
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


def test_a_failing_state_key_is_a_missing_anchor_not_a_failed_episode() -> None:
    class Broken:
        def state_key(self) -> str:
            raise RuntimeError("no key today")

    assert read_state_key(Broken()) is None
    assert read_state_key(object()) is None
