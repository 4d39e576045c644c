"""The recording gateway speaks Anthropic's Messages API: the official ``anthropic`` package is the client (plain
messages, a tool loop, ``client.messages.stream``, ``x-api-key``), every call is recorded token-exactly as the chat
call it converts to, and a tool loop's calls merge into one training sequence whose ids re-render exactly."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.policies.base import Generation, SamplingParams  # noqa: E402
from agentgym.serving.anthropic_messages import to_chat_request  # noqa: E402
from agentgym.serving.gateway import create_gateway_app  # noqa: E402
from agentgym.serving.openai_app import create_app  # noqa: E402
from agentgym.serving.openai_server import ServerThread  # noqa: E402
from agentgym.serving.sessions import read_session, sessions_to_trajectories  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
#: ChatML that renders tools and tool calls the way Hermes-style models sample them (the tiny model's own template
#: drops tool calls, so a tool loop could not be token-exact with it).
TOOL_TEMPLATE = (
    r"{%- if tools -%}{{- '<|im_start|>system\nTools:' -}}{%- for t in tools -%}{{- ' ' ~ t['function']['name'] -}}"
    r"{%- endfor -%}{{- '<|im_end|>\n' -}}{%- endif -%}"
    r"{%- for message in messages -%}{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}"
    r"{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    r"{%- for call in (message['tool_calls'] or []) -%}"
    r"{{- '<tool_call>{\"name\": \"' ~ call['function']['name'] ~ '\", \"arguments\": ' -}}"
    r"{%- if call['function']['arguments'] is string -%}{{- call['function']['arguments'] -}}"
    r"{%- else -%}{{- call['function']['arguments'] | tojson -}}{%- endif -%}{{- '}</tool_call>' -}}"
    r"{%- endfor -%}{{- '<|im_end|>\n' -}}{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
TOOLS = [{"name": "calc", "description": "Evaluate an arithmetic expression.",
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}]
SYSTEM = "You are a careful calculator."
RAW_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
              "message_stop"}


class ToolScript:
    """A scripted model (an allowed stand-in for an LLM): with tools it calls ``calc`` for a question and answers
    from a tool result; without, it says a fixed sentence. It honours ``max_tokens`` (finish ``length``)."""

    name = "tool-script"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply(self, prompt: str) -> str:
        last_role, last = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", prompt, re.S)[-1]
        if last_role == "tool":
            return f"The answer is {last}."
        question = re.search(r"What is (\d+\*\d+)", last)
        if "Tools: calc" in prompt and question:
            return f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{question.group(1)}"}}}}</tool_call>'
        return "Hello there. STOP more"

    def generate(self, prompts: Any, sampling: Any, cancelled: Any = None) -> list[Generation]:
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        out = []
        for prompt, p in zip(prompts, params):
            ids = list(self.tokenizer.encode(self.reply(self.tokenizer.decode(prompt)), add_special_tokens=False))
            finish = "stop"
            if len(ids) + 1 > p.max_tokens:
                ids, finish = ids[: p.max_tokens], "length"
            else:
                ids.append(self.end_id)
            out.append(Generation(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=tuple(ids),
                                  logprobs=tuple(-0.25 for _ in ids), finish_reason=finish))
        return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 20),
                             config=SMALL)
    tok = AutoTokenizer.from_pretrained(str(model))
    tok.chat_template = TOOL_TEMPLATE
    return tok


def _blocks(message: Any) -> list[dict[str, Any]]:
    """A reply's content as the request blocks an agent sends back."""
    out: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "text":
            out.append({"type": "text", "text": block.text})
        elif block.type == "tool_use":
            out.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
    return out


