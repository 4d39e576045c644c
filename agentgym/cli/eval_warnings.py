"""Warnings at the end of ``agentgym eval`` when a run's failures look like a setting, not the model.

A model prompted otherwise than it was trained (the env's long instructions instead of its short or empty system
prompt, a different per-turn token budget) scores 0 with every episode ending the same way, and a success table
alone does not say why. When most episodes end at the context limit, or most replies are cut at ``max_tokens``,
or most episodes hold only void turns (nothing the env could parse), the run names the likely cause and the flag
that fixes it, on stderr and in ``summary.json`` (``warnings``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["run_warnings"]


def _most(count: int, total: int) -> bool:
    """More than half: one stray episode is the model's doing; most of a run is a setting."""
    return total > 0 and count * 2 > total


def _trained_with(defaults: Mapping[str, Any], source: str | None) -> str:
    if not defaults or source is None:
        return ""
    shown = []
    if "system_prompt" in defaults:
        shown.append(f"system prompt {defaults['system_prompt']!r}")
    if "max_tokens" in defaults:
        shown.append(f"max tokens {defaults['max_tokens']}")
    return f" ({source} says it was trained with {', '.join(shown)})" if shown else ""


def run_warnings(trajectories: Sequence[Any], *, max_tokens: int, system_prompt: str | None,
                 defaults: Mapping[str, Any], source: str | None, context: int | None = None) -> list[str]:
    """The warnings for a finished run (empty when nothing looks like a setting).

    Args:
        trajectories: The run's episodes.
        max_tokens: The per-turn token budget the run used.
        system_prompt: The system prompt the run used (``None``: each env's instructions).
        defaults: What the model was trained with, as far as known (its ``agentgym.json`` or the server's).
        source: Where ``defaults`` came from, for the message (``None`` when nothing is known).
        context: The model's context in tokens, when known.
    """
    n = len(trajectories)
    if n == 0:
        return []
    prompt = "each env's instructions" if system_prompt is None else repr(_short(system_prompt))
    trained = _trained_with(defaults, source)
    unknown = "" if defaults else (" (No training settings are known for this model: it has no agentgym.json, or "
                                   "its server publishes none.)")
    warnings: list[str] = []
    limited = sum(1 for t in trajectories if t.end_reason == "context_limit")
    if _most(limited, n):
        within = f"the model's {context}-token context" if context else "the model's context"
        warnings.append(
            f"{limited}/{n} episodes ended context_limit: the prompt (system prompt: {prompt}) plus --max-tokens "
            f"{max_tokens} grows past {within}. Pass --max-tokens and --system-prompt as the model was trained"
            f"{trained}, or fewer turns.{unknown}")
    turns = [turn for t in trajectories for turn in t.turns]
    cut = sum(1 for turn in turns if turn.finish_reason == "length")
    if _most(cut, len(turns)):
        warnings.append(
            f"{cut}/{len(turns)} replies were cut at --max-tokens {max_tokens} (finish_reason 'length'): the model "
            f"did not finish its turns. Raise --max-tokens, or use the budget the model was trained with"
            f"{trained}.{unknown}")
    void = sum(1 for t in trajectories if t.turns and all(_kind(turn) == "void" for turn in t.turns))
    if _most(void, n):
        warnings.append(
            f"{void}/{n} episodes had only void turns (no tool call or answer the env could parse): the model is "
            f"likely not prompted as it was trained (system prompt: {prompt}). Pass --system-prompt and "
            f"--max-tokens as the model was trained{trained}, and check its chat template.{unknown}")
    return warnings


def _kind(turn: Any) -> str | None:
    info = turn.info if isinstance(turn.info, Mapping) else {}
    return info.get("kind") if isinstance(info.get("kind"), str) else None


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
