"""Tool-call parsers: read tool calls out of a model's raw text.

Four formats cover what agents emit in practice:

* Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (every env accepts it),
* fenced code blocks (```` ```python ... ``` ````) for code interpreters,
* simple tags (``<answer>42</answer>``, ``<search>query</search>``),
* function-call strings (``click("e12")``, ``answer(1134)``).

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
from typing import Protocol

from agentgym.toolset import ToolCall

__all__ = [
    "CodeBlockParser",
    "CompositeParser",
    "FunctionCallParser",
    "HermesParser",
    "ParsedAction",
    "TagParser",
    "ToolCallParser",
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


class HermesParser:
    """Parse ``<tool_call>{json}</tool_call>`` blocks (Hermes / Qwen / vLLM ``hermes`` tool parser)."""

    def parse(self, text: str) -> ParsedAction:
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
            arguments = payload.get("arguments", payload.get("parameters", {}))
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except (ValueError, RecursionError):
                    errors.append(f"The arguments of tool {payload['name']!r} must be a JSON object.")
                    continue
            if not isinstance(arguments, dict):
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
                value = ast.literal_eval(stripped)
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
                node = ast.parse(f"_f({inner})", mode="eval").body
                if not isinstance(node, ast.Call):
                    raise ValueError("not a call")
                args = tuple(ast.literal_eval(a) for a in node.args)
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
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


class CompositeParser:
    """Run several parsers and merge their calls in the order they appear in the text."""

    def __init__(self, parsers: Sequence[ToolCallParser]) -> None:
        if not parsers:
            raise ValueError("CompositeParser needs at least one parser.")
        self.parsers = list(parsers)

    def parse(self, text: str) -> ParsedAction:
        found: list[tuple[int, ToolCall]] = []
        errors: list[str] = []
        covered: list[tuple[int, int]] = []
        for parser in self.parsers:
            result = parser.parse(text)
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
