"""Tools shared by environments: the Python sandbox, retrievers, the browser.

The tool-calling API itself (``Tool``, ``@tool``, ``ToolSet``) is core and lives in
:mod:`agentgym.toolset` (also exported as ``agentgym.tool`` / ``agentgym.ToolSet``).
"""
