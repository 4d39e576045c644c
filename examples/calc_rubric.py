"""A rubric for calculator episodes: the checker's verdict plus a judge's view of whether the agent showed its work.

Use it to re-score stored episodes without re-running the env::

    agentgym rescore runs/eval-.../trajectories.jsonl --rubric examples/calc_rubric.py:build \
        --judge scripted-naive --out rescored.jsonl

``scripted-naive`` is a scripted stand-in judge for trying the pipeline; pass ``--judge openai:BASE_URL#MODEL``
(any OpenAI-compatible server, ``agentgym serve`` included) for a real one.
"""

from __future__ import annotations

from agentgym.rewards import Check, JudgeCriterion, Rubric


def build() -> Rubric:
    """Correct answer (the env's checker) and shown work (a judge reads the answer and the transcript), equal weight."""
    return Rubric("calc", (
        Check("correct", lambda sample: float(sample.outcome.get("success", False))),
        JudgeCriterion("shows_work", "Did the agent call the [calc] tool before answering?",
                       fields=("answer", "transcript")),
    ))
