"""Keep one client from holding every session of an env server: idle timeout and a per-address session cap.

Why: each WebSocket session of ``agentgym serve-env`` holds a live env (a sandbox, a browser, a container) and the
server has a global cap (``--max-sessions``). Without more, one client that opens that many connections and sends
nothing keeps every other client out for as long as it likes. Two limits stop that:

* **Idle timeout.** Idle time runs from the server's reply (or the handshake) until the client's next message,
  and only then: time the server spends on the client's request (a long step) does not count. Any message restarts
  it, so a client that thinks longer (waits for its model) keeps its session by sending one meanwhile; OpenEnv's
  ``state`` request is the cheap one, and :class:`~agentgym.serving.remote_env.RemoteEnv` sends it by itself while
  an episode waits for its next action. A session past the limit is closed: the client gets an OpenEnv error
  message (code ``SESSION_IDLE_TIMEOUT``, "Session expired: ...") and the close code 4408 with the reason
  "session expired", and the server's session handler sees a disconnect, so it closes the env through its usual
  path.
* **Per-client cap.** At most ``max_per_client`` sessions per remote address at a time; one more is answered with
  an OpenEnv error message (code ``CLIENT_LIMIT_REACHED``) and the close code 4429, before any env is made.

The close codes are in the range RFC 6455 (section 7.4.2) leaves to applications; 4408 and 4429 echo HTTP's 408
(Request Timeout) and 429 (Too Many Requests). This is a pure ASGI middleware on the ``/ws`` route so that it
wraps the session handler that ``openenv-core`` mounts, without changing it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["CLIENT_LIMIT_CLOSE_CODE", "CLIENT_LIMIT_REACHED", "GuardStats", "IDLE_CLOSE_CODE",
           "SESSION_IDLE_TIMEOUT", "SessionGuard"]

#: OpenEnv error code sent to a client refused because its address holds ``max_per_client`` sessions.
CLIENT_LIMIT_REACHED = "CLIENT_LIMIT_REACHED"
#: OpenEnv error code sent to a client whose session was closed for being idle.
SESSION_IDLE_TIMEOUT = "SESSION_IDLE_TIMEOUT"
#: WebSocket close codes (application range, RFC 6455 section 7.4.2).
IDLE_CLOSE_CODE = 4408
CLIENT_LIMIT_CLOSE_CODE = 4429

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class GuardStats:
    """What a :class:`SessionGuard` holds and did: sessions per address, idle closes, refusals.

    Kept outside the middleware so the app that builds it (the middleware is instantiated lazily by Starlette)
    can report it.
    """

    held: Counter[str] = field(default_factory=Counter)
    idle_closed: int = 0
    refused: int = 0


def _error_text(code: str, message: str, **extra: Any) -> str:
    """OpenEnv's error message shape (``{"type": "error", "data": {"message", "code", ...}}``)."""
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


class SessionGuard:
    """ASGI middleware: idle timeout and per-address cap for the WebSocket sessions under ``path``.

    Args:
        app: The ASGI app whose ``path`` WebSocket route holds one env per connection.
        idle_timeout_s: Close a session after this many seconds without a client message (``None``: never).
        max_per_client: Sessions one remote address may hold at a time (``None``: no per-address cap).
        path: The session route (OpenEnv's ``/ws``).
        stats: Where the counts live (a new :class:`GuardStats` if not given).
    """

    def __init__(self, app: ASGIApp, *, idle_timeout_s: float | None, max_per_client: int | None,
                 path: str = "/ws", stats: GuardStats | None = None) -> None:
        if idle_timeout_s is not None and not idle_timeout_s > 0:
            raise ConfigError(f"idle_timeout_s must be > 0 seconds or None, got {idle_timeout_s!r}.")
        if max_per_client is not None and (not isinstance(max_per_client, int) or max_per_client < 1):
            raise ConfigError(f"max_per_client must be an integer >= 1, got {max_per_client!r}.")
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.max_per_client = max_per_client
        self.path = path
        self.stats = stats if stats is not None else GuardStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        address = str((scope.get("client") or ("unknown",))[0])
        # One event loop serves every connection, and nothing awaits between the check and the increment, so no
        # lock is needed for the count to stay exact.
        if self.max_per_client is not None and self.stats.held[address] >= self.max_per_client:
            self.stats.refused += 1
            await self._refuse(address, receive, send)
            return
        self.stats.held[address] += 1
        try:
            if self.idle_timeout_s:
                receive, send = self._idle_channel(receive, send)
            await self.app(scope, receive, send)
        finally:
            self.stats.held[address] -= 1
            if self.stats.held[address] <= 0:
                del self.stats.held[address]

    async def _refuse(self, address: str, receive: Receive, send: Send) -> None:
        message = await receive()
        if message.get("type") != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": _error_text(
            CLIENT_LIMIT_REACHED,
            f"This client ({address}) already holds {self.max_per_client} sessions, the most one address may hold "
            "on this server. Close a session first, or start the server with a larger --max-sessions-per-client.",
            max_sessions_per_client=self.max_per_client)})
        await send({"type": "websocket.close", "code": CLIENT_LIMIT_CLOSE_CODE,
                    "reason": "too many sessions from this client"})

    def _idle_channel(self, receive: Receive, send: Send) -> tuple[Receive, Send]:
        """``receive`` that gives up after ``idle_timeout_s`` without a client message: it tells the client why,
        closes the connection, and hands the app a disconnect so the app frees the session's env; and ``send``
        that drops what the app sends after that close (its own goodbye would be a protocol error)."""
        timeout = float(self.idle_timeout_s or 0)
        state = {"connected": False, "closed": False}

        async def guarded() -> Message:
            if state["closed"]:
                return {"type": "websocket.disconnect", "code": IDLE_CLOSE_CODE}
            if not state["connected"]:  # the handshake itself is not a session's idle time
                message = await receive()
                state["connected"] = message.get("type") == "websocket.connect"
                return message
            try:
                # Cancelling a pending receive is safe with uvicorn's WebSocket implementations (a queue get, or
                # websockets' recv(), whose cancellation loses no message).
                return await asyncio.wait_for(receive(), timeout)
            except asyncio.TimeoutError:
                state["closed"] = True
                self.stats.idle_closed += 1
                try:
                    await send({"type": "websocket.send", "text": _error_text(
                        SESSION_IDLE_TIMEOUT,
                        f"Session expired: the server waited {timeout:g} s for the client's next message after its "
                        "last reply, closed the session and released its env. Open a new session (connect again) "
                        "and reset; to think longer between steps, send any message meanwhile (a state request "
                        "does), or raise the server's --idle-timeout.", idle_timeout_s=timeout)})
                    await send({"type": "websocket.close", "code": IDLE_CLOSE_CODE,
                                "reason": f"session expired: no message for {timeout:g} s (idle timeout)"})
                except Exception:  # noqa: BLE001 - the client may be gone already; the app still must clean up
                    pass
                return {"type": "websocket.disconnect", "code": IDLE_CLOSE_CODE}

        async def guarded_send(message: Message) -> None:
            if not state["closed"]:
                await send(message)

        return guarded, guarded_send
