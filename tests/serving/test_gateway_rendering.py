"""The gateway's tokenizer fallback (an upstream that reports no token ids) renders a tool-call history as the model
wrote it: OpenAI-format argument strings become objects before the chat template, as vLLM does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

fastapi = pytest.importorskip("fastapi")
testclient = pytest.importorskip("fastapi.testclient")
pytest.importorskip("transformers")

from tests.serving.test_openai_messages import QWEN25_TOOLS_TEMPLATE  # noqa: E402


def _upstream() -> Any:
    """An OpenAI-compatible server that, like many hosted APIs, returns text only (no token ids)."""
    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(_: fastapi.Request) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "The answer is 42."}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return app


def test_tokenizer_fallback_renders_argument_strings_as_objects(tmp_path: Path) -> None:
    from agentgym.serving.gateway import create_gateway_app
    from tests.helpers.chat_families import FAMILIES, build_tokenizer

    tok = build_tokenizer(next(f for f in FAMILIES if f.name == "qwen2.5"))
    tok.chat_template = QWEN25_TOOLS_TEMPLATE
    generated = '{"expression": "12+30"}'
    messages = [
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": generated}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    app = create_gateway_app(_upstream(), tmp_path, tokenizer=tok)
    with testclient.TestClient(app) as client:
        reply = client.post("/s/t1/v1/chat/completions", json={"model": "m", "messages": messages})
    assert reply.status_code == 200, reply.text
    (call,) = [json.loads(line) for line in (tmp_path / "t1.jsonl").read_text().splitlines()
               if json.loads(line)["type"] == "call"]
    assert call["ids_source"] == "tokenized"
    prompt = tok.decode(call["prompt_token_ids"])
    assert '"arguments": {"expression": "12+30"}}' in prompt and '\\"expression' not in prompt
