"""API keys for every agentgym server: one ASGI middleware, for HTTP and WebSocket alike.

A server started with an API key (``--api-key`` on the command line or the ``AGENTGYM_API_KEY`` environment
variable) answers only requests that carry it, the way vLLM's and OpenAI's servers do:

* ``Authorization: Bearer <key>``: what the ``openai`` package and every OpenAI-compatible client send;
* ``x-api-key: <key>``: what the ``anthropic`` package sends.

WebSocket clients that cannot set headers (browsers' ``WebSocket``) may send the key as the
``Sec-WebSocket-Protocol`` value ``agentgym.key.<key>``; the key never goes into a URL, where proxies and access
logs would keep it.

The check is a pure ASGI middleware rather than a FastAPI dependency so that it covers every route, including
the ones a library mounts for us (OpenEnv's ``/ws``), and so that a refused WebSocket is closed before the app
sees it. Keys are compared with :func:`hmac.compare_digest`, so the time a refusal takes says nothing about how
much of a guess was right.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["API_KEY_ENV", "ApiKeyMiddleware", "WEBSOCKET_KEY_PREFIX", "resolve_api_key"]

#: The environment variable a server reads its key from when ``--api-key`` is not given.
API_KEY_ENV = "AGENTGYM_API_KEY"

#: The ``Sec-WebSocket-Protocol`` prefix that carries a key for clients that cannot set headers.
WEBSOCKET_KEY_PREFIX = "agentgym.key."

#: Shortest key accepted: anything shorter can be guessed by a client with time on its hands.
MIN_KEY_LENGTH = 8

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def resolve_api_key(given: str | None) -> str | None:
    """The key a server should require: ``given`` if set, else ``$AGENTGYM_API_KEY``, else ``None`` (open).

    Raises:
        ConfigError: The key is shorter than ``MIN_KEY_LENGTH`` (8) characters or holds whitespace or control
            characters (it would not survive an HTTP header).
    """
    key = given if given is not None else os.environ.get(API_KEY_ENV)
    if key is None or key == "":
        return None
    if len(key) < MIN_KEY_LENGTH:
        raise ConfigError(f"The API key must be at least {MIN_KEY_LENGTH} characters long, got {len(key)}; "
                          "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    if any(ch.isspace() or not ch.isprintable() or not ch.isascii() for ch in key):
        raise ConfigError("The API key may hold only printable ASCII without spaces (it travels in an HTTP header).")
    return key


class ApiKeyMiddleware:
    """Refuse every HTTP request and WebSocket that does not carry ``api_key``.

    HTTP requests without the key get ``401`` with an OpenAI-style error body (the ``openai`` package raises
    ``AuthenticationError`` on it); WebSockets are closed with code 1008 (policy violation) before they are
    accepted. Paths in ``open_paths`` (by default ``/health``, so load balancers can probe) need no key.
    """

    def __init__(self, app: ASGIApp, *, api_key: str, open_paths: Iterable[str] = ("/health",)) -> None:
        if not api_key:
            raise ConfigError("ApiKeyMiddleware needs a non-empty api_key; leave the middleware out to serve openly.")
        self.app = app
        self._key = api_key.encode()
        self._open_paths = frozenset(open_paths)

    def _presented(self, scope: Scope) -> list[bytes]:
        found: list[bytes] = []
        for name, value in scope.get("headers") or ():
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                found.append(value[7:].strip())
            elif name == b"x-api-key":
                found.append(value.strip())
            elif name == b"sec-websocket-protocol" and scope["type"] == "websocket":
                found.extend(part.strip()[len(WEBSOCKET_KEY_PREFIX):] for part in value.split(b",")
                             if part.strip().startswith(WEBSOCKET_KEY_PREFIX.encode()))
        return found

    def allows(self, scope: Scope) -> bool:
        """Whether ``scope`` (an ASGI connection scope) may go through."""
        if scope.get("path") in self._open_paths:
            return True
        # Compare every candidate (no early exit) so the time taken does not depend on which header matched.
        results = [hmac.compare_digest(candidate, self._key) for candidate in self._presented(scope)]
        return any(results)

    def _key_subprotocol(self, scope: Scope) -> str | None:
        """The offered ``agentgym.key.<key>`` subprotocol that carries the right key, if any."""
        for offered in scope.get("subprotocols") or ():
            if offered.startswith(WEBSOCKET_KEY_PREFIX) and hmac.compare_digest(
                    offered[len(WEBSOCKET_KEY_PREFIX):].encode(), self._key):
                return str(offered)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allows(scope):
            chosen = self._key_subprotocol(scope) if scope["type"] == "websocket" else None
            if chosen is None:
                await self.app(scope, receive, send)
                return

            # A client that offers subprotocols must get one of them back in the handshake answer, or it fails the
            # connection (RFC 6455, section 4.1: browsers do). The app behind us knows nothing of our key protocol,
            # so we answer with the one that carried the key.
            async def send_with_subprotocol(message: Message) -> None:
                if message.get("type") == "websocket.accept" and not message.get("subprotocol"):
                    message = {**message, "subprotocol": chosen}
                await send(message)

            await self.app(scope, receive, send_with_subprotocol)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})
            return
        body = json.dumps({"error": {
            "message": "Missing or wrong API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
            "type": "authentication_error", "param": None, "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
