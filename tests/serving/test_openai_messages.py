"""Chat history as the model wrote it: a tool loop driven by the `openai` SDK against `agentgym serve` renders each
later prompt so that it begins with the earlier prompt and the very ids the model generated; the `developer` role;
`GET /v1/models/{id}`."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("transformers")

from agentgym.policies.chat_messages import MessageError, normalize_messages, wire_messages  # noqa: E402
from tests.serving.test_openai_clients import CALC_TOOL, Scripted  # noqa: E402

#: Qwen2.5-Instruct's chat template (tool part as published): tool-call arguments are rendered with ``tojson``, so
#: they must reach it as objects; it has no branch for ``developer``, which it would drop without a word.
QWEN25_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}{%- endif %}{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture()
def qwen_tools_tokenizer() -> Any:
    from tests.helpers.chat_families import FAMILIES, build_tokenizer

    tok = build_tokenizer(next(f for f in FAMILIES if f.name == "qwen2.5"))
    tok.chat_template = QWEN25_TOOLS_TEMPLATE
    return tok


def _calls_then_answer(prompt: str) -> str:
    """Two tool calls, one per turn, then the answer (a scripted stand-in for the model)."""
    responses = prompt.count("<tool_response>")
    if responses == 0:
        return 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12+30"}}\n</tool_call>'
    if responses == 1:
        return '<tool_call>\n{"name": "calc", "arguments": {"expression": "42*2", "note": "x\\"y"}}\n</tool_call>'
    return "The answer is 84."


def _server(policy: Any) -> Any:
    from agentgym.serving.openai_server import ServerThread

    return ServerThread(policy, model_name="scripted", batch_window_s=0.01)


def test_tool_loop_prompts_continue_the_ids_the_model_produced(qwen_tools_tokenizer: Any) -> None:
    """Each later prompt starts with the earlier prompt followed by exactly the ids the model generated: the SDK
    sends tool-call arguments back as JSON strings, and the server renders them as the objects the model wrote."""
    policy = Scripted(qwen_tools_tokenizer, _calls_then_answer)
    with _server(policy) as srv, openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0) as c:
        messages: list[Any] = [{"role": "user", "content": "What is (12 + 30) * 2?"}]
        turns = []
        for expected in ("12+30", "42*2", None):
            reply = c.chat.completions.create(model="scripted", messages=messages, tools=[CALC_TOOL],
                                              extra_body={"return_token_ids": True})
            raw = reply.model_dump()
            turns.append((raw["prompt_token_ids"], raw["choices"][0]["token_ids"]))
            message = reply.choices[0].message
            if expected is None:
                assert message.content == "The answer is 84." and not message.tool_calls
                break
            (call,) = message.tool_calls
            assert isinstance(call.function.arguments, str)  # the OpenAI wire format
            assert json.loads(call.function.arguments)["expression"] == expected
            messages.append(message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expected))})
    assert len(turns) == 3
    for (prompt, generated), (next_prompt, _) in zip(turns, turns[1:]):
        history = prompt + generated
        assert next_prompt[:len(history)] == history, (
            qwen_tools_tokenizer.decode(history), qwen_tools_tokenizer.decode(next_prompt[:len(history)]))
    assert '"arguments": {"expression": "42*2", "note": "x\\"y"}' in policy.prompts[-1]


def test_normalize_messages_follows_vllm() -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
            {"id": "c", "type": "function", "function": {"name": "h", "arguments": "{not json"}},
            {"id": "d", "type": "function", "function": {"name": "k", "arguments": "[1, 2]"}}]},
        {"role": "tool", "tool_call_id": "a",
         "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}]},
    ]
    out = normalize_messages(messages)
    assert out[0] == {"role": "system", "content": "Be\nbrief."}  # vLLM joins text parts with newlines
    assert "tool_calls" not in out[1]  # an empty list takes the template's plain-assistant path
    assert [c["function"]["arguments"] for c in out[2]["tool_calls"]] == [{"x": 1}, {}, {}, {}]
    assert out[3]["content"] == "1\n2"
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # the input is not changed
    # A template that names the role gets it unchanged, as from vLLM.
    assert normalize_messages(messages[:1], "{% if m.role == 'developer' %}")[0]["role"] == "developer"
    with pytest.raises(MessageError, match=r"tool_calls\[0\]"):
        normalize_messages([{"role": "assistant", "tool_calls": [{"type": "code", "code": {}}]}])
    # Sending: objects become JSON strings again (OpenAI refuses objects there).
    wired = wire_messages([{"role": "assistant", "tool_calls": [out[2]["tool_calls"][0]]}])
    assert wired[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'


def test_developer_role_renders_as_system_where_the_template_lacks_it(qwen_tools_tokenizer: Any) -> None:
    policy = Scripted(qwen_tools_tokenizer, lambda _: "ok")
    with _server(policy) as srv, openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0) as c:
        reply = c.chat.completions.create(model="scripted", messages=[
            {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == "ok"
        assert "<|im_start|>system\nAnswer in French.<|im_end|>" in policy.prompts[-1]
        with pytest.raises(openai.BadRequestError, match=r"tool_calls"):
            c.chat.completions.create(model="scripted", messages=[
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "tool_calls": "calc"}])


def test_models_retrieve_and_unknown_id(qwen_tools_tokenizer: Any) -> None:
    policy = Scripted(qwen_tools_tokenizer, lambda _: "ok")
    with _server(policy) as srv, openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0) as c:
        model = c.models.retrieve("scripted")
        assert model.id == "scripted" and model.object == "model"
        assert [m.id for m in c.models.list()] == ["scripted"]
        with pytest.raises(openai.NotFoundError) as info:
            c.models.retrieve("gpt-4o")
        assert info.value.body["code"] == "model_not_found" and "scripted" in info.value.body["message"]
        raw = httpx.get(srv.base_url + "/models/org/name", timeout=30)
        assert raw.status_code == 404 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_policy_renders_tool_history_as_the_server_does(qwen_tools_tokenizer: Any) -> None:
    """OpenAIPolicy (chat mode, with the model's tokenizer) compares the server's prompt ids with its own rendering:
    an OpenAI-format history (argument strings) renders the same on both sides."""
    from agentgym.policies.base import GenerationRequest, SamplingParams
    from agentgym.policies.openai import OpenAIPolicy

    policy = Scripted(qwen_tools_tokenizer, lambda _: "done")
    history = (
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "calc", "arguments": '{"expression": "12+30"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    )
    with _server(policy) as srv:
        client = OpenAIPolicy(srv.base_url, model="scripted", mode="chat", tokenizer=qwen_tools_tokenizer)
        try:
            (gen,) = asyncio.run(client.act([GenerationRequest(messages=history,
                                                               sampling=SamplingParams(max_tokens=16))]))
        finally:
            client.close()
    assert gen.text == "done" and gen.token_ids is not None
    assert client.stats["prompt_checked"] == 1 and client.stats["prompt_mismatches"] == 0
    assert '"arguments": {"expression": "12+30"}' in policy.prompts[-1]
