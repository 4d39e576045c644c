"""The unified tool API: ``Tool``, the ``@tool`` decorator, ``ToolResult`` and ``ToolSet``.

Every environment exposes its actions as tools with JSON-Schema parameters (the OpenAI function-calling
shape), so one agent prompt and one parser work across families. A :class:`ToolSet` is the only place
that runs a parsed call: it validates the arguments against the schema and turns *every* failure (unknown
tool, bad arguments, an exception inside the tool) into an error :class:`ToolResult`, because a model's
mistake is training data, not a crash.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import types
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import jsonschema

from agentgym.errors import EnvCrashed, ToolError, did_you_mean

__all__ = ["Tool", "ToolCall", "ToolResult", "ToolSet", "tool"]

logger = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from model text.

    Attributes:
        name: The tool's name as the model wrote it (may be unknown; the ToolSet reports that).
        arguments: Keyword arguments.
        args: Positional arguments (function-call syntax only); bound to parameters in schema order.
        raw: The exact text the call was parsed from, for error messages and transcripts.
        format: Which parser produced it: ``hermes``, ``llama3``, ``mistral``, ``code``, ``tag``, ``function`` or ``bare``
            (a reply that was only a zero-argument tool's name).
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()
    raw: str = ""
    format: str = "hermes"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments), "args": list(self.args), "format": self.format}


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns: text for the model, an error flag, an optional image and free metadata."""

    content: str
    is_error: bool = False
    image: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def error(cls, message: str, **metadata: Any) -> ToolResult:
        return cls(content=message[:_MAX_ERROR_CHARS], is_error=True, metadata=metadata)


_PY_TO_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _json_type(annotation: Any) -> dict[str, Any]:
    """Map a Python type hint to a JSON-Schema fragment."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = get_origin(annotation)
    if origin is Literal:
        values = list(get_args(annotation))
        return {"enum": values}
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _json_type(members[0])
        return {"anyOf": [_json_type(m) for m in members]}
    if origin in (list, tuple, set, frozenset, Iterable) or annotation in (list, tuple):
        item_args = get_args(annotation)
        schema: dict[str, Any] = {"type": "array"}
        if item_args and item_args[0] is not Ellipsis:
            schema["items"] = _json_type(item_args[0])
        return schema
    if origin in (dict, Mapping) or annotation is dict:
        return {"type": "object"}
    if annotation in _PY_TO_JSON:
        return {"type": _PY_TO_JSON[annotation]}
    raise ToolError(
        f"Cannot build a JSON schema for type hint {annotation!r}; use str, int, float, bool, list, dict, "
        "Literal[...] or an Optional of those, or pass parameters=... explicitly."
    )


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_SECTION_HEADER = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description})."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    description: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines) and not _ARGS_HEADER.match(lines[i]):
        if _SECTION_HEADER.match(lines[i]):
            break
        description.append(lines[i])
        i += 1
    if i < len(lines) and _ARGS_HEADER.match(lines[i]):
        i += 1
        current: str | None = None
        indent: int | None = None
        while i < len(lines):
            line = lines[i]
            if line.strip() and _SECTION_HEADER.match(line) and (len(line) - len(line.lstrip())) == 0:
                break
            stripped_indent = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(line)
            if match and (indent is None or stripped_indent <= indent):
                indent = stripped_indent
                current = match.group(1)
                params[current] = match.group(3).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
            i += 1
    text = " ".join(line.strip() for line in description).strip()
    return text, params


_VALIDATORS: dict[str, Any] = {}
"""Checked JSON-Schema validators by schema (as canonical JSON): every env instance of a family shares them."""


def _validator_for(name: str, parameters: Mapping[str, Any]) -> Any:
    """The validator of a tool's parameters schema, checked and built once per distinct schema.

    Raises:
        ToolError: the schema is not valid JSON Schema (2020-12).
    """
    key = json.dumps(parameters, sort_keys=True, default=str)
    validator = _VALIDATORS.get(key)
    if validator is None:
        try:
            jsonschema.Draft202012Validator.check_schema(dict(parameters))
        except jsonschema.SchemaError as exc:
            raise ToolError(f"Tool {name!r} has an invalid parameters schema: {exc.message}") from exc
        validator = _VALIDATORS[key] = jsonschema.Draft202012Validator(dict(parameters))
    return validator


class WeakMethod:
    """A function bound to an instance it does not keep alive: what a tool method becomes on its env.

    A bound tool lives in its env's :class:`ToolSet`; bound strongly, every env was a reference cycle (env ->
    tool set -> tool -> method -> env), so a dropped env (closed by a pool, evicted from the idle store, replaced
    after a crash) was not freed when its last reference went but waited, with everything it held, for the cycle
    collector (a full collection once the env was old). A deep copy (``AgentEnv.fork``) rebinds it to the copy; the standard library's
    ``weakref.WeakMethod`` cannot be deep-copied at all (``copy.deepcopy`` raises "cannot pickle").
    """

    __slots__ = ("__func__", "_owner")

    def __init__(self, func: Callable[..., Any], owner: Any) -> None:
        self.__func__ = func
        self._owner = weakref.ref(owner)

    @property
    def __self__(self) -> Any:
        """The instance, as a bound method's ``__self__``; ``None`` once it is gone."""
        return self._owner()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner()
        if owner is None:
            raise ToolError(f"Tool method {self.__func__.__qualname__} was called after its env was garbage-collected; "
                            "keep a reference to the env for as long as you call its tools.")
        return self.__func__(owner, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return WeakMethod, (self.__func__, self._owner())

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, WeakMethod) and self.__func__ is other.__func__
                and self._owner() is other._owner() is not None)

    def __hash__(self) -> int:
        return hash((self.__func__, id(self._owner())))

    def __repr__(self) -> str:
        return f"<tool method {self.__func__.__qualname__} of {self._owner()!r}>"


