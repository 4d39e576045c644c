"""Tool-call parsers: read tool calls out of a model's raw text.

Four formats cover what agents emit in practice:

* each chat family's native tool-call syntax (every env accepts all of them, through :class:`HermesParser`):
  Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, Llama 3.1/3.2 JSON
  (``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several joined by ``;``) and
  Mistral (``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` and ``[TOOL_CALLS]name[ARGS]{...}``),
* fenced code blocks (```` ```python ... ``` ````) for code interpreters,
* simple tags (``<answer>42</answer>``, ``<search>query</search>``),
* function-call strings (``click("e12")``, ``answer(1134)``).

Reasoning blocks (``<think>...</think>`` of Qwen3 / DeepSeek-R1) are blanked by :func:`strip_reasoning`
before any parser looks at the text (in :class:`CompositeParser` and :class:`HermesParser`), so a call or
an answer written while thinking never runs: only what the model says after its thought counts.

A parser never raises on model text: it returns a :class:`ParsedAction` whose ``errors`` say what was
malformed, so the env can turn them into an ``invalid`` turn with an observation that tells the model the
fix.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentgym.toolset import ToolCall
from agentgym.utils.untrusted_ast import parse_untrusted

__all__ = [
    "BareNameParser",
    "CodeBlockParser",
    "CompositeParser",
    "FunctionCallParser",
    "HermesParser",
    "Llama3Parser",
    "MistralParser",
    "ParsedAction",
    "TagParser",
    "ToolCallParser",
    "strip_reasoning",
]


@dataclass(frozen=True)
class ParsedAction:
    """Calls found in one action, in text order, and the problems met while parsing."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()
    positions: tuple[int, ...] = field(default=(), compare=False)


class ToolCallParser(Protocol):
    """Anything with ``parse(text) -> ParsedAction``."""

    def parse(self, text: str) -> ParsedAction: ...


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_PYTHON_TAG = "<|python_tag|>"
_LLAMA_END_TOKENS = ("<|eom_id|>", "<|eot_id|>")
_MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\]\s*[\w\-]*\s*)?\[ARGS\]")
# The keys a bare JSON reply may have to count as a call; anything else is an ordinary (JSON) answer.
_BARE_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})
_DECODER = json.JSONDecoder()


def _blank(text: str, start: int, stop: int) -> str:
    """Replace text[start:stop] by spaces, so positions of what follows stay valid."""
    return text[:start] + " " * (stop - start) + text[stop:]


def strip_reasoning(text: str) -> tuple[str, tuple[str, ...]]:
    """Blank the reasoning of Qwen3 / DeepSeek-R1 style replies; return (text, errors).

    Rules (positions of the remaining text are kept, reasoning becomes spaces):

    * every ``<think>...</think>`` block is reasoning;
    * a ``</think>`` with no opening tag closes a block the chat template opened in the prompt (Qwen3 and
      DeepSeek-R1 generation prompts end in ``<think>``), so everything before it is reasoning;
    * a ``<think>`` never closed (the reply ran out while thinking) makes the rest of the reply reasoning,
      with an error that tells the model to close the thought before calling a tool.

    A literal ``<think>`` inside a tool argument is read the same way; the tags are reserved.
    """
    if _THINK_OPEN not in text and _THINK_CLOSE not in text:
        return text, ()
    for match in list(_THINK_BLOCK.finditer(text)):
        text = _blank(text, match.start(), match.end())
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        text = _blank(text, 0, close + len(_THINK_CLOSE))
    opened = text.find(_THINK_OPEN)
    if opened >= 0:
        text = _blank(text, opened, len(text))
        return text, (("A <think> block was opened but never closed: end your reasoning with </think> and write "
                       "the tool call after it."),)
    return text, ()


