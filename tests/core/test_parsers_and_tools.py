"""Property tests for the tool-call parsers and the tool API: model text and model calls never crash them."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.errors import ToolError
from agentgym.parsers import (
    BareNameParser,
    CodeBlockParser,
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    ParsedAction,
    TagParser,
    literal_value,
)
from agentgym.toolset import Tool, ToolCall, ToolResult, ToolSet, tool

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
python_literals = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner),
    max_leaves=6,
)

PARSERS = [
    HermesParser(),
    CodeBlockParser(),
    TagParser({"answer": ("answer", "value"), "search": ("search", "query")}),
    FunctionCallParser(["calc", "answer", "click"], {"calc": "expression"}),
    BareNameParser(["turn_left", "forward", "done"]),
    CompositeParser([HermesParser(), FunctionCallParser(["calc", "answer"], {"calc": "expression"})]),
]

# Text built from the characters that parsers treat specially, so collisions are common.
tricky_text = st.lists(
    st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', "'", "(", ")", "\\", "```",
                     "```python\n", "<answer>", "</answer>", "calc(", "answer(", ",", ":", "name", "arguments",
                     "1", "-", "\n", " ", "\x00", "é"]),
    max_size=40,
).map("".join)


# ---- parsers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: type(p).__name__)
@FAST
@given(text=st.text() | tricky_text)
def test_parsers_never_raise(parser: Any, text: str) -> None:
    result = parser.parse(text)
    assert isinstance(result, ParsedAction)
    assert all(isinstance(c, ToolCall) for c in result.calls)
    assert all(isinstance(e, str) for e in result.errors)


@FAST
@given(name=st.text(min_size=1, max_size=30), arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
       prefix=st.text(max_size=20), suffix=st.text(max_size=20))
def test_hermes_round_trip(name: str, arguments: dict[str, Any], prefix: str, suffix: str) -> None:
    body = json.dumps({"name": name, "arguments": arguments})
    # A literal "</tool_call>" inside a JSON string would end the block early: a known format limit.
    if any("<tool_call>" in part or "</tool_call>" in part for part in (body, prefix, suffix)):
        return
    result = HermesParser().parse(f"{prefix}<tool_call>{body}</tool_call>{suffix}")
    assert result.errors == ()
    assert len(result.calls) == 1
    call = result.calls[0]
    assert (call.name, call.arguments, call.format) == (name, arguments, "hermes")


def test_hermes_reports_malformed_blocks() -> None:
    for text in ["<tool_call>{</tool_call>", "<tool_call>[]</tool_call>", '<tool_call>{"name": 5}</tool_call>',
                 '<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "<tool_call>{"]:
        result = HermesParser().parse(text)
        assert result.calls == () and result.errors, text


@pytest.mark.parametrize("text", ["<tool_call>" + "[" * 5000 + "</tool_call>",
                                  '<tool_call>{"name": "x", "arguments": {"a": ' + "9" * 5000 + "}}</tool_call>"],
                         ids=["deep-nesting", "huge-int"])
def test_hermes_survives_deep_nesting_and_huge_ints(text: str) -> None:
    result = HermesParser().parse(text)
    assert result.calls == () and result.errors


@FAST
@given(code=st.text().filter(lambda s: "```" not in s), prefix=st.text(max_size=20).filter(lambda s: "```" not in s),
       lang=st.sampled_from(["python", "py"]))
def test_code_block_extraction(code: str, prefix: str, lang: str) -> None:
    # The closing fence sits on its own line, as models write it (code may then end in a backtick).
    result = CodeBlockParser().parse(f"{prefix}```{lang}\n{code}\n```")
    assert [(c.name, dict(c.arguments)) for c in result.calls] == [("python", {"code": code + "\n"})]
    assert result.errors == ()
    unclosed = CodeBlockParser().parse(f"```{lang}\n{code}")
    assert unclosed.calls == () and unclosed.errors


@FAST
@given(value=python_literals, name=st.sampled_from(["click", "answer"]), keyword=st.booleans())
def test_function_call_literals_round_trip(value: Any, name: str, keyword: bool) -> None:
    text = f"{name}(x={value!r})" if keyword else f"{name}({value!r})"
    result = FunctionCallParser(["click", "answer"]).parse(f"I will call {text} now")
    assert result.errors == ()
    assert len(result.calls) == 1
    call = result.calls[0]
    if keyword:
        assert call.args == () and dict(call.arguments) == {"x": value}
    else:
        assert call.args == (value,) and dict(call.arguments) == {}


LITERAL_CASES = [
    "42", "-7", "+3", "1.5", "-2.5e3", "1+2j", "-1-2j", "3j", "'a'", '"b\\n"', "b'x'", "None", "True", "...",
    "(1, 'a', [2, {3: 4}])", "[]", "()", "{}", "{1, 2}", "set()", "{'k': [1.0, -2]}", "-(1)", "--1", "-True",
    "1+2", "2j+1", "x", "f(1)", "set(1)", "[1, y]", "{**d}", "1 if 2 else 3", "-'a'", "(1+2j)+3j", "not 1",
]


@pytest.mark.parametrize("source", LITERAL_CASES)
def test_literal_value_gives_what_ast_literal_eval_gives(source: str) -> None:
    import ast

    node = ast.parse(source, mode="eval").body
    try:
        expected: Any = ast.literal_eval(source)
    except ValueError as exc:
        with pytest.raises(ValueError) as caught:
            literal_value(node)
        def where(message: str) -> str:
            return re.sub(r" at 0x[0-9a-f]+", "", message)

        assert where(str(caught.value)) == where(str(exc))
        return
    value = literal_value(node)
    assert value == expected and type(value) is type(expected)


@FAST
@given(value=python_literals)
def test_literal_value_agrees_with_ast_literal_eval_on_any_literal(value: Any) -> None:
    import ast

    source = repr(value)
    assert literal_value(ast.parse(source, mode="eval").body) == ast.literal_eval(source)


def test_parsing_a_call_leaves_no_garbage_for_the_cycle_collector() -> None:
    """Each parsed argument used to leave ``ast.literal_eval``'s four self-referring closures behind: with
    hundreds of episodes in flight, every collection of the rollout engine scanned them."""
    import gc

    parser = FunctionCallParser(["answer"])
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for i in range(200):
            assert parser.parse(f"answer({i}, x=[1, 'two', {{3: 4.5}}])").errors == ()
        assert gc.collect() == 0
        assert len(gc.get_objects()) - before < 50
    finally:
        gc.enable()


def test_function_call_raw_passthrough_and_composite_nesting() -> None:
    parser = FunctionCallParser(["calc", "answer"], {"calc": "expression"})
    (call,) = parser.parse("calc(27*42)").calls
    assert dict(call.arguments) == {"expression": "27*42"}
    assert parser.parse("answer(x y)").errors  # not a literal, and answer has no raw passthrough
    composite = CompositeParser([HermesParser(), parser])
    nested = '<tool_call>{"name": "calc", "arguments": {"expression": "answer(3)"}}</tool_call> then answer(4)'
    calls = composite.parse(nested).calls
    assert [(c.name, c.format) for c in calls] == [("calc", "hermes"), ("answer", "function")]


def test_bare_name_parser_reads_only_a_whole_reply_that_is_a_name() -> None:
    parser = CompositeParser([HermesParser(), FunctionCallParser(["turn_left", "forward"]),
                              BareNameParser(["turn_left", "forward"])])
    for reply in ("turn_left", "turn left", "  Turn_Left.\n", "FORWARD", "<think>which way?</think>forward"):
        (call,) = parser.parse(reply).calls
        assert call.arguments == {} and call.name in {"turn_left", "forward"}, reply
    assert [c.format for c in parser.parse("forward()").calls] == ["function"]  # one call, not two
    for reply in ("I will turn left", "turn_left turn_left", "turn_leftt", "left", "", "forward!", "turn_ left"):
        assert not parser.parse(reply).calls, reply


@FAST
@given(content=st.text().filter(lambda s: "</answer>" not in s))
def test_tag_parser_round_trip(content: str) -> None:
    (call,) = TagParser({"answer": ("answer", "value")}).parse(f"<answer>{content}</answer>").calls
    assert dict(call.arguments) == {"value": content.strip()}


# ---- tools --------------------------------------------------------------------------------------
@tool
def lookup(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast", tags: list[str] | None = None,
           weight: float = 1.0, strict: bool = False) -> str:
    """Look something up in the index.

    Longer explanation that stays out of the schema description.

    Args:
        query: What to search for.
        limit: How many results to return,
            at most 50.
        mode: Search mode.
        tags: Optional filter tags.
        weight: Score weight.
        strict: Exact matching only.

    Returns:
        The results.
    """
    return f"{query}:{limit}:{mode}:{tags}:{weight}:{strict}"


@tool
def explode(x: int) -> str:
    """Always fails, to check that tool exceptions become error results.

    Args:
        x: Ignored.
    """
    raise RuntimeError("kaboom")


TOOLSET = ToolSet([lookup, explode])


def test_tool_schema_from_hints_and_docstring() -> None:
    params = lookup.parameters
    assert lookup.description.startswith("Look something up in the index.")
    assert params["required"] == ["query"] and params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "What to search for."}
    assert props["limit"] == {"type": "integer", "description": "How many results to return, at most 50.", "default": 5}
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert props["weight"]["type"] == "number" and props["strict"]["type"] == "boolean"
    assert lookup.schema()["type"] == "function" and lookup.parameter_names[0] == "query"


def test_tool_on_methods_binds_instance() -> None:
    counter = _Counter()
    assert "self" not in counter.bump.parameters["properties"]
    assert ToolSet([counter.bump]).call(ToolCall("bump", {"by": 3})).content == "3" and counter.n == 3


def test_a_dropped_env_is_freed_at_once_not_by_the_cycle_collector() -> None:
    """A bound tool holds its env weakly: bound strongly, every env was a reference cycle (env -> tool set -> tool
    -> method -> env), so a dropped env and all it held waited for the cycle collector."""
    import gc
    import weakref

    import gymnasium as gym

    import agentgym  # noqa: F401

    gc.disable()
    try:
        for env_id in ("agentgym/GuessNumber-v0", "agentgym/Calculator-v0", "agentgym/Sokoban-v0"):
            env = gym.make(env_id)
            env.reset(seed=0)
            env.step("garbage")
            env.close()
            alive = weakref.ref(env.unwrapped)
            del env
            assert alive() is None, f"{env_id}: the env outlived its last reference"
    finally:
        gc.enable()


def test_a_weakly_bound_tool_follows_its_env_into_deep_copies_and_says_when_its_env_is_gone() -> None:
    import copy

    counter = _Counter()
    bound = counter.bump
    assert bound.fn.__self__ is counter and bound == counter.bump and hash(bound.fn) == hash(counter.bump.fn)
    clone = copy.deepcopy(counter)  # what AgentEnv.fork does
    clone.tools.call(ToolCall("bump", {"by": 2}))
    assert (clone.n, counter.n) == (2, 0)  # the copy's tool acts on the copy, not on the original
    orphan = _Counter().bump
    with pytest.raises(ToolError, match="keep a reference to the env"):
        orphan(by=1)


class _Counter:
    """A tool on a method: a module-level class, so deep copies of its instances can be checked too."""

    def __init__(self) -> None:
        self.n = 0
        self.tools = ToolSet([self.bump])

    @tool
    def bump(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: Amount.
        """
        self.n += by
        return str(self.n)


