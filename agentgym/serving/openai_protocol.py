"""The OpenAI API as this server speaks it: which fields each endpoint takes, their validation, and the error,
JSON-body and server-sent-event shapes of the wire.

Validation is strict on purpose: a field the server does not know is a 400 with a did-you-mean instead of being
ignored, so a misspelled parameter never passes silently, and every number is checked per request (NaN, infinity
and strings are a 400 for that request alone, never a poisoned batch). Knobs the sampler lacks accept only their
neutral value. Everything here raises :class:`APIError`, which the app renders in OpenAI's error format.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.errors import AgentGymError, DependencyNotInstalled, did_you_mean
from agentgym.policies.chat_messages import MessageError, joined_text, normalize_messages

try:
    from fastapi import Request
    from fastapi.responses import JSONResponse
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise DependencyNotInstalled("fastapi", "serve", "the OpenAI-compatible server") from exc

__all__ = [
    "ANY_JSON_OBJECT",
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "DETOKENIZE_FIELDS",
    "MAX_LOGPROBS",
    "SSE_DONE",
    "TOKENIZE_FIELDS",
    "APIError",
    "Sampling",
    "check_fields",
    "error_response",
    "get_bool",
    "get_float",
    "get_int",
    "get_stop",
    "json_body",
    "parse_json_format",
    "parse_messages",
    "parse_sampling",
    "parse_tool_choice",
    "parse_tools",
    "reject_unsupported",
    "sse",
]

#: Most log-probs alternatives a request may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20
#: Most stop strings and stop token ids per request. The policy checks every stop string at every decoding step of
#: every row, so thousands of them (an 8 MiB body holds a million) would hold the model for one request. OpenAI
#: allows 4 stop strings; these bounds leave room for any real use.
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024

#: Accepted for compatibility with OpenAI clients and ignored (they do not change what is generated).
_IGNORED_FIELDS = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls"})
#: vLLM sampling extras, on both endpoints.
_VLLM_SAMPLING_FIELDS = frozenset({
    "return_token_ids", "return_tokens_as_token_ids", "include_stop_str_in_output", "add_special_tokens",
    "stop_token_ids", "ignore_eos", "min_tokens", "skip_special_tokens", "top_k", "min_p", "repetition_penalty",
    "guided_json",
})
COMPLETION_FIELDS = frozenset({
    # OpenAI
    "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
    "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "seed",
    "response_format",
}) | _IGNORED_FIELDS | _VLLM_SAMPLING_FIELDS
CHAT_FIELDS = frozenset({
    # OpenAI
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
    "logit_bias", "tools", "tool_choice", "response_format",
    # vLLM extensions
    "add_generation_prompt", "chat_template_kwargs",
}) | _IGNORED_FIELDS | _VLLM_SAMPLING_FIELDS
TOKENIZE_FIELDS = frozenset({
    "model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "tools", "chat_template_kwargs",
    "return_token_strs",
})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})
_ROLES = ("system", "developer", "user", "assistant", "tool")


# ---- errors ----------------------------------------------------------------------------------------


class APIError(AgentGymError):
    """A request the server refuses; rendered in the OpenAI error format.

    Attributes:
        status: HTTP status code.
        message: What was wrong and how to fix it.
        param: The request field at fault, if any.
        code: A machine-readable code (OpenAI style), if any.
        type: OpenAI error type (``invalid_request_error``, ``server_error``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, param=self.param, code=self.code, type=self.type)


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None,
    type: str = "invalid_request_error",
) -> JSONResponse:
    """An error in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), which clients parse."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


# ---- request validation ----------------------------------------------------------------------------


def check_fields(body: Mapping[str, Any], allowed: frozenset[str], endpoint: str) -> None:
    """Reject unknown fields rather than ignore them: a misspelled ``max_token`` must not pass silently."""
    for key in body:
        if key not in allowed:
            raise APIError(
                f"Unrecognized request argument {key!r} for {endpoint}.{did_you_mean(key, allowed)} "
                f"Supported arguments: {', '.join(sorted(allowed))}.",
                param=key, code="unrecognized_argument",
            )


def get_int(body: Mapping[str, Any], key: str, default: int | None, *, minimum: int | None = None,
             maximum: int | None = None) -> int | None:
    """``body[key]`` as an integer within bounds (a bool is not an integer here, unlike in Python)."""
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{key!r} must be an integer, got {value!r}.", param=key)
    if minimum is not None and value < minimum:
        raise APIError(f"{key!r} must be >= {minimum}, got {value}.", param=key)
    if maximum is not None and value > maximum:
        raise APIError(f"{key!r} must be <= {maximum}, got {value}.", param=key)
    return value


def get_float(body: Mapping[str, Any], key: str, default: float) -> float:
    """``body[key]`` as a finite float."""
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(f"{key!r} must be a number, got {value!r}.", param=key)
    # JSON bodies may carry NaN/Infinity literals (Python's json accepts them); they would poison a whole batch.
    if not math.isfinite(value):
        raise APIError(f"{key!r} must be a finite number, got {value!r}; send a real number.", param=key)
    return float(value)


def get_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    """``body[key]`` as a bool; ``0``/``1`` or strings are refused, not coerced."""
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"{key!r} must be true or false, got {value!r}.", param=key)
    return value


def get_stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    """``stop`` (a string or a list of them) as distinct non-empty strings, in order."""
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if isinstance(items, list) and len(items) > MAX_STOP_STRINGS:
        raise APIError(f"'stop' has {len(items)} strings; this server takes at most {MAX_STOP_STRINGS}.",
                       param="stop")
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise APIError(f"'stop' must be a string or a list of strings, got {stop!r}.", param="stop")
    if any(not s for s in items):
        raise APIError("'stop' strings must be non-empty.", param="stop")
    return tuple(dict.fromkeys(items))


def reject_unsupported(body: Mapping[str, Any]) -> None:
    """Refuse features this server does not implement, instead of returning something subtly different."""
    _check_ignored(body)


def _logit_bias(body: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: ``{"token id": bias}`` with biases in [-100, 100]."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, Mapping):
        raise APIError(f"'logit_bias' must be an object of token id -> bias, got {bias!r}.", param="logit_bias")
    out = []
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise APIError(f"'logit_bias' keys must be token ids, got {key!r}.", param="logit_bias") from None
        if token < 0 or isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise APIError(f"'logit_bias' maps token ids >= 0 to biases in [-100, 100]; got {key!r}: {value!r}.",
                           param="logit_bias")
        out.append((token, float(value)))
    return tuple(sorted(out))


def _check_ignored(body: Mapping[str, Any]) -> None:
    """Fields accepted for compatibility and ignored still get their type checked, as OpenAI does."""
    for key, kind, name in (("user", str, "a string"), ("service_tier", str, "a string"),
                            ("store", bool, "true or false"), ("parallel_tool_calls", bool, "true or false"),
                            ("metadata", Mapping, "an object")):
        value = body.get(key)
        if value is not None and not isinstance(value, kind):
            raise APIError(f"{key!r} must be {name}, got {value!r} (it is accepted and ignored; omit it).", param=key)


@dataclass(frozen=True)
class Sampling:
    """Sampling fields shared by both endpoints, validated."""

    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    include_stop: bool
    return_token_ids: bool
    tokens_as_ids: bool
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: Structured output's token constraint (set by the endpoint from ``response_format`` / ``guided_json``).
    constraint: Any = None


def _parse_stream(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """``(stream, include_usage, continuous_usage_stats)``; ``stream_options`` only with ``stream: true``."""
    stream = get_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise APIError("'stream_options' is only valid with 'stream': true; drop it or set stream.",
                       param="stream_options")
    if not isinstance(options, Mapping):
        raise APIError(f"'stream_options' must be an object like {{'include_usage': true}}, got {options!r}.",
                       param="stream_options")
    allowed = ("include_usage", "continuous_usage_stats")
    for key in options:
        if key not in allowed:
            raise APIError(f"Unrecognized stream option {key!r}.{did_you_mean(str(key), allowed)} Supported: "
                           f"{', '.join(allowed)}.", param="stream_options")
    return stream, get_bool(options, "include_usage", False), get_bool(options, "continuous_usage_stats", False)


def parse_sampling(body: Mapping[str, Any], *, max_tokens_key: str = "max_tokens",
                    default_max_tokens: int | None) -> Sampling:
    """The sampling fields of a completions or chat request, validated."""
    max_tokens = get_int(body, max_tokens_key, default_max_tokens, minimum=1)
    temperature = get_float(body, "temperature", 1.0)
    if temperature < 0:
        raise APIError(f"'temperature' must be >= 0 (0 = greedy), got {temperature}.", param="temperature")
    top_p = get_float(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise APIError(f"'top_p' must be in (0, 1], got {top_p}.", param="top_p")
    seed = get_int(body, "seed", None)
    n = get_int(body, "n", 1, minimum=1)
    stream, include_usage, continuous = _parse_stream(body)
    stop_token_ids = body.get("stop_token_ids") or []
    if isinstance(stop_token_ids, list) and len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise APIError(f"'stop_token_ids' has {len(stop_token_ids)} ids; this server takes at most "
                       f"{MAX_STOP_TOKEN_IDS}.", param="stop_token_ids")
    if not isinstance(stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_token_ids):
        raise APIError(f"'stop_token_ids' must be a list of token ids (integers >= 0), got {stop_token_ids!r}.",
                       param="stop_token_ids")
    top_k = get_int(body, "top_k", -1, minimum=-1)
    min_p = get_float(body, "min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise APIError(f"'min_p' must be in [0, 1], got {min_p}.", param="min_p")
    repetition_penalty = get_float(body, "repetition_penalty", 1.0)
    if repetition_penalty <= 0:
        raise APIError(f"'repetition_penalty' must be > 0, got {repetition_penalty}.", param="repetition_penalty")
    penalties = {key: get_float(body, key, 0.0) for key in ("presence_penalty", "frequency_penalty")}
    for key, value in penalties.items():
        if not -2 <= value <= 2:
            raise APIError(f"{key!r} must be in [-2, 2], got {value}.", param=key)
    min_tokens = get_int(body, "min_tokens", 0, minimum=0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise APIError(f"'min_tokens' ({min_tokens}) must be <= {max_tokens_key!r} ({max_tokens}).",
                       param="min_tokens")
    return Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=get_stop(body), seed=seed,
        include_stop=get_bool(body, "include_stop_str_in_output", False),
        return_token_ids=get_bool(body, "return_token_ids", False),
        tokens_as_ids=get_bool(body, "return_tokens_as_token_ids", False),
        n=n, stream=stream, include_usage=include_usage, continuous_usage=continuous,
        stop_token_ids=tuple(dict.fromkeys(stop_token_ids)), ignore_eos=get_bool(body, "ignore_eos", False),
        skip_special_tokens=get_bool(body, "skip_special_tokens", True),
        top_k=max(top_k, 0), min_p=min_p, repetition_penalty=repetition_penalty, min_tokens=min_tokens,
        logit_bias=_logit_bias(body), **penalties,
    )


def _message_text(content: Any, index: int, vision: bool = False) -> str | list[dict[str, Any]] | None:
    """Flatten OpenAI content (a string or a list of text parts, joined with newlines as vLLM joins them) to the
    string chat templates expect; for a vision
    model, content with ``image_url`` parts (data URIs) becomes agentgym content parts (text and
    ``{"type": "image", "image": ImageRef}``), which its processor's template renders."""
    if content is None or isinstance(content, str):
        return content
    if vision and isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") == "image_url"
                                                    for p in content):
        return _vision_parts(content, index)
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image_url":
                raise APIError(f"messages[{index}].content has an image, but this server's model reads text only; "
                               "serve a vision-language model (a directory with its processor) or send text.",
                               param=f"messages[{index}].content", code="images_unsupported")
        try:
            return joined_text(content, f"messages[{index}].content")
        except MessageError as exc:
            raise APIError(str(exc), param=f"messages[{index}].content") from exc
    raise APIError(f"messages[{index}].content must be a string or a list of text parts, got {content!r}.",
                   param=f"messages[{index}].content")


