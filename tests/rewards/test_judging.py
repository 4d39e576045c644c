"""Judging stored episodes through a policy: batching, the disk cache, failures, group-relative scores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rewards import Check, JudgeCriterion, Rubric
from agentgym.rewards.scripted_judge import naive_judge_reply
from agentgym.rollout.judging import PolicyJudge, judge_trajectories
from tests.rewards.helpers import answered

RUBRIC = Rubric("report", (
    Check("short", lambda s: len(s.answer) <= 120),
    JudgeCriterion("city", "Does the report name the city [Paris]?"),
    JudgeCriterion("year", "Does the report give the year [1889]?", weight=2.0),
))
ANSWERS = ["Paris, 1889.", "It is in Paris.", "Built in 1889.", "A tower.", "Paris", "1889 Paris tower"]


def _episodes() -> list:
    return [answered(a, traj_id=f"t{i}", group=f"g{i % 2}", score=0.0) for i, a in enumerate(ANSWERS)]


def test_batched_cached_and_rerun_makes_no_calls(tmp_path: Path) -> None:
    judge = PolicyJudge(ScriptedPolicy(naive_judge_reply), cache_dir=tmp_path)
    first, stats = judge_trajectories(_episodes(), RUBRIC, judge)
    assert stats["judge_calls"] == 12 and stats["judge_errors"] == 0
    assert stats["judge_batches"] < 12  # prompts of different episodes shared policy batches
    assert first[0].score == pytest.approx(1.0) and first[3].score == pytest.approx(1 / 4)
    assert first[2].outcome["rubric"]["breakdown"]["report/year"] == 1.0
    for t in first:  # the reward rule: step rewards sum to the outcome score
        assert sum(turn.reward for turn in t.turns) == pytest.approx(t.score)
        assert t.outcome["checker_score"] == 0.0
    again = PolicyJudge(ScriptedPolicy(naive_judge_reply), cache_dir=tmp_path)
    second, stats = judge_trajectories(_episodes(), RUBRIC, again)
    assert stats["judge_calls"] == 0 and stats["judge_cache_hits"] == 12
    assert [t.score for t in second] == [t.score for t in first]


def _failing(messages: Sequence[Mapping[str, Any]]) -> str:
    raise RuntimeError("judge server down")


@pytest.mark.parametrize("policy, timeout_s, why", [
    (ScriptedPolicy(_failing), 5.0, "judge server down"),
    (ScriptedPolicy(["Looks fine to me."]), 5.0, "no closing 'VERDICT"),
    (ScriptedPolicy(["VERDICT: 5"], delay_s=0.3), 0.05, "timed out"),
])
def test_judge_failure_is_recorded_and_masked(policy: ScriptedPolicy, timeout_s: float, why: str) -> None:
    judge = PolicyJudge(policy, timeout_s=timeout_s, retries=1)
    out, stats = judge_trajectories(_episodes()[:2], RUBRIC, judge)
    assert stats["judge_errors"] == 2
    for t in out:
        assert t.error is not None and t.error.startswith("judge_error") and why in t.error
        assert t.outcome["judge_error"] == t.error and t.outcome["rubric"]["score"] is None
        assert t.score == 0.0  # the checker's score stays; the episode is masked, not scored 0 or 1 by the judge
    if why != "no closing 'VERDICT":
        assert stats["judge_calls"] == 2 * 2 * 2  # 2 episodes x 2 criteria x (1 + 1 retry)


def test_group_scores_are_relative_within_the_group() -> None:
    rubric = Rubric("r", (JudgeCriterion("facts", "Name [Paris], [1889] and [Gustave Eiffel]."),))
    middle = "Paris, 1889."
    strong = [answered(middle, traj_id="a1", group="A"), answered("Paris, 1889, Gustave Eiffel.", traj_id="a2", group="A"),
              answered("A tower.", traj_id="a3", group="A")]
    weak = [answered(middle, traj_id="b1", group="B"), answered("A tower.", traj_id="b2", group="B")]
    judge = PolicyJudge(ScriptedPolicy(naive_judge_reply))
    out, stats = judge_trajectories(strong + weak, rubric, judge, mode="group")
    assert stats["judge_calls"] == 2  # one call per group
    scores = {t.traj_id: t.score for t in out}
    assert scores["a2"] == 1.0 and scores["a3"] == 0.0 and scores["a1"] == pytest.approx(0.7)
    assert scores["b1"] == 1.0 and scores["b2"] == 0.0  # the same answer, ranked first in a weaker group
    independent, _ = judge_trajectories(strong + weak, rubric, PolicyJudge(ScriptedPolicy(naive_judge_reply)))
    assert {t.traj_id: t.score for t in independent}["b1"] == pytest.approx(0.7)


def test_failed_episodes_are_not_judged() -> None:
    broken = answered("Paris", traj_id="x")
    broken = type(broken)(**{**broken.__dict__, "error": "EnvCrashed: boom", "end_reason": "error"})
    out, stats = judge_trajectories([broken], RUBRIC, PolicyJudge(ScriptedPolicy(naive_judge_reply)))
    assert out[0] is broken and stats["judged"] == 0


def test_group_json_verdicts_match_the_line_format() -> None:
    rubric = Rubric("r", (JudgeCriterion("facts", "Name [Paris], [1889] and [Gustave Eiffel]."),))
    group = [answered("Paris, 1889.", traj_id="a1", group="A"), answered("Paris, 1889, Gustave Eiffel.", traj_id="a2",
             group="A"), answered("A tower.", traj_id="a3", group="A")]
    scores = {}
    for verdict_format in ("line", "json"):
        judge = PolicyJudge(ScriptedPolicy(naive_judge_reply), verdict_format=verdict_format)
        out, stats = judge_trajectories(group, rubric, judge, mode="group")
        assert stats["judge_calls"] == 1 and stats["judge_errors"] == 0
        scores[verdict_format] = [t.score for t in out]
    assert scores["json"] == scores["line"] == [pytest.approx(0.7), 1.0, 0.0]
