"""Anthropic's Messages API on the recording gateway: requests become chat requests, replies become messages.

Why: many agent harnesses (and the official ``anthropic`` package) speak ``POST /v1/messages`` rather than OpenAI's
chat API. The gateway records token-exactly only what an OpenAI-compatible server generated, so a Messages request
is converted to the one internal chat form (the same ``messages`` / ``tools`` a chat client would send), forwarded
and recorded exactly like a chat call, and the answer converted back. The conversion is a pure function of the
request, so a later turn that replays an earlier reply (its ``tool_use`` blocks) renders to the ids the model
sampled, and the recorded calls merge into one training sequence as chat calls do.

How the shapes map:

* ``system`` (a string or text blocks) becomes the first ``system`` message;
* a ``user`` message's ``text`` blocks become a user message, each ``tool_result`` block a ``tool`` message (its
  ``tool_use_id`` is the ``tool_call_id``), in the order they appear;
* an ``assistant`` message's ``text`` blocks become its content, its ``tool_use`` blocks its ``tool_calls`` (the
  ``input`` object serialised with ``json.dumps``, as the server serialises the calls it parses);
* ``tools`` (``name``, ``description``, ``input_schema``) become function tools; ``tool_choice`` ``auto`` / ``any``
  / ``tool`` / ``none`` become ``auto`` / ``required`` / the named function / ``none``;
* ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``, ``top_k`` and ``stream`` carry over; ``metadata``'s
  ``user_id`` becomes the chat ``user`` field (one of the ways a call names its gateway session).

A reply's text becomes a ``text`` block and each parsed tool call a ``tool_use`` block; ``finish_reason`` ``stop``
becomes ``end_turn`` (or ``stop_sequence`` with the matched ``stop_sequence``, from the server's ``stop_reason``),
``length`` becomes ``max_tokens`` and ``tool_calls`` becomes ``tool_use``. Errors are answered in Anthropic's shape
(``{"type": "error", "error": {"type", "message"}}``), which the ``anthropic`` package turns into its exception
classes. Blocks the chat form cannot carry (images, documents, thinking, server tools) are refused with a 400 that
says so, never dropped silently.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from agentgym.errors import did_you_mean
from agentgym.serving.openai_protocol import APIError

try:
    from fastapi.responses import JSONResponse
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from agentgym.errors import DependencyNotInstalled

    raise DependencyNotInstalled("fastapi", "serve", "the recording gateway") from exc

__all__ = ["MESSAGES_FIELDS", "MessageStream", "error_body", "error_response", "to_chat_request", "to_message"]

#: Fields accepted and ignored: they route, cache or bill a call at Anthropic and change nothing that is sampled.
_IGNORED_FIELDS = frozenset({"service_tier", "cache_control", "inference_geo", "speed", "workspace_id",
                             "user_profile_id", "diagnostics"})
#: The request fields ``/v1/messages`` takes (anything else is a 400 with a did-you-mean). Newer ``anthropic``
#: packages no longer send ``temperature`` / ``top_p`` / ``top_k`` (pass them in ``extra_body``); older ones and raw
#: HTTP clients do.
MESSAGES_FIELDS = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
                             "top_k", "tools", "tool_choice", "stream", "metadata", "thinking"}) | _IGNORED_FIELDS
#: Block keys that change nothing the model sees (prompt caching is the provider's business).
_IGNORED_BLOCK_KEYS = frozenset({"cache_control", "citations"})
#: HTTP status -> Anthropic error type (the ``anthropic`` package picks its exception class by status).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                422: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}


# ---- errors ---------------------------------------------------------------------------------------------
def error_body(status: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape, typed by its HTTP status."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(exc: APIError) -> JSONResponse:
    """``exc`` (raised by the gateway or the conversion) as an Anthropic error response."""
    where = f" (field: {exc.param})" if exc.param else ""
    return JSONResponse(error_body(exc.status, exc.message + where), status_code=exc.status)


def upstream_error(status: int, content: bytes) -> APIError:
    """An upstream server's error answer (OpenAI's shape, or anything else) as an :class:`APIError`."""
    message = content.decode("utf-8", "replace")[:2000]
    try:
        data = json.loads(content)
        if isinstance(data, Mapping) and isinstance(data.get("error"), Mapping):
            message = str(data["error"].get("message") or message)
    except ValueError:
        pass
    return APIError(f"The model server refused the call: {message}", status=status)


# ---- requests -------------------------------------------------------------------------------------------
def _text_blocks(value: Any, where: str) -> str:
    """A string, or a list of ``text`` blocks joined (what ``system`` and ``tool_result`` content may be)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(f"{where} must be a string or a list of text blocks, got {type(value).__name__}.", param=where)
    parts = []
    for j, block in enumerate(value):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise APIError(f"{where}[{j}] must be a text block {{'type': 'text', 'text': ...}}, got {kind!r}: the "
                           "gateway's model takes text only.", param=f"{where}[{j}]")
        parts.append(block["text"])
    return "".join(parts)


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of content blocks, got {type(content).__name__}.",
                       param=where)
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise APIError(f"{where}[{j}] must be a content block with a 'type', got {block!r}.", param=f"{where}[{j}]")
    return content


