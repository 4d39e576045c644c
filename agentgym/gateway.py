"""Deprecated path of :mod:`agentgym.serving.gateway`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.serving.gateway")
