"""What a judge is, seen from a rubric: a prompt goes in, text comes out.

The rubric builds :class:`JudgePrompt` records and parses the replies; it never talks to a model itself. Anything
that answers prompts satisfies :class:`Judge`: :class:`agentgym.rollout.judging.PolicyJudge` puts any agentgym
policy (a served model, Hugging Face, vLLM, a scripted policy in tests) behind it, with batching, a cache, a timeout
and retries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Judge", "JudgePrompt", "JudgeReply"]


@dataclass(frozen=True)
class JudgePrompt:
    """One judge call: a system message (the rubric's instructions) and a user message (the quoted fields).

    Attributes:
        key: Which criterion asks (its path in the rubric, e.g. ``report/completeness``).
        system: Instructions to the judge; never contains agent text.
        user: The quoted fields the criterion declares.
        schema: The JSON schema the reply must validate against (``verdict_format="json"``), for a judge that can
            decode under one (``None``: free text with a closing verdict line).
    """

    key: str
    system: str
    user: str
    schema: Mapping[str, Any] | None = field(default=None, compare=False)

    def messages(self) -> tuple[dict[str, str], ...]:
        return ({"role": "system", "content": self.system}, {"role": "user", "content": self.user})


@dataclass(frozen=True)
class JudgeReply:
    """A judge's answer to one prompt: its text, or why there is none (timeout, failed call)."""

    text: str | None
    error: str | None = None


@runtime_checkable
class Judge(Protocol):
    """Answers judge prompts, in order. ``name`` identifies the judge in caches and breakdowns.

    A judge may also carry ``verdict_format`` (``"line"`` or ``"json"``, see
    :mod:`agentgym.rewards.criteria`); the rubric builds its prompts and parses its replies in that format, and a
    judge without the attribute gets ``"line"``.
    """

    name: str

    def judge(self, prompts: Sequence[JudgePrompt]) -> list[JudgeReply]:
        """One reply per prompt; a failure is a reply with ``error`` set, never an exception per prompt."""
        ...