@dataclass(frozen=True)
class Tool:
    """A callable the agent may invoke, with a name, a description and JSON-Schema parameters.

    Use :func:`tool` to build one from a typed, documented function. Decorating a method works too: the
    tool binds to the instance on attribute access, so ``env.guess`` is a ready-to-call bound tool.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any]
    #: The JSON Schema validator of ``parameters`` (built once per distinct schema, shared by bound copies).
    validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", self.name):
            raise ToolError(
                f"Tool name {self.name!r} is invalid: use 1-64 letters, digits, '_' or '-', starting with a letter."
            )
        # checked once per distinct schema; kept on the tool (and on each bound copy), so a ToolSet built per env
        # instance does not serialise every schema again to find its validator
        object.__setattr__(self, "validator", _validator_for(self.name, self.parameters))

    def __get__(self, obj: Any, objtype: Any = None) -> Tool:
        if obj is None or not callable(getattr(self.fn, "__get__", None)) or isinstance(self.fn, WeakMethod) \
                or inspect.ismethod(self.fn):
            return self
        # A copy with the bound method; the schema was checked when the tool was defined, so binding (once per
        # env instance and tool) skips __post_init__: re-checking it made every gym.make cost milliseconds.
        bound = object.__new__(type(self))  # a shallow copy without copy.copy's reduce protocol (3 -> 1 us)
        values = bound.__dict__
        values.update(self.__dict__)
        if inspect.isfunction(self.fn):  # a plain method: bound without keeping its env alive (see WeakMethod)
            try:
                values["fn"] = WeakMethod(self.fn, obj)
                return bound
            except TypeError:  # an instance that refuses weak references (__slots__ without __weakref__)
                pass
        values["fn"] = self.fn.__get__(obj, objtype)
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def parameter_names(self) -> list[str]:
        """Parameter names in declaration order (positional arguments bind in this order)."""
        return list(self.parameters.get("properties", {}).keys())

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema of this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> Tool:
        """Build a tool whose schema comes from ``fn``'s type hints and Google-style docstring."""
        doc_description, doc_params = _parse_docstring(fn.__doc__ or "")
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # noqa: BLE001 - unresolved forward refs: fall back to raw annotations
            hints = getattr(fn, "__annotations__", {})
        properties: dict[str, Any] = {}
        required: list[str] = []
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name in ("self", "cls"):
            params = params[1:]
        for param in params:
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise ToolError(f"Tool function {fn.__name__!r} may not take *args or **kwargs; name every parameter.")
            prop = _json_type(hints.get(param.name, param.annotation))
            if param.name in doc_params:
                prop["description"] = doc_params[param.name]
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
            elif param.default is not None:
                prop["default"] = param.default
            properties[param.name] = prop
        schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            schema["required"] = required
        return cls(
            name=name or fn.__name__,
            description=description if description is not None else doc_description,
            parameters=schema,
            fn=fn,
        )


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Decorator: turn a typed, documented function (or method) into a :class:`Tool`.

    Example::

        @tool
        def calc(expression: str) -> str:
            '''Evaluate an arithmetic expression.

            Args:
                expression: Digits, + - * / and parentheses.
            '''
    """
    if fn is None:
        return lambda f: Tool.from_function(f, name=name, description=description)
    return Tool.from_function(fn, name=name, description=description)


class ToolSet:
    """A named collection of tools that dispatches parsed calls and never raises on model mistakes."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise ToolError(f"ToolSet takes Tool objects (use @tool), got {type(t).__name__}.")
            if t.name in self._tools:
                raise ToolError(f"Two tools are named {t.name!r}; tool names must be unique in a ToolSet.")
            self._tools[t.name] = t
        self._validators = {n: t.validator for n, t in self._tools.items()}

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolError(f"No tool named {name!r}.{did_you_mean(name, self._tools)}") from None

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of all tools, in declaration order."""
        return [t.schema() for t in self._tools.values()]

    def bind_arguments(self, call: ToolCall) -> dict[str, Any]:
        """Merge positional and keyword arguments of ``call`` into one dict (raises ToolError on conflicts)."""
        t = self[call.name]
        names = t.parameter_names
        if len(call.args) > len(names):
            raise ToolError(
                f"{call.name}() takes {len(names)} argument(s) ({', '.join(names) or 'none'}) but got {len(call.args)}."
            )
        bound = dict(zip(names, call.args))
        for key, value in call.arguments.items():
            if key in bound:
                raise ToolError(f"{call.name}() got argument {key!r} twice.")
            bound[key] = value
        return bound

    def call(self, call: ToolCall) -> ToolResult:
        """Validate and run one call; every failure becomes an error result that tells the model the fix.

        Only :class:`EnvCrashed` propagates: a dead sandbox or browser is not the model's mistake.
        """
        if call.name not in self._tools:
            return ToolResult.error(
                f"Error: unknown tool {call.name!r}.{did_you_mean(call.name, self._tools)} "
                f"Available tools: {', '.join(self._tools)}.",
                kind="unknown_tool",
            )
        try:
            arguments = self.bind_arguments(call)
        except ToolError as exc:
            return ToolResult.error(f"Error: {exc}", kind="bad_arguments")
        errors = sorted(self._validators[call.name].iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            where = ".".join(str(p) for p in first.path) or "arguments"
            signature = ", ".join(self._tools[call.name].parameter_names)
            return ToolResult.error(
                f"Error: invalid arguments for {call.name}({signature}): {where}: {first.message}",
                kind="bad_arguments",
            )
        try:
            out = self._tools[call.name].fn(**arguments)
        except EnvCrashed:
            raise  # infrastructure failure: the env ends the episode with end_reason="error"
        except Exception as exc:
            logger.debug("tool %s raised", call.name, exc_info=True)
            return ToolResult.error(f"Error: {call.name} failed: {type(exc).__name__}: {exc}", kind="tool_exception")
        if isinstance(out, ToolResult):
            return out
        return ToolResult(content="" if out is None else str(out))
