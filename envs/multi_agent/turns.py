"""One turn of a text agent in a game: parse the raw text, run at most one tool, classify the turn.

This is the multi-agent counterpart of :meth:`agentgym.env.AgentEnv._run_action` and uses the same parts
(the family's :class:`~agentgym.parsers.CompositeParser`, the :class:`~agentgym.toolset.ToolSet`, the turn
kinds ``tool_call | void | invalid``), so a prompt and a trainer that work on single-agent envs work on
games. A game turn is one move, so only the first call of a reply runs; the rest are reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.parsers import ParsedAction, ToolCallParser
from agentgym.toolset import ToolSet

__all__ = ["TurnResult", "format_reminder", "run_turn"]


@dataclass(frozen=True)
class TurnResult:
    """What one reply did.

    Attributes:
        kind: ``tool_call`` (a move was made), ``void`` (no call found) or ``invalid`` (unreadable, unknown
            tool, bad arguments, or a move the rules forbid).
        message: Text for the acting agent: the tool's answer, or an error that says the fix.
        moved: True when a call ran without error, i.e. the agent's move counts.
        info: ``calls``, ``errors`` and ``tool_errors`` of the turn, JSON-safe.
    """

    kind: str
    message: str
    moved: bool
    info: dict[str, Any] = field(default_factory=dict)


def format_reminder(toolset: ToolSet) -> str:
    """The one-line fix for a reply without a usable call."""
    names = ", ".join(toolset.names)
    return (f"Make one move per turn with a tool ({names}), e.g. "
            '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>.')


def run_turn(action: Any, parser: ToolCallParser, toolset: ToolSet, *, max_action_chars: int) -> TurnResult:
    """Parse ``action`` and run its first call; never raises on model text (only ``EnvCrashed`` escapes)."""
    info: dict[str, Any] = {"calls": [], "errors": [], "tool_errors": []}
    if not isinstance(action, str):
        info["errors"].append("action is not a string")
        return TurnResult("invalid", f"Error: the action must be text (a str), got {type(action).__name__}.", False, info)
    if len(action) > max_action_chars:
        info["errors"].append("action too long")
        return TurnResult("invalid", f"Error: your reply has {len(action)} characters; the limit is {max_action_chars}. "
                          "Reply with one short tool call.", False, info)
    try:
        parsed: ParsedAction = parser.parse(action)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not crash on model text
        info["errors"].append(f"parser failed: {type(exc).__name__}")
        return TurnResult("invalid", f"Error: your reply could not be read ({type(exc).__name__}). "
                          + format_reminder(toolset), False, info)
    info["errors"].extend(parsed.errors)
    if not parsed.calls:
        if parsed.errors:
            return TurnResult("invalid", "Error: " + " ".join(parsed.errors) + " " + format_reminder(toolset), False, info)
        return TurnResult("void", "No move found in your reply. " + format_reminder(toolset), False, info)
    call = parsed.calls[0]
    result = toolset.call(call)
    info["calls"].append(call.to_dict())
    notes: Sequence[str] = ()
    if len(parsed.calls) > 1:
        notes = (f"Only one move per turn: the first call ran and {len(parsed.calls) - 1} more were ignored.",)
    message = " ".join([result.content, *notes])
    if result.is_error:
        info["tool_errors"].append(result.content)
        return TurnResult("invalid", message, False, info)
    return TurnResult("tool_call", message, True, info)
