"""Deprecated path of :mod:`agentgym.integrations.mcp`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.integrations.mcp")
