"""Deprecated path of :mod:`agentgym.rollout.fast_records`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.rollout.fast_records")