def test_tool_declaration_errors() -> None:
    with pytest.raises(ToolError, match="\\*args"):
        tool(lambda *args: None)
    with pytest.raises(ToolError, match="name"):
        Tool(name="bad name", description="", parameters={"type": "object"}, fn=lambda: None)


@FAST
@given(
    name=st.sampled_from(["lookup", "explode", "lookpu", "", "LOOKUP"]) | st.text(max_size=12),
    arguments=st.dictionaries(st.sampled_from(["query", "limit", "mode", "x", "extra"]) | st.text(max_size=6),
                              json_values, max_size=4),
    args=st.lists(json_values, max_size=4).map(tuple),
)
def test_toolset_never_raises(name: str, arguments: dict[str, Any], args: tuple[Any, ...]) -> None:
    result = TOOLSET.call(ToolCall(name=name, arguments=arguments, args=args))
    assert isinstance(result, ToolResult) and isinstance(result.content, str)
    if name not in TOOLSET or name == "explode":
        assert result.is_error


def test_toolset_errors_say_the_fix() -> None:
    unknown = TOOLSET.call(ToolCall("lookpu", {"query": "x"}))
    assert unknown.is_error and "Did you mean 'lookup'" in unknown.content
    wrong_type = TOOLSET.call(ToolCall("lookup", {"query": "x", "limit": "many"}))
    assert wrong_type.is_error and "limit" in wrong_type.content and "integer" in wrong_type.content
    missing = TOOLSET.call(ToolCall("lookup", {}))
    assert missing.is_error and "query" in missing.content
    extra = TOOLSET.call(ToolCall("lookup", {"query": "x", "colour": 1}))
    assert extra.is_error and "colour" in extra.content
    bad_enum = TOOLSET.call(ToolCall("lookup", {"query": "x", "mode": "slow"}))
    assert bad_enum.is_error and "mode" in bad_enum.content
    twice = TOOLSET.call(ToolCall("lookup", {"query": "x"}, args=("y",)))
    assert twice.is_error and "query" in twice.content
    crash = TOOLSET.call(ToolCall("explode", {"x": 1}))
    assert crash.is_error and "kaboom" in crash.content
    ok = TOOLSET.call(ToolCall("lookup", {"limit": 2}, args=("cats",)))
    assert not ok.is_error and ok.content == "cats:2:fast:None:1.0:False"
