"""Deprecated path of :mod:`agentgym.serving.env_server`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.serving.env_server")
