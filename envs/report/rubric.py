"""The report rubric: facts checked against the corpus, grounding, length, and (with a judge) completeness.

``facts`` re-reads the reference facts the corpus states; ``grounded`` asks that every number in the report appear
in a document the agent saw (a report that invents a population fails it); ``concise`` caps the length, so padding
earns nothing; ``complete`` asks a judge whether the report covers what was asked, quoting only the task and the
report. Without a judge the rubric has the three programmatic criteria.
"""

from __future__ import annotations

import re

from agentgym.rewards import Check, Judge, JudgeCriterion, Rubric, RubricSample
from agentgym.envs.report.tasks import fact_coverage

__all__ = ["report_rubric"]

_NUMBER = re.compile(r"\d[\d,.]*\d|\d")


def _facts(sample: RubricSample) -> float:
    coverage = fact_coverage(sample.answer, sample.reference or {})
    return sum(coverage.values()) / len(coverage)


def _grounded(sample: RubricSample) -> float:
    numbers = [n.replace(",", "") for n in _NUMBER.findall(sample.answer)]
    if not numbers:
        return 1.0
    seen = " ".join(observation for _, observation in sample.transcript).replace(",", "")
    return sum(n in seen for n in numbers) / len(numbers)


def report_rubric(judge: Judge | None = None, max_chars: int = 1200) -> Rubric:
    """The rubric; pass a judge to add the ``complete`` judge criterion."""
    criteria: list = [Check("facts", _facts, weight=3.0), Check("grounded", _grounded),
                      Check("concise", lambda s: len(s.answer) <= max_chars)]
    if judge is not None:
        criteria.append(JudgeCriterion(
            "complete", "Does the report state the country's [capital], [currency], official [language] and the "
            "countries it [border]s, in plain sentences?", weight=2.0))
    return Rubric("report", tuple(criteria), judge=judge)
