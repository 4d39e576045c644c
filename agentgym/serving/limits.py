"""How much one request may ask of the OpenAI-compatible server, and the middleware that caps request bodies.

A model server is shared: one request that is too big must be refused at once, cheaply, and must leave the server
alive and answering everyone else. Each limit is therefore checked before the work it bounds, by the cheapest
measure that bounds it:

* the **body** in bytes, before it is read into memory or parsed (:class:`BodySizeLimitMiddleware`): a 100 MB JSON
  body costs gigabytes once parsed into Python strings and tokenised, so it never gets that far;
* the **prompt** in characters, before the tokenizer runs (tokenising costs about a second per megabyte on one
  core), then in tokens against the model's context after it ran;
* **n** (choices per prompt), before anything else is parsed;
* the **token budget** of the request, ``n * (prompt tokens + max_tokens)`` summed over its prompts: what the
  batcher will run for this request alone, so no single request can hold the model for minutes.

Defaults, chosen for a research server that sees GRPO groups (n of 8 to 64) and long agent prompts, and compared
with ``vllm serve``: vLLM caps ``n`` at ``VLLM_MAX_N_SEQUENCES`` (16384 by default) and sets no limit on the body
size; its continuous batching on a GPU makes a big ``n`` cheap there. This server runs static batches on whatever
it has (often a CPU), so it caps ``n`` at 128 (twice the largest GRPO group in common use), bodies at 8 MiB (a
128k-token prompt is well under 1 MiB of text), prompts at 1 Mi characters (about a second of tokenising, and more
than any 128k-token context holds), and a request at 262,144 tokens (64 samples of 4,096 tokens; 128 samples of
the tiny model's whole 2,048-token context). Every limit is a flag of ``agentgym serve`` and a field of
:class:`RequestLimits` for :func:`~agentgym.serving.openai_app.create_app`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, fields
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["BodySizeLimitMiddleware", "LIMIT_FLAGS", "RequestLimits", "request_too_large_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The ``agentgym serve`` flag that sets each field of :class:`RequestLimits` (error messages name it).
LIMIT_FLAGS: dict[str, str] = {
    "max_body_bytes": "--max-body-bytes",
    "max_prompt_chars": "--max-prompt-chars",
    "max_n": "--max-n",
    "max_request_tokens": "--max-request-tokens",
}


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the server; see the module docstring for why each default is what it is.

    Attributes:
        max_body_bytes: Largest request body, in bytes (413 beyond it).
        max_prompt_chars: Most characters of prompt text in one request (all its prompt strings together, or the
            rendered chat), checked before tokenising (400 ``context_length_exceeded`` beyond it).
        max_n: Most choices per prompt (400 beyond it).
        max_request_tokens: Most tokens one request may make the model process: ``n * (prompt tokens +
            max_tokens)`` summed over its prompts (400 beyond it).
    """

    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 1024 * 1024
    max_n: int = 128
    max_request_tokens: int = 262_144

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{f.name} (agentgym serve {LIMIT_FLAGS[f.name]}) must be an integer >= 1, got "
                                  f"{value!r}.")

    @staticmethod
    def flag(name: str) -> str:
        """How an operator raises the limit ``name``: the flag and the ``create_app`` spelling."""
        return f"agentgym serve {LIMIT_FLAGS[name]}, or create_app(limits=RequestLimits({name}=...))"


def request_too_large_body(limit: int) -> bytes:
    """The OpenAI-style error body of a 413: what the limit is and how to raise it."""
    message = (f"The request body is larger than this server's limit of {limit} bytes ({limit / 2**20:.1f} MiB). "
               f"Send a smaller request, or raise the limit ({RequestLimits.flag('max_body_bytes')}).")
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "request_too_large"}}).encode()


class _BodyTooLarge(Exception):
    pass


class BodySizeLimitMiddleware:
    """Refuse HTTP requests whose body exceeds ``max_bytes`` with 413, before the app reads any of it.

    A declared ``Content-Length`` over the limit is refused at once, unread. A body without one (chunked) is read
    here, chunk by chunk, counting bytes, and refused as soon as the count passes the limit; a body within the limit
    is handed to the app as it arrived. Either way no more than ``max_bytes`` of a request is ever held in memory.

    The 413 does not close the connection: the ASGI server (uvicorn) reads and drops the rest of the body, so the
    client, which is usually still uploading, gets to read the answer instead of a reset connection (the
    "lingering close" of RFC 9112, section 9.6).
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, on_refused: Callable[[str], None] | None = None) -> None:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ConfigError(f"max_bytes must be an integer >= 1, got {max_bytes!r}.")
        self.app = app
        self.max_bytes = max_bytes
        #: Called with the request's path on each refusal (the server counts them for /metrics).
        self.on_refused = on_refused

    def _declared_length(self, scope: Scope) -> int | None:
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return None  # the HTTP server already refuses malformed lengths; count the bytes instead
        return None

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if self.on_refused is not None:
            self.on_refused(str(scope.get("path", "")))
        body = request_too_large_body(self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = self._declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send)
            return
        try:
            first = await self._read_body(receive)
        except _BodyTooLarge:
            await self._refuse(scope, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()  # later calls: http.disconnect when the client goes away

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> Message:
        """The whole body as one ``http.request`` message, or :class:`_BodyTooLarge` once it passes the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message  # the client went away: the app sees the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
