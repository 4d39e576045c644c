"""OpenAI chat messages turned into what chat templates expect, as vLLM does before it applies a template.

Why: clients speak the OpenAI wire format, chat templates were written for another one. An assistant turn comes
back with ``tool_calls[].function.arguments`` as a JSON *string*; Hermes/Qwen templates render
``tool_call.arguments | tojson``, so a string renders as ``"arguments": "{\\"x\\": 1}"`` instead of the
``"arguments": {"x": 1}`` the model generated, and every later turn is conditioned on a history the model never
wrote. vLLM parses the strings to objects first (``vllm/entrypoints/chat_utils.py``, ``_postprocess_messages``);
the OpenAI server, the recording gateway and :class:`~agentgym.policies.openai.OpenAIPolicy` all render through
:func:`normalize_messages` so that the three of them and vLLM see one conversation.

What it does, following vLLM:

* text content parts are joined with ``"\\n"`` (vLLM's "string" content format); a tool message's text parts
  too;
* an assistant message's empty ``tool_calls`` list is dropped (templates then take the plain-assistant path), and
  each call's ``arguments`` becomes an object: a JSON string is parsed, ``None``/``""`` becomes ``{}``, and a
  string that is not a JSON object becomes ``{}`` with a warning (vLLM's choice: refusing would fail every later
  turn of that conversation as well);
* ``developer`` (OpenAI's name for the system role of newer models) passes unchanged to a template that names the
  role, as in vLLM; a template that does not know it would drop the turn or raise, so there it becomes ``system``,
  which is how OpenAI treats developer messages for models without the role.

:func:`wire_messages` is the inverse for sending: arguments as JSON strings, which is what OpenAI's API takes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.errors import AgentGymError

__all__ = ["MessageError", "joined_text", "normalize_messages", "template_knows_developer", "wire_messages"]

logger = logging.getLogger(__name__)


class MessageError(AgentGymError, ValueError):
    """A message no template can render (a tool call that is not a function call, a non-text part).

    Attributes:
        param: Where in the request, e.g. ``messages[2].tool_calls[0]``.
    """

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def joined_text(parts: Sequence[Any], where: str) -> str:
    """Text parts (``{"type": "text", "text": ...}``) joined with ``"\\n"``, as vLLM joins them."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise MessageError(f"{where}[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are supported "
                               f"here, got {kind!r}.", f"{where}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def template_knows_developer(chat_template: Any) -> bool:
    """Whether a chat template (its source, or a dict of named templates) mentions the ``developer`` role."""
    if isinstance(chat_template, Mapping):
        return any(template_knows_developer(t) for t in chat_template.values())
    if isinstance(chat_template, (list, tuple)):
        return any(template_knows_developer(t.get("template") if isinstance(t, Mapping) else t) for t in chat_template)
    return isinstance(chat_template, str) and "developer" in chat_template


def _arguments(value: Any, name: Any, where: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    if not value:
        return {}
    parsed: Any = None
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            logger.warning("%s: tool call %r has arguments that are not valid JSON (%d chars); rendering them as {} "
                           "so that the conversation can go on (as vLLM does).", where, name, len(value))
            return {}
    if not isinstance(parsed, Mapping):
        logger.warning("%s: tool call %r arguments are %s, not a JSON object; rendering them as {} (as vLLM does).",
                       where, name, type(parsed).__name__)
        return {}
    return dict(parsed)


def _tool_calls(calls: list[Any], index: int) -> list[dict[str, Any]]:
    out = []
    for j, item in enumerate(calls):
        where = f"messages[{index}].tool_calls[{j}]"
        function = item.get("function") if isinstance(item, Mapping) else None
        if not isinstance(item, Mapping) or item.get("type", "function") != "function" or not isinstance(
                function, Mapping):
            raise MessageError(f"{where} must be a function call {{'type': 'function', 'function': {{'name': ..., "
                               f"'arguments': ...}}}}, got {item!r}.", where)
        function = {**function, "arguments": _arguments(function.get("arguments"), function.get("name"), where)}
        out.append({**item, "function": function})
    return out


def normalize_messages(messages: Sequence[Mapping[str, Any]], chat_template: Any = None) -> list[dict[str, Any]]:
    """Copies of ``messages`` ready for ``apply_chat_template`` (see the module docstring); the input is unchanged.

    Args:
        messages: OpenAI chat messages (each a mapping with ``role``).
        chat_template: The template they will be rendered with (its source); decides whether ``developer`` stays.
            ``None``: it becomes ``system``.

    Raises:
        MessageError: A tool call that is not a function call, or a content part that is not text where only text
            can be rendered (a tool message).
    """
    keep_developer = template_knows_developer(chat_template)
    out = []
    for i, message in enumerate(messages):
        msg = dict(message)
        role = msg.get("role")
        content = msg.get("content")
        if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
            msg["content"] = joined_text(content, f"messages[{i}].content")
        elif role == "tool" and isinstance(content, list):
            msg["content"] = joined_text(content, f"messages[{i}].content")
        if role == "developer" and not keep_developer:
            msg["role"] = "system"
        if role == "assistant" and "tool_calls" in msg:
            calls = msg["tool_calls"]
            if isinstance(calls, list) and not calls:
                del msg["tool_calls"]
            elif isinstance(calls, list):
                msg["tool_calls"] = _tool_calls(calls, i)
        out.append(msg)
    return out


def wire_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as OpenAI's API takes them: tool-call ``arguments`` held as objects are sent as JSON strings (an
    OpenAI server refuses objects there; :func:`normalize_messages` turns them back on the server's side)."""
    out = []
    for message in messages:
        msg = dict(message)
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            wired = []
            for item in calls:
                function = item.get("function") if isinstance(item, Mapping) else None
                if isinstance(function, Mapping) and isinstance(function.get("arguments"), Mapping):
                    item = {**item, "function": {**function, "arguments": json.dumps(
                        function["arguments"], ensure_ascii=False)}}
                wired.append(item)
            msg["tool_calls"] = wired
        out.append(msg)
    return out
