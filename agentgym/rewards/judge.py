"""What a judge is, seen from a rubric: a prompt goes in, text comes out.

The rubric builds :class:`JudgePrompt` records and parses the replies; it never talks to a model itself. Anything
that answers prompts satisfies :class:`Judge`: :class:`agentgym.rollout.judging.PolicyJudge` puts any agentgym
policy (a served model, Hugging Face, vLLM, a scripted policy in tests) behind it, with batching, a cache, a timeout
and retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Judge", "JudgePrompt", "JudgeReply"]


@dataclass(frozen=True)
class JudgePrompt:
    """One judge call: a system message (the rubric's instructions) and a user message (the quoted fields).

    Attributes:
        key: Which criterion asks (its path in the rubric, e.g. ``report/completeness``).
        system: Instructions to the judge; never contains agent text.
        user: The quoted fields the criterion declares.
    """

    key: str
    system: str
    user: str

    def messages(self) -> tuple[dict[str, str], ...]:
        return ({"role": "system", "content": self.system}, {"role": "user", "content": self.user})


@dataclass(frozen=True)
class JudgeReply:
    """A judge's answer to one prompt: its text, or why there is none (timeout, failed call)."""

    text: str | None
    error: str | None = None


@runtime_checkable
class Judge(Protocol):
    """Answers judge prompts, in order. ``name`` identifies the judge in caches and breakdowns."""

    name: str

    def judge(self, prompts: Sequence[JudgePrompt]) -> list[JudgeReply]:
        """One reply per prompt; a failure is a reply with ``error`` set, never an exception per prompt."""
        ...
