"""Playing an env without a policy: the reference episode, and the step primitives every sampler shares.

:meth:`~agentgym.suite.TaskSuite.validate` proves a suite solvable by playing each task with the env's reference
solver: reset, step through the solver's actions, read the outcome. That needs no policy and no engine, so it lives
here, in the contract layer, next to the suite. The rollout engines (:mod:`agentgym.rollout.turns`) take every turn
through the same :func:`keyed_step` and end every episode through the same :func:`episode_outcome`, so a reference
trajectory records the same fields as one a policy played.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentgym.trajectory import Trajectory, Turn, jsonable
from agentgym.utils.images import observation_parts

if TYPE_CHECKING:  # the suite plays its tasks through this module: it imports this one, not the other way round
    from agentgym.suite import Task

__all__ = ["episode_outcome", "keyed_step", "prepare_env_tasks", "prepares_tasks", "read_state_key",
           "run_reference_episode"]

logger = logging.getLogger(__name__)


def episode_outcome(step_info: Mapping[str, Any], truncated: bool) -> dict[str, Any]:
    """The outcome of an episode that just ended, from the last step's ``info``.

    A wrapper can end an episode the env itself did not end: Gymnasium's ``TimeLimit`` (from
    ``gym.make(id, max_episode_steps=N)``) returns ``truncated=True`` with no ``info["outcome"]``. That is a
    truncation, not an infrastructure error: ``max_turns`` with success False and score 0.
    """
    outcome = dict(step_info.get("outcome") or {})
    if not outcome and truncated:
        outcome = {"success": False, "score": 0.0, "end_reason": "max_turns"}
    return outcome


def keyed_step(env: Any, action: str) -> tuple[str | None, tuple[Any, ...]]:
    """``env.step(action)`` with the env's :func:`read_state_key` taken just before it.

    One function, so the key is read by the same worker (or inline) as the step, in one executor call: an env
    is only ever touched from one thread at a time, and the key costs no extra thread hop per turn.
    """
    state_key = read_state_key(env)
    return state_key, env.step(action)


def read_state_key(env: Any) -> str | None:
    """The env's anchor state now (``state_key()`` of the unwrapped env), or ``None`` when it has none or fails.

    Recorded on every turn before the action, whatever the policy, so trajectories from any policy (token ids
    or not) carry what GiGPO groups by. A failing key must not cost the episode: it is logged and left out.
    """
    method = getattr(getattr(env, "unwrapped", env), "state_key", None)
    if method is None:
        return None
    try:
        key = method()
    except Exception as exc:  # noqa: BLE001 - a broken key is a missing anchor, not a failed episode
        logger.debug("state_key() failed: %s: %s", type(exc).__name__, exc)
        return None
    return None if key is None else str(key)


def prepares_tasks(env_class: Any) -> bool:
    """Whether ``env_class`` overrides :meth:`agentgym.env.AgentEnv.prepare_tasks` (the default builds nothing)."""
    prepare = getattr(env_class, "prepare_tasks", None)
    return callable(prepare) and not getattr(getattr(prepare, "__func__", prepare), "builds_nothing", False)


def prepare_env_tasks(env_class: Any, tasks: Sequence[Task], label: str | None = None) -> bool:
    """Have ``env_class`` build what ``tasks`` need before their episodes start
    (:meth:`agentgym.env.AgentEnv.prepare_tasks`), where the class overrides that hook; ``env_class`` may also be
    an env, wrapped or not. Returns whether it ran.

    For any loop that plays many tasks: TextWorld, for one, generates the games they name there, one per core and
    logged, where each ``reset`` would build its own game in turn and say nothing. A preparation that fails is
    logged and the episodes build what they need in ``reset``, where a task that cannot be built fails its own
    episode, never the loop.
    """
    if not isinstance(env_class, type):
        env_class = type(getattr(env_class, "unwrapped", env_class))
    if not tasks or not prepares_tasks(env_class):
        return False
    try:
        env_class.prepare_tasks(list(tasks))
    except Exception as exc:  # noqa: BLE001
        logger.warning("%s: preparing %d task(s) failed (%s: %s); their episodes build what they need in reset",
                       label or env_class.__name__, len(tasks), type(exc).__name__, exc)
    return True


def run_reference_episode(env: Any, task: Task, seed: int | None = None) -> Trajectory:
    """Play one episode with the env's reference solver, synchronously; returns its trajectory."""
    start = time.perf_counter()
    observation, info = env.reset(seed=seed, options={"task": task})
    solver = env.unwrapped.reference_solver()
    turns: list[Turn] = []
    outcome: dict[str, Any] = {}
    while True:
        text, images = observation_parts(observation)
        action = solver(text)
        state_key, (next_obs, reward, terminated, truncated, step_info) = keyed_step(env, action)
        turns.append(Turn(observation=text, action=action, reward=float(reward),
                          info=jsonable(step_info["turn"]), state_key=state_key, images=images))
        observation = next_obs
        if terminated or truncated:
            outcome = episode_outcome(step_info, truncated)
            break
    env_id = env.spec.id if getattr(env, "spec", None) is not None else type(env.unwrapped).__name__
    return Trajectory(
        env_id=env_id, task_id=task.id, seed=seed, turns=tuple(turns), outcome=outcome,
        end_reason=str(outcome.get("end_reason", "")), policy="reference",
        timing={"wall_s": time.perf_counter() - start},
    )
