"""GuessNumber: guesses out of range, many guesses per reply and hunting the secret in ids, info or
observations never win, while an honest binary search does."""

from __future__ import annotations

import json

import gymnasium as gym

from agentgym.envs.games.guess_number import GuessNumberEnv
from agentgym.suite import Task


SECRET_TASK = Task("g", "I am thinking of an integer between 1 and 100 (inclusive). Find it.", 37,
                   {"low": 1, "high": 100, "secret": 37})


def test_guess_honest_binary_search_succeeds() -> None:
    env = gym.make("agentgym/GuessNumber-v0")
    obs, _ = env.reset(options={"task": SECRET_TASK})
    solver = env.unwrapped.reference_solver()
    for _ in range(10):
        obs, _, terminated, truncated, info = env.step(solver(obs))
        if terminated or truncated:
            break
    assert info["outcome"]["success"]


def test_guess_out_of_range_and_many_guesses_per_reply_never_win() -> None:
    env = gym.make("agentgym/GuessNumber-v0")
    env.reset(options={"task": SECRET_TASK})
    for guess in (0, 101, -37, 10**9, 37.5):
        _, reward, terminated, truncated, info = env.step(f"guess({guess})")
        assert reward == 0 and not terminated, guess
    env.reset(options={"task": SECRET_TASK})
    spray = " ".join(f"guess({n})" for n in range(1, 101))  # every number in one reply
    while True:
        obs, reward, terminated, truncated, info = env.step(spray)
        assert len(info["turn"]["calls"]) == 1 and "ignored" in obs
        if terminated or truncated:
            break
    assert truncated and info["outcome"] == {"success": False, "score": 0.0, "end_reason": "max_turns"}


def test_guess_secret_is_not_in_task_ids_info_or_observations() -> None:
    """What the policy sees at reset is the same for every secret, and sampled task ids do not name it (they used to
    be ``1-100-68``, printed by ``agentgym play``)."""
    env = gym.make("agentgym/GuessNumber-v0")
    seen: dict[str, tuple[str, str]] = {}
    for seed in range(200):
        obs, info = env.reset(seed=seed)
        secret = env.unwrapped.task.answer
        task_id = info.pop("task_id")
        assert task_id.startswith("guess-1-100-") and str(secret) not in task_id.split("-")[3:], task_id
        seen.setdefault(obs + json.dumps(info, default=str), (task_id, str(secret)))
    assert len(seen) == 1  # observation and info do not depend on the secret
    first, second = GuessNumberEnv(), GuessNumberEnv()
    for env_ in (first, second):
        env_.reset(seed=5)
    assert first.task.id == second.task.id and first.task.answer == second.task.answer  # still deterministic
