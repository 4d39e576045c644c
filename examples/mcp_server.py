"""An MCP server on stdio with one tool, written with the official mcp package (``pip install 'agentgym[mcp]'``)."""
try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as Server

server = Server("letters")


@server.tool()
def backwards(word: str) -> str:
    """Spell a word from its last letter to its first."""
    return word[::-1]


if __name__ == "__main__":
    server.run()
