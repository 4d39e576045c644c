"""A stand-in LLM server on 127.0.0.1 whose latency is proportional to the tokens it returns.

It speaks the OpenAI chat-completions protocol and has a bounded batch capacity: at most ``capacity``
requests decode at once (continuous batching), each holding its slot for ``n_tokens * per_token_s``.
Reply lengths vary per request (drawn from a hash of the conversation, so runs are repeatable), which
reproduces the variance of real generation without a GPU.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from typing import Any

TOOL_CALL = '<tool_call>{"name": "work", "arguments": {"n": 1}}</tool_call>'


def build_app(*, capacity: int, per_token_s: float, min_tokens: int, max_tokens: int) -> Any:
    from fastapi import FastAPI, Request

    app = FastAPI()
    slots: dict[str, asyncio.Semaphore] = {}
    app.state.requests = 0

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "token-time", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        key = hashlib.sha256(repr(body["messages"]).encode()).digest()
        n_tokens = min_tokens + int.from_bytes(key[:4], "little") % (max_tokens - min_tokens + 1)
        sem = slots.setdefault("s", asyncio.Semaphore(capacity))
        async with sem:
            await asyncio.sleep(n_tokens * per_token_s)
        app.state.requests += 1
        text = "think " * max(0, n_tokens - 20) + TOOL_CALL
        return {
            "id": f"cmpl-{app.state.requests}", "object": "chat.completion", "created": int(time.time()),
            "model": "token-time",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": n_tokens, "total_tokens": n_tokens},
        }

    return app


class BackgroundServer:
    """Run a FastAPI app with uvicorn in a daemon thread on a free loopback port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("benchmark server did not start within 30 s")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
