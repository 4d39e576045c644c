"""MCP tools: a real stdio MCP server (written here with the mcp package's server API) becomes agentgym tools.

Checked: the schemas come from the server, calls run through an env's ToolSet in every parser format, the
server's own errors and bad arguments are tool errors, and a server that dies mid-call is a tool error too,
after which the env keeps working and says the tool is gone.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mcp", reason="pip install 'agentgym[mcp]'")

from agentgym.env import AgentEnv  # noqa: E402
from agentgym.errors import ToolError  # noqa: E402
from agentgym.integrations.mcp import McpToolbox  # noqa: E402
from agentgym.suite import Task  # noqa: E402
from agentgym.toolset import ToolCall, ToolSet, tool  # noqa: E402

SERVER = textwrap.dedent('''\
    """A small MCP server on stdio: arithmetic, a tool that raises, and one that kills the server mid-call."""
    import logging
    import os

    try:  # mcp 2.x
        from mcp.server.mcpserver import MCPServer as Server
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as Server

    logging.disable(logging.CRITICAL)
    server = Server("calc")


    @server.tool()
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


    @server.tool()
    def shout(text: str, times: int = 1) -> str:
        """Upper-case the text, repeated."""
        return " ".join([text.upper()] * times)


    @server.tool()
    def fail(reason: str) -> str:
        """Always raises."""
        raise ValueError(reason)


    @server.tool()
    def crash() -> str:
        """The server process exits while answering."""
        os._exit(3)


    if __name__ == "__main__":
        server.run()
    ''')


@pytest.fixture(scope="module")
def server_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "calc_server.py"
    path.write_text(SERVER, encoding="utf-8")
    return path


class _McpEnv(AgentEnv):
    """An env whose tools are its own ``answer`` plus every tool of an MCP server (which it owns and closes)."""

    cheap_steps = False

    def __init__(self, server: Path, **kwargs: Any) -> None:
        self._log = open(server.with_suffix(".log"), "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.box = McpToolbox([sys.executable, str(server)], timeout_s=30, errlog=self._log)
        super().__init__(**kwargs)

    @tool
    def answer(self, text: str) -> str:
        """Final answer.

        Args:
            text: The product.
        """
        self.mark_answer()
        self.finish(success=text.strip() == str(self.task.answer))
        return "done"

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.answer, *self.box.tools()])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return Task("m", "What is 6 times 7?", answer=42)

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Use multiply, then answer."

    def close(self) -> None:
        self.box.close()
        self._log.close()
        super().close()


@pytest.fixture(scope="module")
def env(server_file: Path) -> Iterator[_McpEnv]:
    made = _McpEnv(server_file, max_turns=20)
    yield made
    made.close()


def test_server_tools_become_agentgym_tools_with_their_schemas(env: _McpEnv) -> None:
    schemas = {s["function"]["name"]: s["function"] for s in env.reset(seed=0)[1]["tools"]}
    assert list(schemas) == ["answer", "multiply", "shout", "fail", "crash"]
    multiply = schemas["multiply"]
    assert multiply["description"] == "Multiply two integers."
    assert multiply["parameters"]["properties"]["a"]["type"] == "integer"
    assert sorted(multiply["parameters"]["required"]) == ["a", "b"]
    assert "times" not in schemas["shout"]["parameters"].get("required", [])


def test_calls_in_every_format_reach_the_server(env: _McpEnv) -> None:
    env.reset(seed=0)
    replies = ['<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>',
               '{"name": "multiply", "parameters": {"a": 6, "b": 7}}',
               'multiply(6, 7)',
               'shout("hi", times=2)']
    observations = [env.step(reply)[0] for reply in replies]
    assert observations == ["42", "42", "42", "HI HI"]
    _, reward, terminated, _, info = env.step('answer("42")')
    assert terminated and reward == 1.0 and info["outcome"]["success"]


def test_bad_arguments_and_server_errors_are_tool_errors(env: _McpEnv) -> None:
    env.reset(seed=0)
    observation, _, _, _, info = env.step('multiply("six", 7)')
    assert info["turn"]["kind"] == "invalid" and "is not of type 'integer'" in observation
    observation, _, terminated, _, info = env.step('fail("no luck")')
    assert info["turn"]["kind"] == "invalid" and not terminated and info["turn"]["tool_errors"]
    assert env.step("multiply(2, 3)")[0] == "6"  # the server is still fine


def test_a_server_that_dies_mid_call_is_a_tool_error_not_a_crash(server_file: Path) -> None:
    env = _McpEnv(server_file, max_turns=10)
    try:
        env.reset(seed=0)
        assert env.step("multiply(2, 3)")[0] == "6"
        observation, reward, terminated, truncated, info = env.step("crash()")
        assert "died" in observation and info["turn"]["kind"] == "invalid"
        assert not terminated and not truncated and reward == 0.0
        assert not env.box.alive
        observation, _, _, _, info = env.step("multiply(2, 3)")
        assert "not running" in observation and info["turn"]["kind"] == "invalid"
        _, reward, terminated, _, info = env.step('answer("42")')  # the env's own tools still work
        assert terminated and reward == 1.0
    finally:
        env.close()
        env.close()  # idempotent, also for the toolbox


def test_toolbox_direct_use_and_a_server_that_does_not_start(server_file: Path, tmp_path: Path) -> None:
    with open(tmp_path / "log.txt", "w", encoding="utf-8") as log:
        with McpToolbox([sys.executable, str(server_file)], prefix="calc.", timeout_s=30, errlog=log) as box:
            names = [t.name for t in box.tools()]
            assert names == ["calc_multiply", "calc_shout", "calc_fail", "calc_crash"]
            result = ToolSet(box.tools()).call(ToolCall("calc_multiply", {"a": 3, "b": 5}))
            assert result.content == "15" and not result.is_error
        assert box.call("multiply", {"a": 1, "b": 1}).metadata["kind"] == "mcp_closed"
        with pytest.raises(ToolError, match="did not start"):
            McpToolbox([sys.executable, "-c", "import sys; sys.exit(1)"], timeout_s=20, errlog=log)
