"""What a rubric scores: one episode reduced to the fields a criterion may look at.

A judge must see only what the rubric declares (the task, the final answer, optionally the transcript or the
reference answer), so the episode is first reduced to these named fields; a criterion names the ones it shows.
The checker's own outcome is kept for programmatic checks and for comparing judge and checker, never shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigError
from agentgym.trajectory import Trajectory

__all__ = ["FIELDS", "RubricSample", "answer_of", "sample_from_trajectory"]

#: The fields a judge criterion may declare.
FIELDS = ("task", "answer", "transcript", "reference")


@dataclass(frozen=True)
class RubricSample:
    """One episode as a rubric sees it.

    Attributes:
        task_id: The task's id (caches and group keys use it).
        task: The task as the agent was shown it (the first observation).
        answer: The agent's final answer: the text argument of its last tool call, else its last reply.
        transcript: ``(action, observation)`` pairs in order.
        reference: The task's reference answer, when known (programmatic checks; a judge only if declared).
        outcome: The env checker's outcome (``success``, ``score``, ``end_reason``); never shown to a judge.
    """

    task_id: str
    task: str
    answer: str
    transcript: tuple[tuple[str, str], ...] = ()
    reference: Any = None
    outcome: Mapping[str, Any] = field(default_factory=dict)

    def field_text(self, name: str) -> str:
        """The text of a declared field, as quoted to a judge."""
        if name == "task":
            return self.task
        if name == "answer":
            return self.answer
        if name == "transcript":
            return "\n".join(f"[agent] {a}\n[env] {o}" for a, o in self.transcript)
        if name == "reference":
            return "" if self.reference is None else str(self.reference)
        raise ConfigError(f"Unknown rubric field {name!r}; a judge criterion may show {', '.join(FIELDS)}.")


def answer_of(action: str, calls: Sequence[Mapping[str, Any]]) -> str:
    """The final answer of a turn: the first text argument of its last tool call, else the raw action text."""
    for call in reversed(list(calls)):
        arguments = call.get("arguments") or {}
        if isinstance(arguments, Mapping):
            for value in arguments.values():
                if isinstance(value, str):
                    return value
    return action


def sample_from_trajectory(trajectory: Trajectory, reference: Any = None) -> RubricSample:
    """The sample of a stored episode (what re-scoring and the rollout judge pass use)."""
    turns = trajectory.turns
    task = turns[0].observation if turns else ""
    transcript = tuple((t.action, trajectory.turns[i + 1].observation if i + 1 < len(turns)
                        else str(trajectory.final_observation or "")) for i, t in enumerate(turns))
    answer = answer_of(turns[-1].action, turns[-1].info.get("calls") or ()) if turns else ""
    return RubricSample(task_id=trajectory.task_id, task=task, answer=answer, transcript=transcript,
                        reference=reference, outcome=dict(trajectory.outcome))
