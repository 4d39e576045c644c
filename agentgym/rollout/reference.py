"""Reference episodes: an env played by its own reference solver, no policy and no engine.

Defined in the contract layer (:mod:`agentgym.reference`), where :meth:`~agentgym.suite.TaskSuite.validate` uses it
to prove a suite solvable without depending on the rollout engine; it is offered here too, beside the engines whose
trajectories it matches field for field.
"""

from __future__ import annotations

from agentgym.reference import run_reference_episode

__all__ = ["run_reference_episode"]
