"""A stand-in LLM server on 127.0.0.1 whose latency is proportional to the tokens it returns.

It speaks the OpenAI chat-completions protocol and has a bounded batch capacity: at most ``capacity``
requests decode at once (continuous batching), each holding its slot for ``n_tokens * per_token_s``.
Reply lengths vary per request (drawn from a hash of the conversation, so runs are repeatable), which
reproduces the variance of real generation without a GPU.
"""

import argparse
import asyncio
import hashlib
import socket
import subprocess
import sys
import time
from typing import Any

from fastapi import FastAPI, Request

TOOL_CALL = '<tool_call>{"name": "work", "arguments": {"n": 1}}</tool_call>'


def build_app(*, capacity: int, per_token_s: float, min_tokens: int, max_tokens: int) -> FastAPI:
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


class ServerProcess:
    """Run the token-time server in its own process, as a real inference server would be.

    Running it in the benchmark's process would make the server and the client share one GIL on two
    cores, which measures Python contention instead of the rollout loops.
    """

    def __init__(self, *, capacity: int, per_token_s: float, min_tokens: int, max_tokens: int) -> None:
        self.args = [f"--capacity={capacity}", f"--per-token-s={per_token_s}", f"--min-tokens={min_tokens}",
                     f"--max-tokens={max_tokens}"]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, __file__, f"--port={port}", *self.args])
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return f"http://127.0.0.1:{port}/v1"
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("token-time server exited during start-up") from None
                time.sleep(0.05)
        raise RuntimeError("token-time server did not start within 30 s")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="token-time OpenAI-compatible server (benchmarks only)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capacity", type=int, default=64)
    parser.add_argument("--per-token-s", type=float, default=0.002)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=384)
    args = parser.parse_args()
    app = build_app(capacity=args.capacity, per_token_s=args.per_token_s, min_tokens=args.min_tokens,
                    max_tokens=args.max_tokens)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    _main()
