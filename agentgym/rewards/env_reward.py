"""``gym.make(id, reward=rubric)``: any AgentEnv scored by a rubric instead of (or on top of) its checker.

The env still runs its own checker; at the episode's end the rubric scores the episode (its checks may read the
checker's outcome, e.g. to keep correctness as one weighted criterion) and its score becomes the outcome score.
The env's last step pays the remainder as usual, so the step rewards still sum to the outcome score. A judge that
gives no usable verdict ends the episode with ``end_reason="error"`` and ``judge_error`` in the outcome: it is
dropped from training like an episode whose env failed, never scored 0 or 1 in silence.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from agentgym.rewards.rubric import Rubric, load_rubric
from agentgym.rewards.sample import RubricSample, answer_of

__all__ = ["score_episode", "with_reward_kwarg"]


def with_reward_kwarg(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` taking one more keyword, ``reward`` (a :class:`Rubric` or ``"module:name"``), set after it ran.

    A family whose own ``__init__`` already has a ``reward`` argument (the Search env's answer metric) keeps it:
    only a Rubric, or a string naming one (it has a ``:``), is taken as the rubric there.
    """
    takes_own = "reward" in inspect.signature(init).parameters

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        reward = kwargs.get("reward")
        rubric = None
        if reward is not None and (not takes_own or isinstance(reward, Rubric)
                                   or (isinstance(reward, str) and ":" in reward)):
            rubric = kwargs.pop("reward")
        init(self, *args, **kwargs)
        if rubric is not None:
            self.reward_rubric = load_rubric(rubric)

    __init__._takes_reward = True  # type: ignore[attr-defined]
    return __init__


def score_episode(env: Any, action: str, observation: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Score the episode ``env`` is ending with its ``reward_rubric``; set its outcome score (or mark a judge
    error) and return what the outcome gains: ``checker_score``, ``rubric`` and, on failure, ``judge_error``."""
    rubric: Rubric = env.reward_rubric
    transcript = [*env._transcript, ("action", action), ("observation", observation)]
    actions = [text for who, text in transcript if who == "action"]
    observations = [text for who, text in transcript if who == "observation"]
    pairs = tuple(zip(actions, observations[1:]))
    task = env.task
    sample = RubricSample(
        task_id=task.id if task is not None else "", task=str(observations[0]) if observations else "",
        answer=answer_of(actions[-1], calls) if actions else "", transcript=pairs,
        reference=None if task is None else task.answer,
        outcome={"success": env._success, "score": env._score, "end_reason": env._end_reason})
    result = rubric.evaluate(sample)
    extra: dict[str, Any] = {"checker_score": env._score, "rubric": result.to_dict()}
    if result.score is None:
        extra["judge_error"] = result.error
        env._end_reason = "error"
    else:
        env._score = float(result.score)
    return extra
