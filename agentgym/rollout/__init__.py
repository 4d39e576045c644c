"""Collecting episodes: the rollout engine, branching rollouts, Ray env workers.

The engine (:mod:`agentgym.rollout.engine`) is the one way episodes are run, for evaluation and for training;
branching (:mod:`agentgym.rollout.branching`) and the Ray backend (:mod:`agentgym.rollout.ray_envs`) build on it.
"""

from __future__ import annotations

from agentgym.rollout.engine import *  # noqa: F403  (the engine's names are this package's public API)
from agentgym.rollout.engine import __all__  # noqa: F401
