"""Deprecated path of :mod:`agentgym.rollout.branch_rule`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.rollout.branch_rule")