def _vision_parts(content: list[Any], index: int) -> list[dict[str, Any]]:
    """Text and image parts of one message for a vision model; images must be inline data URIs."""
    from agentgym.utils.images import ImageRef

    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            try:
                parts.append({"type": "image", "image": ImageRef.from_data_uri(str(url))})
            except AgentGymError as exc:
                raise APIError(f"messages[{index}].content[{j}]: {exc}", param=f"messages[{index}].content") from exc
        else:
            raise APIError(f"messages[{index}].content[{j}]: only text and image_url parts are supported, got "
                           f"{kind!r}.", param=f"messages[{index}].content")
    return parts


def parse_messages(body: Mapping[str, Any], vision: bool = False, chat_template: Any = None) -> list[dict[str, Any]]:
    """A chat request's ``messages`` ready for ``chat_template``: content flattened (see :func:`_message_text`),
    then normalised as vLLM does (tool-call arguments as objects, ``developer`` kept only where the template
    knows it; :func:`agentgym.policies.chat_messages.normalize_messages`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list of {'role', 'content'} objects.", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise APIError(f"messages[{i}] must be an object with 'role' and 'content', got {msg!r}.",
                           param=f"messages[{i}]")
        role = msg.get("role")
        if role not in _ROLES:
            raise APIError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}."
                f"{did_you_mean(str(role), _ROLES)}", param=f"messages[{i}].role",
            )
        clean = dict(msg)
        clean["content"] = _message_text(msg.get("content"), i, vision)
        if msg.get("tool_calls") is not None and not isinstance(msg.get("tool_calls"), list):
            raise APIError(f"messages[{i}].tool_calls must be a list of function calls, got {msg['tool_calls']!r}.",
                           param=f"messages[{i}].tool_calls")
        if clean["content"] is None and not msg.get("tool_calls"):
            raise APIError(f"messages[{i}].content is missing.", param=f"messages[{i}].content")
        out.append(clean)
    try:
        return normalize_messages(out, chat_template)
    except MessageError as exc:
        raise APIError(str(exc), param=exc.param) from exc


def parse_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """``tools`` as the chat template receives them, checked for the OpenAI function shape."""
    tools = body.get("tools")
    if tools is None:
        return None
    shape = "a list of {'type': 'function', 'function': {'name': ..., 'parameters': {...}}} objects"
    if not isinstance(tools, list):
        raise APIError(f"'tools' must be {shape}.", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (not isinstance(tool, Mapping) or tool.get("type", "function") != "function"
                or not isinstance(function, Mapping) or not isinstance(function.get("name"), str)
                or not function["name"]):
            raise APIError(f"tools[{i}] is not a function tool; 'tools' must be {shape}.", param=f"tools[{i}]")
    return [dict(t) for t in tools]


#: ``parse_json_format``'s answer for ``json_object``: any JSON object.
ANY_JSON_OBJECT = "json_object"


def parse_json_format(body: Mapping[str, Any]) -> Mapping[str, Any] | str | None:
    """The JSON schema structured output asks for: from ``response_format`` (``{"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}}}``, or ``{"type": "json_object"}``: :data:`ANY_JSON_OBJECT`)
    or vLLM's ``guided_json`` (a schema, or its JSON text); ``None`` for free text."""
    fmt = body.get("response_format")
    guided = body.get("guided_json")
    shapes = ("{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {'name': ..., "
              "'schema': {...}}}")
    if fmt is not None and guided is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise APIError("Send either 'response_format' or 'guided_json', not both.", param="guided_json")
    if guided is not None:
        if isinstance(guided, str):
            try:
                guided = json.loads(guided)
            except json.JSONDecodeError as exc:
                raise APIError(f"'guided_json' is a string but not JSON: {exc}.", param="guided_json") from exc
        if not isinstance(guided, Mapping):
            raise APIError(f"'guided_json' must be a JSON schema (an object), got {guided!r}.", param="guided_json")
        return guided
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_JSON_OBJECT
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise APIError("'response_format.json_schema.schema' must be a JSON schema (an object); send "
                           f"{shapes}.", param="response_format")
        return schema
    raise APIError(f"'response_format' must be {shapes}; got {fmt!r}."
                   f"{did_you_mean(str(kind), ('text', 'json_object', 'json_schema'))}", param="response_format")


def parse_tool_choice(body: Mapping[str, Any], tools: list[dict[str, Any]] | None) -> str:
    """Validate ``tool_choice``; returns ``"none"`` (plain text) or the mode under which calls are parsed."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice == "none":
        return "none"
    named = None
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, Mapping) or not isinstance(
                function.get("name"), str):
            raise APIError("'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                           f"{{'name': ...}}}}, got {choice!r}.", param="tool_choice")
        named = function["name"]
    elif choice not in ("auto", "required"):
        raise APIError(f"'tool_choice' must be 'none', 'auto', 'required' or a named function, got {choice!r}."
                       f"{did_you_mean(str(choice), ('none', 'auto', 'required'))}", param="tool_choice")
    if not tools:
        raise APIError(f"'tool_choice' {choice!r} needs 'tools': send the tools the model may call, or drop "
                       "tool_choice.", param="tool_choice")
    if named is not None:
        names = [t["function"]["name"] for t in tools]
        if named not in names:
            raise APIError(f"'tool_choice' names the function {named!r}, which is not in 'tools' "
                           f"({', '.join(names)}).{did_you_mean(named, names)} Name one of the tools.",
                           param="tool_choice")
        return "named"
    return str(choice)


# ---- the wire ------------------------------------------------------------------------------------------


async def json_body(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object; anything else is a 400 ``invalid_json``."""
    try:
        body = await request.json()
    except Exception as exc:
        raise APIError(f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise APIError(f"The request body must be a JSON object, got {type(body).__name__}.", code="invalid_json")
    return body


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as compact JSON (NaN is refused: no client parses it)."""
    return "data: " + json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n\n"


#: The event that ends an OpenAI stream.
SSE_DONE = "data: [DONE]\n\n"
