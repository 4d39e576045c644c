"""``reward: rubric``: a trainer's episodes scored by a rubric and its judge before the update learns from them.

The rollout gives each episode the env checker's score; with ``reward: rubric`` the step's episodes are then
scored by the rubric the config names (``judge_mode: independent`` asks one judge call per episode and criterion,
``group`` one per task group, scoring the group's episodes relative to each other, the comparison a group-relative
advantage makes anyway). Judge replies are cached under the run's output directory; an episode the judge could not
score carries ``error`` and is dropped from the update like an episode whose env failed, and each step logs how
many there were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.rewards.rubric import Rubric, load_rubric
from agentgym.rollout.judging import NAIVE_JUDGE, PolicyJudge, judge_policy, judge_trajectories
from agentgym.trajectory import Trajectory

__all__ = ["RubricReward"]

class RubricReward:
    """Scores a step's trajectories with the configured rubric and judge.

    Args:
        rubric: The rubric (or ``"module:name"``).
        judge: A judge policy spec; ``None`` uses the rubric's own judge.
        mode: ``independent`` or ``group``.
        cache_dir: Where the judge cache lives (the run's output directory).
        verdict_format: How ``judge`` answers (:class:`~agentgym.rollout.judging.PolicyJudge`'s ``verdict_format``).
    """

    def __init__(self, rubric: Rubric | str, judge: str | None, mode: str, cache_dir: str | Path,
                 verdict_format: str = "line") -> None:
        self.rubric = load_rubric(rubric)
        self.mode = mode
        self.judge: Any = self.rubric.judge
        if judge is not None:
            self.judge = PolicyJudge(judge_policy(judge), cache_dir=cache_dir, verdict_format=verdict_format)
        if self.rubric.needs_judge and self.judge is None:
            raise ConfigError(f"judge: rubric {self.rubric.name!r} has judge criteria; set judge: to a policy spec "
                              f"(openai:BASE_URL#MODEL, hf:MODEL) or {NAIVE_JUDGE}.")

    def score(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """The rescored trajectories and the step's judge metrics (``judge/...``)."""
        out, stats = judge_trajectories(trajectories, self.rubric, self.judge, mode=self.mode)
        return out, {f"judge/{k}": float(v) for k, v in stats.items()}
