"""Deprecated path of :mod:`agentgym.utils.fast_records`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.utils.fast_records")
