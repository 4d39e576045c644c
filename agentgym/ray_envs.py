"""Deprecated path of :mod:`agentgym.rollout.ray_envs`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.rollout.ray_envs")
