"""Deprecated path of :mod:`agentgym.utils.gc_tuning`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.utils.gc_tuning")