def tool_agent(client: Any, question: str, *, stream: bool, sent: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """An agent written against the ``anthropic`` package: calls tools until the model answers in text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    events: list[str] = []
    for _ in range(4):
        request = dict(model="script", max_tokens=64, system=SYSTEM, tools=TOOLS, messages=list(messages),
                       tool_choice={"type": "auto"}, extra_body={"temperature": 1.0})
        sent.append(json.loads(json.dumps({**request.pop("extra_body"), **request})))
        request["extra_body"] = {"temperature": 1.0}
        if stream:
            with client.messages.stream(**request) as events_in:
                for event in events_in:
                    kind = event.type
                    if kind not in RAW_EVENTS:  # the SDK's own derived events ("text", "input_json")
                        continue
                    if kind == "content_block_delta":
                        kind += ":" + event.delta.type
                    events.append(kind)
                reply = events_in.get_final_message()
        else:
            reply = client.messages.create(**request)
        messages.append({"role": "assistant", "content": _blocks(reply)})
        if reply.stop_reason != "tool_use":
            return "".join(b.text for b in reply.content if b.type == "text"), events
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": str(eval(b.input["expression"]))}
                   for b in reply.content if b.type == "tool_use"]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the model never answered")


def _rendered(tok: Any, request: dict[str, Any]) -> list[int]:
    chat = to_chat_request(request)
    text = tok.apply_chat_template(chat["messages"], tools=chat.get("tools"), tokenize=False,
                                   add_generation_prompt=True)
    return list(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_anthropic_tool_loop_records_one_token_exact_sequence(tokenizer: Any, tmp_path: Path, stream: bool) -> None:
    """tool_use -> tool_result -> answer through the SDK; the two calls are one training sequence, and every
    recorded prompt is the re-rendered request, id for id."""
    record = tmp_path / "rec"
    with ServerThread(ToolScript(tokenizer), model_name="script", record_dir=record) as server:
        gateway = server.app.state.gateway
        sid = gateway.open_session("anth-1")
        root = server.base_url.removesuffix("/v1")
        sent: list[dict[str, Any]] = []
        with anthropic.Anthropic(base_url=f"{root}/s/{sid}/{gateway.token(sid)}", api_key="unused",
                                 max_retries=0) as client:
            answer, events = tool_agent(client, "What is 12*34?", stream=stream, sent=sent)
            assert answer == "The answer is 408."
            ended = httpx.post(f"{root}/s/{sid}/{gateway.token(sid)}/v1/session/reward", json={"reward": 1.0})
            assert ended.json()["ended"]
    if stream:  # the Messages API's event sequence, tool arguments as input_json_delta
        tool_turn = events[:events.index("message_stop") + 1]
        assert tool_turn == ["message_start", "content_block_start", "content_block_delta:input_json_delta",
                             "content_block_stop", "message_delta", "message_stop"]
        assert "content_block_delta:text_delta" in events[len(tool_turn):]
    calls = [r for r in read_session(record / "anth-1.jsonl") if r["type"] == "call"]
    assert len(calls) == 2 and all(c["api"] == "anthropic" and c["ids_source"] == "server" for c in calls)
    assert calls[0]["tool_calls"][0]["function"]["name"] == "calc"
    for call, request in zip(calls, sent):
        assert call["prompt_token_ids"] == _rendered(tokenizer, request)
    recorded = sessions_to_trajectories(record, ["anth-1"])
    assert (recorded.calls, recorded.segments, recorded.mismatches) == (2, 1, 0)
    view = recorded.trajectories[0].token_view()
    assert list(view.input_ids) == calls[1]["prompt_token_ids"] + calls[1]["token_ids"]
    assert [t for t, m in zip(view.input_ids, view.loss_mask) if m] == calls[0]["token_ids"] + calls[1]["token_ids"]
    assert tokenizer.decode(calls[0]["token_ids"], skip_special_tokens=True).startswith('<tool_call>{"name": "calc"')


def test_anthropic_messages_stop_reasons_usage_and_errors(tokenizer: Any, tmp_path: Path) -> None:
    """end_turn, stop_sequence (with the matched string), max_tokens and usage; refusals in Anthropic's shape,
    raised by the SDK as its own exception classes; nothing refused is recorded."""
    record = tmp_path / "rec"
    with ServerThread(ToolScript(tokenizer), model_name="script", record_dir=record) as server:
        gateway = server.app.state.gateway
        sid = gateway.open_session("anth-2")
        root = server.base_url.removesuffix("/v1")
        base = f"{root}/s/{sid}/{gateway.token(sid)}"
        hi = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        with anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0) as client:
            plain = client.messages.create(model="script", max_tokens=64, messages=hi, system=[
                {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}])
            assert (plain.content[0].text, plain.stop_reason, plain.stop_sequence) == (
                "Hello there. STOP more", "end_turn", None)
            assert plain.usage.input_tokens == len(_rendered(tokenizer, {"model": "script", "max_tokens": 1,
                                                                         "system": SYSTEM, "messages": hi}))
            assert plain.usage.output_tokens == len(tokenizer.encode("Hello there. STOP more",
                                                                     add_special_tokens=False)) + 1
            stopped = client.messages.create(model="script", max_tokens=64, messages=hi, stop_sequences=["STOP"])
            assert (stopped.content[0].text, stopped.stop_reason, stopped.stop_sequence) == (
                "Hello there. ", "stop_sequence", "STOP")
            with client.messages.stream(model="script", max_tokens=64, messages=hi, stop_sequences=["STOP"]) as s:
                final = s.get_final_message()
            assert (final.content[0].text, final.stop_reason, final.stop_sequence) == (
                "Hello there. ", "stop_sequence", "STOP")
            cut = client.messages.create(model="script", max_tokens=3, messages=hi)
            assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
            before = len(read_session(record / "anth-2.jsonl"))
            with pytest.raises(anthropic.BadRequestError, match="'user' or 'assistant'") as bad:
                client.messages.create(model="script", max_tokens=8, messages=[{"role": "system", "content": "x"}])
            assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
            with pytest.raises(anthropic.BadRequestError, match="'image' block"):
                client.messages.create(model="script", max_tokens=8, messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
            with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
                client.post("/v1/messages", body={"model": "script", "messages": hi}, cast_to=object)
            with pytest.raises(anthropic.BadRequestError, match="did you mean 'stop_sequences'|stop_sequences"):
                client.post("/v1/messages", body={"model": "script", "max_tokens": 8, "messages": hi,
                                                  "stop_sequence": ["x"]}, cast_to=object)
            with pytest.raises(anthropic.NotFoundError, match="model server refused.*another-model"):  # upstream's
                client.messages.create(model="another-model", max_tokens=8, messages=hi)
            assert len(read_session(record / "anth-2.jsonl")) == before
        with anthropic.Anthropic(base_url=f"{root}/s/{sid}/wrong-token-0123456789abcdef", api_key="unused",
                                 max_retries=0) as intruder:
            with pytest.raises(anthropic.PermissionDeniedError) as denied:
                intruder.messages.create(model="script", max_tokens=8, messages=hi)
            assert denied.value.body["error"]["type"] == "permission_error"
        assert len(read_session(record / "anth-2.jsonl")) == before


def test_anthropic_sdk_authenticates_with_x_api_key(tokenizer: Any, tmp_path: Path) -> None:
    """With an API key the gateway takes the key the ``anthropic`` package sends (``x-api-key``)."""
    from agentgym.serving.http import BackgroundServer

    app = create_gateway_app(create_app(ToolScript(tokenizer), model_name="script"), tmp_path / "rec",
                             api_key="k-0123456789")
    with BackgroundServer(app, ready_path="/health") as server:
        root = server.url
        headers = {"X-Agentgym-Session": "keyed"}
        with anthropic.Anthropic(base_url=root, api_key="wrong", max_retries=0, default_headers=headers) as client:
            with pytest.raises(anthropic.AuthenticationError):
                client.messages.create(model="script", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        with anthropic.Anthropic(base_url=root, api_key="k-0123456789", max_retries=0,
                                 default_headers=headers) as client:
            raw = client.messages.with_raw_response.create(model="script", max_tokens=64,
                                                           messages=[{"role": "user", "content": "hi"}])
            assert raw.parse().content[0].text == "Hello there. STOP more"
            assert raw.headers.get("X-Agentgym-Session-Token")  # the session's creator learns its token
    assert [r["type"] for r in read_session(tmp_path / "rec" / "keyed.jsonl")] == ["session", "call"]


def test_the_conversion_keeps_block_order_and_refuses_what_it_cannot_carry() -> None:
    """Pure conversion: tool results before text stay in order, tool_use input is serialised as the server
    serialises parsed calls, tool_choice maps, and what the chat form cannot carry is a 400 naming the field."""
    from agentgym.serving.anthropic_messages import MessageStream
    from agentgym.serving.openai_protocol import APIError

    chat = to_chat_request({"model": "m", "max_tokens": 9, "system": SYSTEM, "tools": TOOLS,
                            "tool_choice": {"type": "any"}, "stop_sequences": ["##"], "metadata": {"user_id": "u-1"},
                            "messages": [
        {"role": "user", "content": "What is 2*3?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me see."},
            {"type": "tool_use", "id": "t1", "name": "calc", "input": {"expression": "2*3"}},
            {"type": "tool_use", "id": "t2", "name": "calc", "input": {"expression": "é"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "6"},
                                     {"type": "tool_result", "tool_use_id": "t2",
                                      "content": [{"type": "text", "text": "err"}], "is_error": True},
                                     {"type": "text", "text": "So?"}]}]})
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant = chat["messages"][2]
    assert assistant["content"] == "Let me see."
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ['{"expression": "2*3"}',
                                                                            '{"expression": "é"}']
    assert [m.get("tool_call_id") for m in chat["messages"][3:5]] == ["t1", "t2"]
    assert chat["messages"][4]["content"] == "err" and chat["messages"][5]["content"] == "So?"
    assert (chat["tool_choice"], chat["stop"], chat["user"]) == ("required", ["##"], "u-1")
    assert chat["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"]
    named = to_chat_request({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                             "tools": TOOLS, "tool_choice": {"type": "tool", "name": "calc"}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "calc"}}
    base = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    for extra, field in [({"thinking": {"type": "enabled", "budget_tokens": 9}}, "thinking"),
                         ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
                         ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
                         ({"max_tokens": 0}, "max_tokens"), ({"temprature": 1}, "temprature"),
                         ({"messages": [{"role": "user", "content": [{"type": "document"}]}]},
                          "messages[0].content[0]"),
                         ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "x"}]}]},
                          "messages[0].content[0]")]:
        with pytest.raises(APIError) as refused:
            to_chat_request({**base, **extra})
        assert refused.value.status == 400 and refused.value.param == field, extra
    assert to_chat_request({**base, "thinking": {"type": "disabled"}, "service_tier": "auto"})["max_tokens"] == 4
    stream = MessageStream({"model": "m"})
    events = stream.feed({"error": {"message": "boom"}})
    assert events[0].startswith("event: message_start") and events[-1].startswith("event: error")
    assert json.loads(events[-1].split("data: ", 1)[1])["error"] == {"type": "api_error", "message": "boom"}
