"""The support rubric: the case resolved, no question asked twice, few turns, and (with a judge) courtesy.

``resolved`` is the env's checker; ``asked_once`` reads the transcript for the customer's "I already told you
that"; ``brief`` pays full marks up to four turns, then less per extra turn; ``courteous`` asks a judge, shown the
quoted conversation and the final action, whether the agent apologised and confirmed the outcome.
"""

from __future__ import annotations

from agentgym.rewards import Check, Judge, JudgeCriterion, Rubric, RubricSample

__all__ = ["support_rubric"]


def _asked_once(sample: RubricSample) -> float:
    repeats = sum(observation.count("I already told you that") for _, observation in sample.transcript)
    return 1.0 / (1 + repeats)


def _brief(sample: RubricSample) -> float:
    return min(1.0, 4.0 / max(1, len(sample.transcript)))


def support_rubric(judge: Judge | None = None) -> Rubric:
    """The rubric; pass a judge to add the ``courteous`` judge criterion."""
    criteria: list = [Check("resolved", lambda s: float(s.outcome.get("success", False)), weight=3.0),
                      Check("asked_once", _asked_once), Check("brief", _brief)]
    if judge is not None:
        criteria.append(JudgeCriterion("courteous", "Did the agent apologise ([sorry]) and [thank] the customer?",
                                       fields=("transcript", "answer"), weight=1.0))
    return Rubric("support", tuple(criteria), judge=judge)