def _unsupported(kind: str, where: str, allowed: tuple[str, ...]) -> APIError:
    return APIError(f"{where} is a {kind!r} block, which this gateway cannot pass to its model (it takes "
                    f"{', '.join(allowed)} blocks here).{did_you_mean(kind, allowed)}", param=where)


def _user_messages(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn as chat messages: runs of text blocks as user messages, each tool result a tool message."""
    out: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        kind, at = block["type"], f"{where}[{j}]"
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise APIError(f"{at}.text must be a string.", param=at)
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += block["text"]
            else:
                out.append({"role": "user", "content": block["text"]})
        elif kind == "tool_result":
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str) or not tool_use_id:
                raise APIError(f"{at}.tool_use_id must name the tool_use block this result answers.", param=at)
            result = block.get("content", "")
            out.append({"role": "tool", "tool_call_id": tool_use_id,
                        "content": _text_blocks(result, f"{at}.content") if result is not None else ""})
        else:
            raise _unsupported(kind, at, ("text", "tool_result"))
    return out


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    """An assistant turn as one chat message: its text as content, its tool_use blocks as tool calls."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        kind, at = block["type"], f"{where}[{j}]"
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise APIError(f"{at}.text must be a string.", param=at)
            text.append(block["text"])
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, Mapping):
                raise APIError(f"{at} must be {{'type': 'tool_use', 'id': str, 'name': str, 'input': object}} (send "
                               "back the block the gateway answered with).", param=at)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(dict(arguments), ensure_ascii=False)}})
        else:
            raise _unsupported(kind, at, ("text", "tool_use"))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise APIError("'tools' must be a list of {'name', 'description', 'input_schema'} objects.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise APIError(f"{at} must be an object with 'name' and 'input_schema'.", param=at)
        if tool.get("type") not in (None, "custom"):
            raise APIError(f"{at} is a server tool ({tool.get('type')!r}), which runs on Anthropic's side; this "
                           "gateway takes client tools only ({'name', 'description', 'input_schema'}).", param=at)
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name or not isinstance(schema, Mapping):
            raise APIError(f"{at} needs a 'name' (string) and an 'input_schema' (a JSON schema object).", param=at)
        function: dict[str, Any] = {"name": name, "parameters": dict(schema)}
        if tool.get("description") is not None:
            function["description"] = str(tool["description"])
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError("'tool_choice' must be {'type': 'auto'}, {'type': 'any'}, {'type': 'none'} or {'type': 'tool', "
                   f"'name': ...}}, got {choice!r}.", param="tool_choice")


def to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API request as the equivalent chat-completions request (see the module docstring).

    Raises:
        APIError: 400 for a request the Messages API or this gateway does not accept, naming the field.
    """
    unknown = sorted(set(body) - MESSAGES_FIELDS)
    if unknown:
        raise APIError(f"Unknown field(s) {unknown} for /v1/messages.{did_you_mean(unknown[0], MESSAGES_FIELDS)} "
                       f"Allowed: {sorted(MESSAGES_FIELDS)}.", param=unknown[0])
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, Mapping) and thinking.get("type") == "disabled"):
        raise APIError("'thinking' is not supported by this gateway's model: leave it out or send "
                       "{'type': 'disabled'}.", param="thinking")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError("'model' is required: the served model's name (GET /v1/models lists it).", param="model")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise APIError(f"'max_tokens' is required and must be a positive integer, got {max_tokens!r}.",
                       param="max_tokens")
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise APIError("'messages' must be a non-empty list of {'role': 'user' | 'assistant', 'content'} objects.",
                       param="messages")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    for i, turn in enumerate(turns):
        at = f"messages[{i}]"
        role = turn.get("role") if isinstance(turn, Mapping) else None
        if role == "user":
            messages += _user_messages(turn.get("content"), f"{at}.content")
        elif role == "assistant":
            messages.append(_assistant_message(turn.get("content"), f"{at}.content"))
        else:
            raise APIError(f"{at}.role must be 'user' or 'assistant' (the system prompt is the top-level 'system'), "
                           f"got {role!r}.", param=f"{at}.role")
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    for key in ("temperature", "top_p", "top_k", "stream"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stop_sequences") is not None:
        stops = body["stop_sequences"]
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise APIError(f"'stop_sequences' must be a list of strings, got {stops!r}.", param="stop_sequences")
        if stops:
            chat["stop"] = list(stops)
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise APIError("'metadata' must be an object such as {'user_id': ...}.", param="metadata")
        if isinstance(metadata.get("user_id"), str) and metadata["user_id"]:
            chat["user"] = metadata["user_id"]
    return chat


# ---- replies --------------------------------------------------------------------------------------------
def _tool_input(arguments: Any) -> dict[str, Any]:
    """A chat tool call's arguments (a JSON string) as a tool_use ``input`` object."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"arguments": arguments}  # a server that passed unparsed text on: keep it visible, not lost
    return value if isinstance(value, dict) else {"arguments": value}


def _stop(finish_reason: Any, stop_reason: Any, stops: Any, has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat finish: a matched stop string is a ``stop_sequence``."""
    if has_calls or finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop_reason, str) and isinstance(stops, list) and stop_reason in stops:
        return "stop_sequence", stop_reason
    return "end_turn", None


def to_message(data: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion (the upstream's answer to ``request``, the converted chat request) as a Messages reply."""
    choices = data.get("choices") if isinstance(data.get("choices"), list) else []
    choice = choices[0] if choices and isinstance(choices[0], Mapping) else {}
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": str(message["content"])})
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
    for call in calls:
        function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
        content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"),
                        "name": str(function.get("name", "")), "input": _tool_input(function.get("arguments"))})
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice.get("stop_reason"), request.get("stop"),
                                       bool(calls))
    usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": request.get("model"),
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0),
                      "output_tokens": int(usage.get("completion_tokens") or 0)}}