def _arguments_of(payload: dict[str, Any], key_order: Sequence[str] = ("arguments", "parameters")) -> Any:
    """The call's arguments as a dict, decoding a JSON-string form; ``None`` when they are not an object."""
    arguments: Any = {}
    for key in key_order:
        if key in payload:
            arguments = payload[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None
    return arguments if isinstance(arguments, dict) else None


def _json_values(text: str, start: int, separator: str = ";") -> list[tuple[int, int, Any]] | None:
    """JSON values from text[start:] separated by ``separator``, as (start, stop, value); None unless all of it is."""
    values: list[tuple[int, int, Any]] = []
    i, n = start, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return values or None
        try:
            value, stop = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError):
            return None
        values.append((i, stop, value))
        i = stop
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == separator:
            i += 1
        elif i < n:
            return None


def _is_bare_call(value: Any) -> bool:
    """Whether a whole-reply JSON value has exactly the shape of a call (so a JSON answer is not misread)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and bool(value["name"])
        and set(value) <= _BARE_CALL_KEYS
        and (("arguments" in value) != ("parameters" in value))
        and value.get("type", "function") == "function"
        and _arguments_of(value) is not None
    )


def _strip_end_tokens(text: str) -> str:
    text = text.rstrip()
    for token in _LLAMA_END_TOKENS:
        if text.endswith(token):
            text = text[: -len(token)].rstrip()
    return text


def _merge(results: Sequence[ParsedAction]) -> ParsedAction:
    """Merge parsers' results in text order, dropping calls nested inside an earlier parser's call."""
    found: list[tuple[int, ToolCall]] = []
    errors: list[str] = []
    covered: list[tuple[int, int]] = []
    for result in results:
        errors.extend(result.errors)
        positions = result.positions or tuple(range(len(result.calls)))
        for position, call in zip(positions, result.calls):
            # A call nested inside an earlier parser's call (e.g. answer(...) inside a <tool_call>
            # JSON string) is part of that call, not a second one.
            if any(start <= position < stop for start, stop in covered):
                continue
            found.append((position, call))
        covered.extend((p, p + len(c.raw)) for p, c in zip(positions, result.calls))
    found.sort(key=lambda item: item[0])
    return ParsedAction(tuple(c for _, c in found), tuple(errors), tuple(p for p, _ in found))


class Llama3Parser:
    """Parse Llama 3.1 / 3.2 JSON tool calls.

    ``<|python_tag|>{"name": "tool", "parameters": {...}}`` (several joined by ``;``) is always a call
    attempt, so malformed JSON after the tag is an error. Without the tag, only a reply that is *entirely*
    such objects, each with exactly the call keys (``name`` plus ``parameters`` or ``arguments``, optional
    ``"type": "function"``), is a call: any other JSON reply is an answer and is left alone.
    """

    def parse(self, text: str) -> ParsedAction:
        if _PYTHON_TAG in text:
            return self._after_tags(text)
        body = _strip_end_tokens(text)
        first = len(body) - len(body.lstrip())
        if body[first:first + 1] != "{":
            return ParsedAction()
        values = _json_values(body, first)
        if values is None or not all(_is_bare_call(v) for _, _, v in values):
            return ParsedAction()
        calls = tuple(ToolCall(v["name"], _arguments_of(v, ("parameters", "arguments")), raw=body[a:b],
                               format="llama3") for a, b, v in values)
        return ParsedAction(calls, (), tuple(a for a, _, _ in values))

    @staticmethod
    def _after_tags(text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        positions: list[int] = []
        pieces = text.split(_PYTHON_TAG)
        offset = len(pieces[0])
        for piece in pieces[1:]:
            start = offset + len(_PYTHON_TAG)
            offset = start + len(piece)
            body = _strip_end_tokens(piece)
            values = _json_values(body, 0)
            if values is None:
                errors.append('After <|python_tag|> write JSON tool calls like {"name": "tool", "parameters": '
                              "{...}}, separated by ';'.")
                continue
            for a, b, value in values:
                if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                    errors.append('A <|python_tag|> call must be an object like {"name": "tool", "parameters": {...}}.')
                    continue
                arguments = _arguments_of(value, ("parameters", "arguments"))
                if arguments is None:
                    errors.append(f"The parameters of tool {value['name']!r} must be a JSON object.")
                    continue
                calls.append(ToolCall(value["name"], arguments, raw=body[a:b], format="llama3"))
                positions.append(start + a)
        return ParsedAction(tuple(calls), tuple(errors), tuple(positions))


class MistralParser:
    """Parse Mistral tool calls: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers)
    and ``[TOOL_CALLS]name[ARGS]{...}`` (v11+, optionally with ``[CALL_ID]id``).

    When the server decodes with special tokens skipped, ``[TOOL_CALLS]`` disappears; a reply that is
    *entirely* a JSON list of exact call objects is read as the v3 form (any other JSON answer is left alone).
    """

    def parse(self, text: str) -> ParsedAction:
        if _MISTRAL_TAG not in text:
            return self._bare_list(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        positions: list[int] = []
        start = text.find(_MISTRAL_TAG)
        while start >= 0:
            after = start + len(_MISTRAL_TAG)
            found, error = self._one(text, start, after)
            calls.extend(found)
            positions.extend([start] * len(found))
            if error:
                errors.append(error)
            start = text.find(_MISTRAL_TAG, after)
        return ParsedAction(tuple(calls), tuple(errors), tuple(positions))

    @staticmethod
    def _bare_list(text: str) -> ParsedAction:
        body = text.strip()
        if not body.startswith("["):
            return ParsedAction()
        values = _json_values(body, 0)
        if not values or len(values) != 1 or not isinstance(values[0][2], list) or not values[0][2]:
            return ParsedAction()
        items = values[0][2]
        if not all(_is_bare_call(item) and "parameters" not in item for item in items):
            return ParsedAction()
        position = text.find("[")
        calls = tuple(ToolCall(i["name"], _arguments_of(i), raw=body, format="mistral") for i in items)
        return ParsedAction(calls, (), (position,) * len(calls))

    @staticmethod
    def _one(text: str, tag: int, after: int) -> tuple[list[ToolCall], str | None]:
        """Calls after one ``[TOOL_CALLS]`` token, or an error that says the expected form."""
        usage = ('[TOOL_CALLS] must be followed by a JSON list like [{"name": "tool", "arguments": {...}}] or by '
                 "name[ARGS]{...}.")
        named = _MISTRAL_NAMED.match(text, after)
        try:
            if named:
                value, stop = _DECODER.raw_decode(text, named.end())
                items: Any = [{"name": named.group(1), "arguments": value}]
            else:
                i = after
                while i < len(text) and text[i].isspace():
                    i += 1
                items, stop = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError):
            return [], usage
        if not isinstance(items, list) or not items:
            return [], usage
        raw = text[tag:stop]
        calls: list[ToolCall] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return calls, usage
            arguments = _arguments_of(item)
            if arguments is None:
                return calls, f"The arguments of tool {item['name']!r} must be a JSON object."
            calls.append(ToolCall(item["name"], arguments, raw=raw, format="mistral"))
        return calls, None


class HermesParser:
    """The parser every env includes: Hermes/Qwen ``<tool_call>{json}</tool_call>`` blocks (vLLM's
    ``hermes`` tool parser) and, with ``native=True`` (the default), the other chat families' native
    syntaxes (:class:`Llama3Parser`, :class:`MistralParser`), so a model is never penalised for calling
    tools the way its own template taught it. Reasoning blocks are stripped first (:func:`strip_reasoning`).
    """

    def __init__(self, native: bool = True) -> None:
        self.native = native
        self._others: tuple[ToolCallParser, ...] = (Llama3Parser(), MistralParser()) if native else ()

    def parse(self, text: str) -> ParsedAction:
        text, reasoning_errors = strip_reasoning(text)
        hermes = self._hermes(text)
        merged = _merge([hermes, *(parser.parse(text) for parser in self._others)])
        if not reasoning_errors:
            return merged
        return ParsedAction(merged.calls, reasoning_errors + merged.errors, merged.positions)

    @staticmethod
    def _hermes(text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        errors: list[str] = []
        positions: list[int] = []
        for match in _HERMES.finditer(text):
            body = match.group(1).strip()
            try:
                payload = json.loads(body)
            except json.JSONDecodeError as exc:
                errors.append(f"<tool_call> content is not valid JSON ({exc.msg} at char {exc.pos}).")
                continue
            except (ValueError, RecursionError):
                # json raises these for >4300-digit integers and for very deep nesting.
                errors.append("<tool_call> JSON is nested too deeply or holds a number that is too long.")
                continue
            if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                errors.append('<tool_call> JSON must be an object like {"name": "tool", "arguments": {...}}.')
                continue
            arguments = _arguments_of(payload)
            if arguments is None:
                errors.append(f"The arguments of tool {payload['name']!r} must be a JSON object.")
                continue
            calls.append(ToolCall(name=payload["name"], arguments=arguments, raw=match.group(0), format="hermes"))
            positions.append(match.start())
        opened, closed = text.count("<tool_call>"), text.count("</tool_call>")
        if opened > closed:
            errors.append("A <tool_call> tag was opened but never closed with </tool_call>.")
        return ParsedAction(tuple(calls), tuple(errors), tuple(positions))


class CodeBlockParser:
    """Parse fenced code blocks into calls of one tool (e.g. ``python(code=...)``)."""

    def __init__(self, tool: str = "python", argument: str = "code", languages: Sequence[str] = ("python", "py")) -> None:
        self.tool = tool
        self.argument = argument
        langs = "|".join(re.escape(lang) for lang in languages)
        self._pattern = re.compile(r"```(?:" + langs + r")[ \t]*\n(.*?)```", re.DOTALL)
        self._opening = re.compile(r"```(?:" + langs + r")[ \t]*\n")

    def parse(self, text: str) -> ParsedAction:
        calls, positions = [], []
        for match in self._pattern.finditer(text):
            calls.append(ToolCall(self.tool, {self.argument: match.group(1)}, raw=match.group(0), format="code"))
            positions.append(match.start())
        errors: tuple[str, ...] = ()
        if len(self._opening.findall(text)) > len(calls):
            errors = ("A code block was opened with ``` but never closed.",)
        return ParsedAction(tuple(calls), errors, tuple(positions))


class TagParser:
    """Parse ``<tag>content</tag>`` into calls ``tool(argument=content)``.

    Args:
        tags: Maps a tag name to ``(tool_name, argument_name)``.
    """

    def __init__(self, tags: Mapping[str, tuple[str, str]]) -> None:
        self.tags = dict(tags)
        names = "|".join(re.escape(t) for t in self.tags)
        self._pattern = re.compile(r"<(" + names + r")>(.*?)</\1>", re.DOTALL)

    def parse(self, text: str) -> ParsedAction:
        calls, positions, errors = [], [], []
        for match in self._pattern.finditer(text):
            tool_name, argument = self.tags[match.group(1)]
            calls.append(ToolCall(tool_name, {argument: match.group(2).strip()}, raw=match.group(0), format="tag"))
            positions.append(match.start())
        for tag in self.tags:
            if text.count(f"<{tag}>") > text.count(f"</{tag}>"):
                errors.append(f"A <{tag}> tag was opened but never closed with </{tag}>.")
        return ParsedAction(tuple(calls), tuple(errors), tuple(positions))


_NUMBER_TYPES = (int, float, complex)


def literal_value(node: ast.AST) -> Any:
    """The value of a literal expression node, as :func:`ast.literal_eval` gives it (same values, same errors).

    Why not ``ast.literal_eval``: on CPython 3.11 every call makes four nested functions that refer to each
    other, garbage only the cycle collector frees; one per argument of every parsed call. With hundreds of
    episodes in flight that garbage made each collection scan thousands more objects.

    Raises:
        ValueError: ``node`` is not a literal (a name, a call other than ``set()``, arithmetic beyond complex
            numbers such as ``1+2j``).
    """
    kind = type(node)
    if kind is ast.Constant:
        return node.value  # type: ignore[attr-defined]
    if kind is ast.Tuple:
        return tuple(literal_value(e) for e in node.elts)  # type: ignore[attr-defined]
    if kind is ast.List:
        return [literal_value(e) for e in node.elts]  # type: ignore[attr-defined]
    if kind is ast.Set:
        return {literal_value(e) for e in node.elts}  # type: ignore[attr-defined]
    if (kind is ast.Call and type(node.func) is ast.Name and node.func.id == "set"  # type: ignore[attr-defined]
            and node.args == node.keywords == []):  # type: ignore[attr-defined]
        return set()
    if kind is ast.Dict:
        if len(node.keys) != len(node.values):  # type: ignore[attr-defined]
            _malformed(node)
        return {literal_value(k): literal_value(v) for k, v in zip(node.keys, node.values)}  # type: ignore[attr-defined,arg-type]
    if kind is ast.BinOp and type(node.op) in (ast.Add, ast.Sub):  # type: ignore[attr-defined]
        left = _signed_number(node.left)  # type: ignore[attr-defined]
        right = _number(node.right)  # type: ignore[attr-defined]
        if isinstance(left, (int, float)) and isinstance(right, complex):
            return left + right if type(node.op) is ast.Add else left - right  # type: ignore[attr-defined]
    return _signed_number(node)


def _number(node: ast.AST) -> Any:
    if type(node) is not ast.Constant or type(node.value) not in _NUMBER_TYPES:  # type: ignore[attr-defined]
        _malformed(node)
    return node.value  # type: ignore[attr-defined]


def _signed_number(node: ast.AST) -> Any:
    if type(node) is ast.UnaryOp and type(node.op) in (ast.UAdd, ast.USub):  # type: ignore[attr-defined]
        operand = _number(node.operand)  # type: ignore[attr-defined]
        return +operand if type(node.op) is ast.UAdd else -operand  # type: ignore[attr-defined]
    return _number(node)


def _malformed(node: ast.AST) -> None:
    line = getattr(node, "lineno", None)
    raise ValueError("malformed node or string" + (f" on line {line}" if line else "") + f": {node!r}")


class FunctionCallParser:
    """Parse function-call strings such as ``click("e12")`` or ``answer(1134)`` for known tool names.

    Arguments must be Python literals. A tool listed in ``raw_argument_tools`` (one string parameter)
    takes the text between the parentheses as that parameter: ``calc(27*42)`` and ``calc(7)`` mean
    ``calc(expression="27*42")`` and ``calc(expression="7")``; a single quoted string is unquoted, so
    ``move("north")`` and ``move(north)`` are the same call.
    """

    def __init__(self, tool_names: Iterable[str], raw_argument_tools: Mapping[str, str] | None = None) -> None:
        self.tool_names = sorted(set(tool_names), key=len, reverse=True)
        self.raw_argument_tools = dict(raw_argument_tools or {})
        names = "|".join(re.escape(n) for n in self.tool_names)
        self._start = re.compile(r"(?<![\w.])(" + names + r")\(") if names else None

    @staticmethod
    def _matching_paren(text: str, open_index: int) -> int:
        """Index of the ')' closing the '(' at open_index, honouring quotes; -1 if unclosed."""
        depth, i, quote = 0, open_index, ""
        while i < len(text):
            ch = text[i]
            if quote:
                if ch == "\\":
                    i += 2
                    continue
                if ch == quote:
                    quote = ""
            elif ch in "\"'":
                quote = ch
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return -1

    @staticmethod
    def _raw_argument(inner: str) -> str:
        stripped = inner.strip()
        if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "\"'":
            try:
                value = literal_value(parse_untrusted(stripped).body)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return stripped
            if isinstance(value, str):
                return value
        return stripped

    def parse(self, text: str) -> ParsedAction:
        if self._start is None:
            return ParsedAction()
        calls, positions, errors = [], [], []
        pos = 0
        while True:
            match = self._start.search(text, pos)
            if match is None:
                break
            name = match.group(1)
            close = self._matching_paren(text, match.end() - 1)
            if close < 0:
                errors.append(f"The call {name}( was never closed with ')'.")
                break
            inner = text[match.end() : close]
            raw = text[match.start() : close + 1]
            pos = close + 1
            if name in self.raw_argument_tools:
                calls.append(ToolCall(name, {self.raw_argument_tools[name]: self._raw_argument(inner)}, raw=raw,
                                      format="function"))
                positions.append(match.start())
                continue
            try:
                node = parse_untrusted(f"_f({inner})").body
                if not isinstance(node, ast.Call):
                    raise ValueError("not a call")
                args = tuple(literal_value(a) for a in node.args)
                kwargs = {k.arg: literal_value(k.value) for k in node.keywords if k.arg is not None}
                if any(k.arg is None for k in node.keywords):
                    raise ValueError("**kwargs are not allowed")
            except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
                errors.append(
                        f"Could not read the arguments of {raw[:200]!r}: arguments must be literals such as "
                    '"text", 42 or [1, 2].'
                )
                continue
            calls.append(ToolCall(name, kwargs, args=args, raw=raw, format="function"))
            positions.append(match.start())
        return ParsedAction(tuple(calls), tuple(errors), tuple(positions))


class BareNameParser:
    """Read a reply that is nothing but one zero-argument tool's name as a call of that tool.

    For envs whose every action is a bare command (BabyAI's ``forward``, BALROG's "turn left"): the reply
    ``turn_left``, ``turn left`` or ``Turn_Left.`` is ``turn_left()``. Only the whole reply counts, so a name
    inside a sentence ("I will turn left now") stays a void turn, as it is in every other env. Why it matters
    for RL: without it the ``()`` after a name is a format token whose only alternative is ending the reply, and
    policy-gradient noise on failed episodes pushes it down until every turn is void (seen in BabyAI training
    runs: the share of void turns rose while success fell); with it, ending the reply after the name is the same action, so that noise changes nothing.
    """

    def __init__(self, tool_names: Iterable[str]) -> None:
        self.tool_names = sorted(set(tool_names))
        self._names = {n.lower(): n for n in self.tool_names}

    def parse(self, text: str) -> ParsedAction:
        stripped = text.strip()
        key = stripped.removesuffix(".").rstrip().lower().replace(" ", "_")  # one closing full stop, as in a sentence
        name = self._names.get(key)
        if name is None:
            return ParsedAction()
        return ParsedAction((ToolCall(name, {}, raw=stripped, format="bare"),), (), (len(text) - len(text.lstrip()),))


class CompositeParser:
    """Run several parsers and merge their calls in the order they appear in the text."""

    def __init__(self, parsers: Sequence[ToolCallParser]) -> None:
        if not parsers:
            raise ValueError("CompositeParser needs at least one parser.")
        self.parsers = list(parsers)

    def parse(self, text: str) -> ParsedAction:
        # Reasoning is stripped here once for every parser (and HermesParser re-checks, which is a no-op).
        text, reasoning_errors = strip_reasoning(text)
        merged = _merge([parser.parse(text) for parser in self.parsers])
        if not reasoning_errors:
            return merged
        errors = reasoning_errors + tuple(e for e in merged.errors if e not in reasoning_errors)
        return ParsedAction(merged.calls, errors, merged.positions)
