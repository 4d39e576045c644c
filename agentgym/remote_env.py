"""Deprecated path of :mod:`agentgym.serving.remote_env`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.serving.remote_env")
