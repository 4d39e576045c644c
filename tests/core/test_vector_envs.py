"""Gymnasium's own vector envs and step loop over agentgym envs, with Gymnasium's defaults."""

from __future__ import annotations

import copy
import multiprocessing as mp

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

import agentgym  # noqa: F401 - registers the ids
from agentgym.spaces import UnicodeText

ENV_ID = "agentgym/Calculator-v0"


def test_async_vector_env_with_default_shared_memory_matches_sync() -> None:
    """make_vec(..., "async") uses shared_memory=True by default; every step's batch must be the fresh text."""
    asynchronous = gym.make_vec(ENV_ID, 2, vectorization_mode="async")
    synchronous = gym.make_vec(ENV_ID, 2, vectorization_mode="sync")
    try:
        assert asynchronous.shared_memory
        got, _ = asynchronous.reset(seed=3)
        want, _ = synchronous.reset(seed=3)
        assert tuple(got) == tuple(want)
        for action in ("hello", '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}</tool_call>'):
            got = asynchronous.step((action, action))[0]
            want = synchronous.step((action, action))[0]
            assert tuple(got) == tuple(want)
            assert isinstance(got[0], str) and got[0] != ""
    finally:
        asynchronous.close()
        synchronous.close()


def test_async_vector_env_without_copy_stays_live() -> None:
    """With copy=False Gymnasium returns the object it read from shared memory once; it must follow the workers."""
    env = gym.vector.AsyncVectorEnv([lambda: gym.make(ENV_ID)] * 2, copy=False)
    try:
        first, _ = env.reset(seed=0)
        before = tuple(first)
        env.step(("hello", "hello"))
        assert tuple(first) != before  # the same object now shows the step's observations
    finally:
        env.close()


def test_shared_memory_round_trips_any_unicode() -> None:
    space = UnicodeText(16)
    memory = create_shared_memory(space, n=3, ctx=mp)
    batch = read_from_shared_memory(space, memory, n=3)
    texts = ["héllo 🤖", "", "\x00nul\ud800"]  # NUL and a lone surrogate are valid str contents
    for index, text in enumerate(texts):
        write_to_shared_memory(space, index, text, memory)
    assert list(batch) == texts
    assert copy.deepcopy(batch) == tuple(texts)
    write_to_shared_memory(space, 1, "x" * 16, memory)
    assert batch[1] == "x" * 16 and batch[0] == texts[0]
    with pytest.raises(ValueError, match="max_length"):
        write_to_shared_memory(space, 0, "x" * 17, memory)


def test_time_limit_truncation_carries_outcome_and_pays_the_score() -> None:
    """A plain Gymnasium loop with gym.make(id, max_episode_steps=N): the last step says how it ended."""
    env = gym.make(ENV_ID, max_episode_steps=2)
    env.reset(seed=0)
    rewards = []
    for _ in range(2):
        _, reward, terminated, truncated, info = env.step("thinking, no tool call")
        rewards.append(reward)
    assert truncated and not terminated
    assert info["outcome"] == {"success": False, "score": 0.0, "end_reason": "max_turns"}
    assert np.isclose(sum(rewards), info["outcome"]["score"])
    # the next episode with the same env keeps the limit
    _, info = env.reset(seed=1)
    assert info["max_turns"] == 2


def test_vector_env_truncation_carries_outcome() -> None:
    env = gym.make_vec(ENV_ID, 2, vectorization_mode="sync", max_episode_steps=1)
    try:
        env.reset(seed=0)
        _, _, _, truncated, info = env.step(("x", "x"))
        assert truncated.all()
        # Gymnasium batches info dicts key by key (with an "_outcome" mask)
        assert list(info["outcome"]["end_reason"]) == ["max_turns", "max_turns"]
        assert info["_outcome"].all()
    finally:
        env.close()
