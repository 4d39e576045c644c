"""Tools served over the Model Context Protocol (MCP), as agentgym tools any env can offer.

:class:`McpToolbox` starts an MCP server as a subprocess (the stdio transport), lists its tools and wraps each
as a :class:`~agentgym.toolset.Tool` whose JSON schema is the server's ``inputSchema``. Calls are synchronous
(``ToolSet.call`` runs them), so the client session lives on an event loop in a background thread.

Model mistakes and server failures alike are tool errors, never crashes: a call the server rejects, a call that
times out and a server that dies mid-call all come back as an error :class:`~agentgym.toolset.ToolResult`
(``metadata["kind"]`` says which), and once the server is gone every later call says so at once.

Needs the official ``mcp`` package: ``pip install 'agentgym[mcp]'``. Both its 1.x (camelCase fields) and 2.x
(snake_case) client APIs are read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from agentgym.errors import DependencyNotInstalled, ToolError
from agentgym.toolset import Tool, ToolResult

__all__ = ["McpToolbox"]

logger = logging.getLogger(__name__)

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_\-]")


def _field(obj: Any, snake: str, camel: str, default: Any = None) -> Any:
    """Read a field of an mcp model under its 2.x (snake_case) or 1.x (camelCase) name."""
    value = getattr(obj, snake, None)
    return getattr(obj, camel, default) if value is None else value


def _tool_name(name: str, prefix: str) -> str:
    """An agentgym-valid tool name (letters, digits, '_' and '-', at most 64) for an MCP tool name."""
    clean = _INVALID_NAME_CHARS.sub("_", prefix + name)
    if not clean or not (clean[0].isalpha() or clean[0] == "_"):
        clean = "_" + clean
    return clean[:64]


def _parameters(schema: Any) -> dict[str, Any]:
    """The tool's parameters schema: the server's input schema, as an object schema."""
    params = dict(schema) if isinstance(schema, Mapping) else {}
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    params.pop("$schema", None)  # a draft-07 declaration; the schema is checked as draft 2020-12 like ours
    return params


def _result_text(result: Any) -> str:
    """The text of a call result: text blocks joined; other blocks named, structured content as a fallback."""
    parts: list[str] = []
    for block in _field(result, "content", "content", []) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    if not parts:
        structured = _field(result, "structured_content", "structuredContent")
        if structured is not None:
            parts.append(str(structured))
    return "\n".join(parts)


class McpToolbox:
    """An MCP server over stdio and its tools as agentgym :class:`~agentgym.toolset.Tool` objects.

    Args:
        command: The server's command line, e.g. ``["python", "server.py"]`` or ``["npx", "some-server"]``.
        env: Environment variables for the server (``None``: mcp's safe default environment).
        cwd: Working directory of the server.
        timeout_s: Longest a start-up or a single tool call may take; a slower call is a tool error.
        prefix: Put before every tool name (``"fs_"`` turns ``read_file`` into ``fs_read_file``), so tools of
            several servers, or a server's and the env's own, cannot clash.
        errlog: Where the server's stderr goes.

    Use it as a context manager, or call :meth:`close` (an env that owns a toolbox closes it in ``close()``)::

        with McpToolbox(["python", "server.py"]) as box:
            toolset = ToolSet([*box.tools()])
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout_s: float = 30.0,
        prefix: str = "",
        errlog: TextIO | None = None,
    ) -> None:
        if isinstance(command, str) or not command:
            raise ToolError("McpToolbox needs the server's command line as a list, e.g. ['python', 'server.py'].")
        if timeout_s <= 0:
            raise ToolError(f"McpToolbox timeout_s must be > 0, got {timeout_s}.")
        try:
            from mcp import ClientSession, StdioServerParameters
            from mcp.client.stdio import stdio_client
        except ImportError as exc:
            raise DependencyNotInstalled("mcp", "mcp", "MCP tools") from exc
        self._client_session = ClientSession
        self._stdio_client = stdio_client
        self._params = StdioServerParameters(command=str(command[0]), args=[str(a) for a in command[1:]],
                                             env=dict(env) if env is not None else None,
                                             cwd=str(cwd) if cwd is not None else None)
        self.command = list(command)
        self.timeout_s = float(timeout_s)
        self.prefix = prefix
        self._errlog = errlog if errlog is not None else sys.stderr
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentgym-mcp", daemon=True)
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._runner: concurrent.futures.Future[None] | None = None
        self._dead: str | None = None
        self._closed = False
        self._tools: list[Tool] = []
        self._start()

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._thread.start()
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._runner = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            listed = ready.result(timeout=self.timeout_s)
        except BaseException as exc:
            self.close()
            raise ToolError(f"MCP server {self.command} did not start: {type(exc).__name__}: {exc}. Check that the "
                            "command runs an MCP server on stdio (try it in a shell).") from exc
        self._tools = [self._wrap(t) for t in listed]

    async def _serve(self, ready: concurrent.futures.Future[list[Any]]) -> None:
        """Hold the stdio connection and the session open until :meth:`close` (or the server's death)."""
        self._stop = asyncio.Event()
        try:
            async with self._stdio_client(self._params, errlog=self._errlog) as (read, write):
                async with self._client_session(read, write) as session:
                    await asyncio.wait_for(session.initialize(), self.timeout_s)
                    listed = await self._list_tools(session)
                    self._session = session
                    ready.set_result(listed)
                    await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - the server died or would not start: record why
            self._dead = f"{type(exc).__name__}: {exc}"
            if not ready.done():
                ready.set_exception(exc)
        finally:
            self._session = None
            if self._dead is None and not self._closed:
                self._dead = "the connection closed"

    async def _list_tools(self, session: Any) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        for _ in range(100):  # pages
            if cursor is None:
                page = await asyncio.wait_for(session.list_tools(), self.timeout_s)
            else:
                page = await asyncio.wait_for(self._next_page(session, cursor), self.timeout_s)
            tools += list(page.tools)
            cursor = _field(page, "next_cursor", "nextCursor")
            if not cursor:
                break
        return tools

    @staticmethod
    async def _next_page(session: Any, cursor: str) -> Any:
        try:
            from mcp.types import PaginatedRequestParams

            return await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        except (ImportError, TypeError):  # mcp 1.x
            return await session.list_tools(cursor=cursor)

    def close(self) -> None:
        """Stop the server and the background loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._runner is not None:
            try:
                self._runner.result(timeout=self.timeout_s)
            except BaseException:  # noqa: BLE001 - shutting down: the server may already be gone
                logger.debug("MCP session ended with an error while closing", exc_info=True)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> McpToolbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- tools -----------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while the server answers (false once it died or the toolbox was closed)."""
        return not self._closed and self._dead is None and self._session is not None

    def tools(self) -> list[Tool]:
        """The server's tools as agentgym tools (name, description, JSON schema), in the server's order."""
        return list(self._tools)

    def _wrap(self, mcp_tool: Any) -> Tool:
        remote = str(mcp_tool.name)
        schema = _parameters(_field(mcp_tool, "input_schema", "inputSchema"))

        def call(**arguments: Any) -> ToolResult:
            return self.call(remote, arguments)

        call.__name__ = _tool_name(remote, self.prefix)
        return Tool(name=call.__name__, description=str(getattr(mcp_tool, "description", "") or ""),
                    parameters=schema, fn=call)

    def _server_gone(self, wait_s: float) -> bool:
        """After a failed call: does the server still answer a ping? If not, it is marked dead for good."""
        session = self._session
        if session is None or self._runner is None or self._runner.done():
            return True
        ping = asyncio.run_coroutine_threadsafe(asyncio.wait_for(session.send_ping(), wait_s), self._loop)
        try:
            ping.result(timeout=wait_s + 1.0)
            return False
        except BaseException as exc:  # noqa: BLE001 - no answer: the connection is gone
            self._dead = f"no answer to a ping after a failed call ({type(exc).__name__}: {exc})"
            if self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            return True

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Call the server's tool ``name``; every failure is an error result that says what happened."""
        if self._closed:
            return ToolResult.error(f"Error: the MCP server for {name} was closed.", kind="mcp_closed")
        if not self.alive:
            return ToolResult.error(f"Error: the MCP server for {name} is not running ({self._dead}); the tool is "
                                    "unavailable.", kind="mcp_server_died")
        session = self._session
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(session.call_tool(name, dict(arguments)), self.timeout_s), self._loop)
        try:
            result = future.result(timeout=self.timeout_s + 5.0)
        except (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError):
            future.cancel()
            return ToolResult.error(f"Error: {name} took longer than {self.timeout_s:g} s and was abandoned.",
                                    kind="mcp_timeout")
        except BaseException as exc:  # noqa: BLE001 - a dead server or a protocol error: a tool error
            if self._server_gone(wait_s=2.0):
                return ToolResult.error(f"Error: the MCP server died during {name} ({type(exc).__name__}: {exc}).",
                                        kind="mcp_server_died")
            return ToolResult.error(f"Error: {name} failed: {type(exc).__name__}: {exc}", kind="mcp_error")
        text = _result_text(result)
        if _field(result, "is_error", "isError", False):
            return ToolResult.error(text or f"Error: {name} failed.", kind="mcp_tool_error")
        return ToolResult(content=text)
