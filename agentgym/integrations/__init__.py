"""Bridges to other ecosystems' protocols (the Model Context Protocol's tools as agentgym tools)."""
