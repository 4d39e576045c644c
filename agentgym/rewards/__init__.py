"""Rewards beyond a hand-written checker: rubrics of weighted criteria, scored by code or by a judge.

A :class:`~agentgym.rewards.rubric.Rubric` is a weighted set of criteria; each criterion is a programmatic
:class:`~agentgym.rewards.criteria.Check`, a :class:`~agentgym.rewards.criteria.JudgeCriterion` (a question put to a
judge, a scale and a verdict parser) or a nested rubric. It scores a :class:`~agentgym.rewards.sample.RubricSample`
(the task, the final answer and, when a criterion asks for it, the transcript) in [0, 1] with a per-criterion
breakdown. This package is part of the contract: envs import it to take ``reward=rubric``; what calls a judge
policy (batching, caching, retries) lives in :mod:`agentgym.rollout.judging`.
"""

from agentgym.rewards.criteria import Check, JudgeCriterion
from agentgym.rewards.judge import Judge, JudgePrompt, JudgeReply
from agentgym.rewards.quoting import fence_for, quote
from agentgym.rewards.rubric import Rubric, RubricScore, load_rubric
from agentgym.rewards.sample import RubricSample, sample_from_trajectory

__all__ = ["Check", "Judge", "JudgeCriterion", "JudgePrompt", "JudgeReply", "Rubric", "RubricSample", "RubricScore",
           "fence_for", "load_rubric", "quote", "sample_from_trajectory"]
