"""Every chat family's native tool-call syntax works in every registered env, and reasoning never runs.

The env test replays each env's reference episode twice: once with every call written in the Hermes form,
once in another family's form (Llama 3.1 JSON, ``<|python_tag|>``, Mistral v3 / v11, Qwen3 / DeepSeek-R1
reasoning around the call). The replay must see the same turn kinds, observations and outcome.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import agentgym
from agentgym.parsers import (
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    Llama3Parser,
    MistralParser,
    strip_reasoning,
)
from agentgym.toolset import ToolCall

Calls = list[tuple[str, dict[str, Any]]]


def _hermes(calls: Calls) -> str:
    return "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)


def _llama_bare(calls: Calls) -> str:
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def _llama_tag(calls: Calls) -> str:
    return "<|python_tag|>" + "; ".join(json.dumps({"name": n, "arguments": a}) for n, a in calls) + "<|eom_id|>"


def _mistral_v3(calls: Calls) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a, "id": f"call{i:05d}"} for i, (n, a) in enumerate(calls)])


def _mistral_v11(calls: Calls) -> str:
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}" for n, a in calls)


def _qwen3_thinking(calls: Calls) -> str:
    # The thought holds a different call in every syntax; none of it may run.
    decoy = [(calls[0][0], {"__thought__": 1})]
    return f"<think>Maybe {_hermes(decoy)} or {_llama_tag(decoy)} or answer(0)?</think>\n\n" + _hermes(calls)


def _deepseek_thinking(calls: Calls) -> str:
    # DeepSeek-R1's template opens <think> in the prompt: the reply only closes it.
    return f"I could write {_mistral_v11([(calls[0][0], {'__thought__': 1})])} but\n</think>\n" + _llama_bare(calls)


FORMATS: dict[str, Callable[[Calls], str]] = {
    "llama3_json": _llama_bare,
    "llama3_python_tag": _llama_tag,
    "mistral_v3": _mistral_v3,
    "mistral_v11": _mistral_v11,
    "qwen3_think_hermes": _qwen3_thinking,
    "deepseek_think_llama3": _deepseek_thinking,
}

# Sandboxes, browsers and repositories: a few steps are enough to prove every format reaches a real tool.
# Envs whose steps cost a browser action, a JVM call or a sandboxed test run replay fewer steps and formats. SWE's
# first step is an edit; its second (submit) would only re-run the same grader in every format.
_HEAVY_STEPS = {"agentgym/SWE-v1": 1, "agentgym/CodeInterpreter-v1": 1, "agentgym/WebShop-v1": 2,
                "agentgym/WebShop-text-v1": 2, "agentgym/MiniWoB-v0": 2, "agentgym/ScienceWorld-v0": 3,
                "agentgym/TextWorld-v0": 3}
_FAST_STEPS = 12


def _text(observation: Any) -> str:
    return observation if isinstance(observation, str) else str(observation["text"])


def _translate(env: Any, action: str, writer: Callable[[Calls], str]) -> str:
    """The same calls as ``action`` (the reference solver's), written by ``writer`` with keyword arguments."""
    unwrapped = env.unwrapped
    parsed = unwrapped.parser.parse(action)
    assert parsed.calls and not parsed.errors, f"reference action is not a clean call: {action!r}"
    calls: Calls = []
    for call in parsed.calls:
        assert call.name in unwrapped.toolset, f"reference call to unknown tool {call.name!r}"
        calls.append((call.name, unwrapped.toolset.bind_arguments(call)))
    return writer(calls)


def _replay(env_id: str, writer: Callable[[Calls], str], steps: int) -> list[tuple[str, str, list[Any], Any]]:
    """Run the reference episode with each action rewritten by ``writer``; (kind, observation, calls, outcome)."""
    env = agentgym.make(env_id)
    try:
        observation, _ = env.reset(seed=0)
        solver = env.unwrapped.reference_solver()
        seen: list[tuple[str, str, list[Any], Any]] = []
        for _ in range(steps):
            action = _translate(env, solver(observation), writer)
            observation, _, terminated, truncated, info = env.step(action)
            turn = info["turn"]
            calls = [(c["name"], c["arguments"]) for c in turn["calls"]]
            seen.append((turn["kind"], _text(observation), calls, info.get("outcome")))
            if terminated or truncated:
                break
        return seen
    finally:
        env.close()


@pytest.mark.parametrize("env_id", agentgym.env_ids())
def test_every_env_accepts_every_family_format(env_id: str) -> None:
    steps = _HEAVY_STEPS.get(env_id, _FAST_STEPS)
    baseline = _replay(env_id, _hermes, steps)
    assert baseline and all(kind in ("tool_call", "answer") for kind, *_ in baseline), baseline
    formats = FORMATS if env_id not in _HEAVY_STEPS else {k: FORMATS[k] for k in ("llama3_json", "mistral_v3",
                                                                                  "mistral_v11",
                                                                                  "qwen3_think_hermes")}
    for name, writer in formats.items():
        replay = _replay(env_id, writer, steps)
        assert [r[0] for r in replay] == [b[0] for b in baseline], f"{name}: turn kinds differ"
        assert [r[2] for r in replay] == [b[2] for b in baseline], f"{name}: parsed calls differ"
        assert [r[1] for r in replay] == [b[1] for b in baseline], f"{name}: observations differ"
        assert replay[-1][3] == baseline[-1][3], f"{name}: outcome differs"


# ---- the parsers themselves ---------------------------------------------------------------------------
def _calls(text: str, parser: Any = None) -> list[tuple[str, dict[str, Any], str]]:
    result = (parser or HermesParser()).parse(text)
    return [(c.name, c.arguments, c.format) for c in result.calls]


@pytest.mark.parametrize("name, writer", list(FORMATS.items()))
def test_each_format_reads_several_calls_in_order(name: str, writer: Callable[[Calls], str]) -> None:
    calls: Calls = [("search", {"query": "a; b"}), ("open", {"doc_id": "d1"})]
    got = [(n, a) for n, a, _ in _calls(writer(calls))]
    assert got == calls, name


def test_llama_parameters_and_arguments_keys_and_end_tokens() -> None:
    assert _calls('{"name": "f", "arguments": {"x": 1}}<|eot_id|>') == [("f", {"x": 1}, "llama3")]
    assert _calls('{"type": "function", "name": "f", "parameters": "{\\"x\\": 2}"}') == [("f", {"x": 2}, "llama3")]


@pytest.mark.parametrize("answer", [
    '{"name": "Ada", "age": 36}',  # an object with a name is not a call unless it has exactly the call keys
    '{"name": "f", "parameters": {}, "note": "extra key"}',
    '{"name": "f", "parameters": {}, "arguments": {}}',
    '{"answer": 42}',
    '[1, 2, 3]',
    '[{"name": "Ada"}]',
    'The call would be {"name": "f", "parameters": {}} but I will not make it.',  # not the whole reply
    '42',
    '',
])
def test_ordinary_answers_are_not_read_as_calls(answer: str) -> None:
    result = HermesParser().parse(answer)
    assert result.calls == () and result.errors == ()


@pytest.mark.parametrize("text, error", [
    ("<|python_tag|>print('hi')", "After <|python_tag|>"),
    ('<|python_tag|>{"name": "f", "parameters": [1]}', "must be a JSON object"),
    ("[TOOL_CALLS]", "[TOOL_CALLS] must be followed"),
    ("[TOOL_CALLS]f[ARGS]{oops", "[TOOL_CALLS] must be followed"),
    ('[TOOL_CALLS][{"name": "f", "arguments": 3}]', "must be a JSON object"),
    ("[TOOL_CALLS]" + "[" * 5000, "[TOOL_CALLS] must be followed"),
    ("<|python_tag|>" + "{" * 5000, "After <|python_tag|>"),
])
def test_malformed_native_calls_say_the_fix(text: str, error: str) -> None:
    result = HermesParser().parse(text)
    assert result.calls == ()
    assert any(error in e for e in result.errors), result.errors


def test_native_formats_can_be_turned_off() -> None:
    assert _calls('{"name": "f", "parameters": {}}', HermesParser(native=False)) == []
    assert _calls("[TOOL_CALLS]f[ARGS]{}", HermesParser(native=False)) == []
    assert _calls("[TOOL_CALLS]f[ARGS]{}", MistralParser()) == [("f", {}, "mistral")]
    assert _calls('{"name": "f", "parameters": {}}', Llama3Parser()) == [("f", {}, "llama3")]


def test_mistral_call_ids_and_bare_list_without_special_tokens() -> None:
    assert _calls('[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"x": 1}') == [("f", {"x": 1}, "mistral")]
    # A server that skips special tokens drops [TOOL_CALLS]; the list alone is still read.
    assert _calls('[{"name": "f", "arguments": {"x": 1}}]') == [("f", {"x": 1}, "mistral")]


def test_reasoning_is_blanked_and_positions_kept() -> None:
    text = "<think>a</think>b<think>c</think>d"
    stripped, errors = strip_reasoning(text)
    assert stripped == " " * 16 + "b" + " " * 16 + "d" and errors == ()
    assert strip_reasoning("thought</think>x") == (" " * 15 + "x", ())
    stripped, errors = strip_reasoning("x<think>never closed")
    assert stripped.strip() == "x" and "never closed" in errors[0]
    assert strip_reasoning(stripped) == (stripped, ())


def test_calls_inside_reasoning_never_run_in_any_parser() -> None:
    parser = CompositeParser([HermesParser(), FunctionCallParser(["answer"])])
    result = parser.parse('<think>answer(1) <tool_call>{"name": "answer", "arguments": {}}</tool_call></think>answer(2)')
    assert [(c.name, c.args) for c in result.calls] == [("answer", (2,))]
    truncated = parser.parse("<think>the answer is answer(3)")
    assert truncated.calls == () and "never closed" in truncated.errors[0]


def test_a_call_nested_in_a_json_argument_is_one_call() -> None:
    parser = CompositeParser([HermesParser(), FunctionCallParser(["answer"])])
    result = parser.parse('{"name": "answer", "parameters": {"text": "answer(5)"}}')
    assert [(c.name, c.arguments) for c in result.calls] == [("answer", {"text": "answer(5)"})]
    assert isinstance(result.calls[0], ToolCall)