def _event(kind: str, payload: Mapping[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


class MessageStream:
    """Translates a chat-completions stream (parsed chunks, in order) into the Messages API's event stream.

    Events: ``message_start``; per content block ``content_block_start``, its ``content_block_delta`` events
    (``text_delta`` for text, ``input_json_delta`` for a tool call's arguments) and ``content_block_stop``; then
    ``message_delta`` (stop reason, output tokens) and ``message_stop``. An error chunk mid-stream becomes an
    ``error`` event.
    """

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.request = request
        self.started = False
        self.block = -1  # index of the open content block, -1 when none is open
        self.block_kind: str | None = None
        self.tool_blocks: dict[int, int] = {}  # chat tool-call index -> content block index
        self.finish_reason: Any = None
        self.stop_reason: Any = None
        self.output_tokens = 0
        self.saw_calls = False

    def _start(self, chunk: Mapping[str, Any]) -> list[str]:
        if self.started:
            return []
        self.started = True
        prompt = chunk.get("prompt_token_ids")
        message = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                   "model": self.request.get("model"), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": len(prompt) if isinstance(prompt, list) else 0, "output_tokens": 0}}
        return [_event("message_start", {"message": message})]

    def _open(self, block: dict[str, Any]) -> list[str]:
        events = self._close()
        self.block += 1
        self.block_kind = block["type"]
        return events + [_event("content_block_start", {"index": self.block, "content_block": block})]

    def _close(self) -> list[str]:
        if self.block_kind is None:
            return []
        self.block_kind = None
        return [_event("content_block_stop", {"index": self.block})]

    def feed(self, chunk: Mapping[str, Any]) -> list[str]:
        """The events one upstream chunk makes (none for an empty delta)."""
        if isinstance(chunk.get("error"), Mapping):  # the upstream failed after its stream began
            message = str(chunk["error"].get("message") or "The model server failed mid-stream.")
            return self._start(chunk) + [_event("error", {"error": error_body(500, message)["error"]})]
        events = self._start(chunk)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                self.output_tokens += len(ids)
            delta = choice.get("delta") if isinstance(choice.get("delta"), Mapping) else {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.block_kind != "text":
                    events += self._open({"type": "text", "text": ""})
                events.append(_event("content_block_delta", {"index": self.block,
                                                             "delta": {"type": "text_delta", "text": text}}))
            for call in delta.get("tool_calls") or ():
                if not isinstance(call, Mapping):
                    continue
                self.saw_calls = True
                position = call.get("index", 0)
                function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
                if position not in self.tool_blocks:
                    call_id = str(call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}")
                    events += self._open({"type": "tool_use", "id": call_id, "name": str(function.get("name", "")),
                                          "input": {}})
                    self.tool_blocks[position] = self.block
                arguments = function.get("arguments")
                if isinstance(arguments, str) and arguments:
                    events.append(_event("content_block_delta", {
                        "index": self.tool_blocks[position],
                        "delta": {"type": "input_json_delta", "partial_json": arguments}}))
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")
        usage = chunk.get("usage")
        if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
            self.output_tokens = max(self.output_tokens, usage["completion_tokens"])
        return events

    def finish(self) -> list[str]:
        """The closing events (after the upstream stream ended)."""
        events = self._start({}) + self._close()
        stop_reason, stop_sequence = _stop(self.finish_reason, self.stop_reason, self.request.get("stop"),
                                           self.saw_calls)
        events.append(_event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                               "usage": {"output_tokens": self.output_tokens}}))
        events.append(_event("message_stop", {}))
        return events
