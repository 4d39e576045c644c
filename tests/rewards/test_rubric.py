"""Rubric composition, the breakdown, quoting and verdict parsing, with the naive scripted judge."""

from __future__ import annotations

import pytest

from agentgym.errors import ConfigError
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.rewards import Check, JudgeCriterion, JudgeReply, Rubric, sample_from_trajectory
from agentgym.rewards.scripted_judge import naive_judge_reply
from agentgym.rollout.judging import PolicyJudge
from tests.rewards.helpers import answered

COMPLETE = JudgeCriterion("complete", "Does the report name the city [Paris] and the year [1889]?")
GOOD = "The Eiffel Tower stands in Paris and was finished in 1889."


def _judge() -> PolicyJudge:
    return PolicyJudge(ScriptedPolicy(naive_judge_reply))


def test_weighted_composition_and_nested_breakdown() -> None:
    short = Check("short", lambda s: len(s.answer) < 200, weight=1.0)
    mentions = Check("mentions_1889", lambda s: 0.5 if "1889" in s.answer else 0.0, weight=1.0)
    inner = Rubric("facts", (mentions, COMPLETE), weight=2.0)
    rubric = Rubric("report", (short, inner))
    result = rubric.evaluate(sample_from_trajectory(answered(GOOD)), _judge())
    assert result.error is None
    assert result.breakdown["report/facts/mentions_1889"] == 0.5
    assert result.breakdown["report/facts/complete"] == 1.0
    assert result.breakdown["report/facts"] == pytest.approx(0.75)
    assert result.breakdown["report/short"] == 1.0
    assert result.score == pytest.approx((1.0 * 1.0 + 2.0 * 0.75) / 3.0)


def test_judge_sees_only_declared_fields() -> None:
    traj = answered(GOOD)
    sample = sample_from_trajectory(traj, reference="SECRET-REFERENCE")
    prompt = COMPLETE.prompt(sample, "r/complete")
    assert "SECRET-REFERENCE" not in prompt.user + prompt.system
    assert "1889 in Paris." not in prompt.user  # the transcript's observation: not declared
    with_ref = JudgeCriterion("c", "q [x]", fields=("answer", "reference")).prompt(sample, "k")
    assert "SECRET-REFERENCE" in with_ref.user


@pytest.mark.parametrize("reply", ["", "looks good", "VERDICT: 11", "VERDICT: 7\nthanks", "VERDICT: seven"])
def test_unusable_verdicts_are_errors_not_scores(reply: str) -> None:
    rubric = Rubric("r", (COMPLETE,))
    result = rubric.combine(sample_from_trajectory(answered(GOOD)), {"r/complete": JudgeReply(reply)})
    assert result.score is None and result.error is not None and result.error.startswith("judge_error")


def test_bad_rubrics_get_clear_errors() -> None:
    with pytest.raises(ConfigError, match="no criteria"):
        Rubric("r", ())
    with pytest.raises(ConfigError, match="duplicate"):
        Rubric("r", (COMPLETE, COMPLETE))
    with pytest.raises(ConfigError, match="fields"):
        JudgeCriterion("c", "q", fields=("secrets",))
    with pytest.raises(ConfigError, match="bool or a float"):
        Rubric("r", (Check("c", lambda s: 3.0),)).evaluate(sample_from_trajectory(answered(GOOD)))
    with pytest.raises(ConfigError, match="no judge"):
        Rubric("r", (COMPLETE,)).evaluate(sample_from_trajectory(answered(GOOD)))


@pytest.mark.parametrize("reply", ["", "VERDICT: 7", '{"verdict": 11}', '{"verdict": true}', '{"verdict": "7"}',
                                   '{"verdict": 7, "score": 9}', '{"verdict": 7} thanks', '[7]', '{"reasoning": 5, '
                                   '"verdict": 7}', '{"verdict": 7, "verdict": 3}', '{"reasoning": "fine"}',
                                   '{"verdict": NaN}'])
def test_unusable_json_verdicts_are_errors_not_scores(reply: str) -> None:
    rubric = Rubric("r", (COMPLETE,))
    result = rubric.combine(sample_from_trajectory(answered(GOOD)), {"r/complete": JudgeReply(reply)}, "json")
    assert result.score is None and result.error is not None and result.error.startswith("judge_error")


@pytest.mark.parametrize("reply, score", [('{"verdict": 7}', 0.7),
                                          ('{"reasoning": "names both", "verdict": 7.5}', 0.75),
                                          (' {"verdict":0}\n', 0.0)])
def test_json_verdicts_parse(reply: str, score: float) -> None:
    result = Rubric("r", (COMPLETE,)).combine(sample_from_trajectory(answered(GOOD)), {"r/complete": JudgeReply(reply)},
                                              "json")
    assert result.error is None and result.score == pytest.approx(score)


def test_json_prompts_carry_the_verdict_schema_and_keep_the_quoting() -> None:
    sample = sample_from_trajectory(answered(GOOD))
    line, json_prompt = COMPLETE.prompt(sample, "k"), COMPLETE.prompt(sample, "k", "json")
    assert line.schema is None and json_prompt.user == line.user  # the same fenced fields, only the format differs
    assert json_prompt.schema == {"type": "object", "properties": {"reasoning": {"type": "string"},
                                                                  "verdict": {"enum": list(range(11))}},
                                  "required": ["verdict"], "additionalProperties": False}
    group = COMPLETE.group_prompt([sample, sample, sample], "k", "json")
    assert group.schema is not None and group.schema["required"] == ["verdict_1", "verdict_2", "verdict_3"]
    wide = JudgeCriterion("w", "q", scale=(0, 1000)).verdict_schema()
    assert wide["properties"]["verdict"]["type"] == "number"
    with pytest.raises(ConfigError, match="verdict_format"):
        COMPLETE.prompt(sample, "k", "yaml")
    with pytest.raises(ConfigError, match="verdict_format"):
        PolicyJudge(ScriptedPolicy(naive_judge_reply), verdict_format="xml")
