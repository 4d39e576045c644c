"""The example env with the tools of an MCP server: schemas from the server, calls in every parser format."""
import sys
from pathlib import Path

from agentgym import ToolSet
from agentgym.integrations.mcp import McpToolbox
from reverse_env import ReverseEnv

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_server.py"))]


class ReverseWithMcpEnv(ReverseEnv):
    """Owns its server: started with the env, stopped by ``close()``."""

    def __init__(self, **kwargs):
        self.mcp = McpToolbox(SERVER)  # before super().__init__, which builds the tools
        super().__init__(**kwargs)

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.answer, *self.mcp.tools()])

    def close(self) -> None:
        self.mcp.close()
        super().close()


if __name__ == "__main__":
    env = ReverseWithMcpEnv()
    observation, info = env.reset(seed=0)
    print([t["function"]["name"] for t in info["tools"]])
    word = observation.split()[-1].rstrip(".")
    reversed_word, *_ = env.step(f'backwards("{word}")')  # runs in the MCP server
    print(observation, "->", reversed_word, "->", env.step(f'answer("{reversed_word}")')[1])
    env.close()
