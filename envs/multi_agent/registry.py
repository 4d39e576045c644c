"""Deprecated path of :mod:`agentgym.registration.multi_agent`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.registration.multi_agent")
