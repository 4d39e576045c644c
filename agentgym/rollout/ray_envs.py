"""Env workers on Ray: run each episode's env in a Ray actor, anywhere in a cluster, behind the Gymnasium API.

Why: CPU-heavy envs (code interpreters, SWE test runs, browsers) outgrow the machine that holds the policy. With
``RolloutConfig(env_backend="ray")`` the rollout engine is unchanged (the policy stays in the driver process,
requests are batched across episodes as before, trajectories come back as episodes finish) but every env it opens
is a :class:`RayEnv`: a thin proxy whose ``reset``/``step``/``state_key`` run in a Ray actor holding the real env
(``gym.make`` inside the actor, on whichever node Ray schedules it; ``SPREAD`` by default). An actor or node that
dies mid-episode raises in that episode's next env call, so the engine ends only that episode (``end_reason:
error``) and closes its proxy; the other episodes go on.

Ray is an optional extra (``pip install 'agentgym[ray]'``) imported only when a :class:`RayEnv` is built, so
``import agentgym`` stays light. Connect to a cluster first (``ray.init(address=...)``); without one, the first
``RayEnv`` starts a local Ray instance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from agentgym.errors import DependencyNotInstalled

__all__ = ["DEFAULT_ACTOR_OPTIONS", "DEFAULT_START_TIMEOUT_S", "RayEnv", "ray_env_capacity"]

DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 0.25, "scheduling_strategy": "SPREAD", "max_restarts": 0}
"""A quarter of a CPU reserved per env worker: envs mostly wait on tools, so four share a core, yet the
reservation is nonzero, so Ray never starts more worker processes than the node can run (with ``num_cpus: 0``
every episode in flight started its own worker process at once, and 32 of them starting on a 2-core node missed
every deadline). The engine caps episodes in flight to what fits (:func:`ray_env_capacity`). Spread over the
nodes; never restarted mid-episode (a restarted actor would hold a fresh env, silently out of step with the
episode)."""

DEFAULT_START_TIMEOUT_S = 600.0
"""How long building a :class:`RayEnv` may wait for its actor (scheduling, worker process start, ``gym.make``).
Separate from ``RolloutConfig.step_timeout_s``: starting a worker process and importing the env's dependencies is
paid once per actor, not per step, and may queue behind other actors on a busy node."""

_HOST_CLASS: Any = None


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise DependencyNotInstalled("ray", "ray", "env workers on Ray (RolloutConfig.env_backend='ray')") from exc
    return ray


def _ensure_ray() -> Any:
    """Ray, connected: the cluster this process joined, else a local instance started now."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    return ray


def _requests(actor_options: Mapping[str, Any] | None) -> dict[str, float]:
    """The resources one env actor reserves, by Ray's resource names (``CPU``, ``GPU``, ``memory``, custom)."""
    options = {**DEFAULT_ACTOR_OPTIONS, **dict(actor_options or {})}
    wanted = {"CPU": options.get("num_cpus") or 0, "GPU": options.get("num_gpus") or 0,
              "memory": options.get("memory") or 0, **dict(options.get("resources") or {})}
    return {name: float(amount) for name, amount in wanted.items() if float(amount) > 0}


def ray_env_capacity(actor_options: Mapping[str, Any] | None = None) -> int | None:
    """How many env actors with ``actor_options`` fit in the cluster's free resources now.

    ``None`` when an actor reserves nothing (then Ray itself sets no limit). The rollout engine runs at most this
    many episodes at once with ``env_backend: ray``: an episode whose actor cannot be placed would otherwise wait
    for a reservation that only the end of the run frees (idle envs are kept for reuse until then).
    """
    ray = _ensure_ray()
    requests = _requests(actor_options)
    if not requests:
        return None
    free = ray.available_resources()
    return max(0, min(int(free.get(name, 0.0) // amount) for name, amount in requests.items()))


def _host_class() -> Any:
    """The Ray actor class that holds one real env (defined once, on first use)."""
    global _HOST_CLASS
    if _HOST_CLASS is None:
        ray = _ray()

        class EnvHost:
            """One env in a Ray worker process; every method is one env call."""

            def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]) -> None:
                import agentgym  # noqa: F401 - registers the env ids in the worker

                self.env = gym.make(env_id, disable_env_checker=True, **dict(env_kwargs))

            def spaces(self) -> tuple[Any, Any, Any]:
                return self.env.observation_space, self.env.action_space, self.env.metadata

            def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> tuple[Any, Any]:
                result = self.env.reset(seed=seed, options=dict(options) if options is not None else None)
                return result, self.state_key()

            def step(self, action: Any) -> tuple[Any, Any]:
                result = self.env.step(action)
                return result, self.state_key()

            def state_key(self) -> Any:
                method = getattr(self.env.unwrapped, "state_key", None)
                try:
                    return None if method is None else method()
                except Exception as exc:  # noqa: BLE001 - raised again by RayEnv.state_key, in the driver
                    return exc

            def action_choices(self) -> Any:
                method = getattr(self.env.unwrapped, "action_choices", None)
                return None if method is None else method()

            def truncate_episode(self, reason: str) -> tuple[dict[str, Any], float] | None:
                method = getattr(self.env.unwrapped, "truncate_episode", None)
                return None if method is None else method(reason)

            def start_solver(self, kind: str) -> None:
                self.solver = getattr(self.env.unwrapped, f"{kind}_solver")()

            def solve(self, observation: str) -> str:
                return self.solver(observation)

            def where(self) -> dict[str, Any]:
                import os

                return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

            def close(self) -> None:
                self.env.close()

        _HOST_CLASS = ray.remote(EnvHost)
    return _HOST_CLASS


class RayEnv(gym.Env):
    """A Gymnasium env whose real env (``gym.make(env_id, **env_kwargs)``) lives in a Ray actor.

    Args:
        env_id: A registered env id, e.g. ``agentgym/CodeInterpreter-v1``.
        env_kwargs: Keyword arguments for ``gym.make`` in the actor.
        actor_options: Ray actor options (``num_cpus``, ``resources``, ``scheduling_strategy``, ...), merged over
            :data:`DEFAULT_ACTOR_OPTIONS`.
        call_timeout_s: Longest wait for one env call before it raises ``TimeoutError`` (``None``: no limit; the
            rollout engine applies its own ``step_timeout_s`` anyway).
        start_timeout_s: Longest wait for the actor to be placed, started and to build its env; past it the actor
            is killed and ``TimeoutError`` says what the cluster had free.

    Raises:
        DependencyNotInstalled: Ray is not installed.
        TimeoutError: The actor did not start within ``start_timeout_s``.
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, *,
                 actor_options: Mapping[str, Any] | None = None, call_timeout_s: float | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        ray = _ensure_ray()
        self.env_id = env_id
        self._timeout = call_timeout_s
        options = {**DEFAULT_ACTOR_OPTIONS, **dict(actor_options or {})}
        self._actor_died = False
        self._actor = _host_class().options(**options).remote(env_id, dict(env_kwargs or {}))
        try:
            self.observation_space, self.action_space, metadata = self._call("spaces", timeout=start_timeout_s)
        except TimeoutError as exc:
            actor, self._actor = self._actor, None
            ray.kill(actor)  # a queued or half-started actor must not start later, unowned
            raise TimeoutError(
                f"The Ray actor for {env_id} did not start within {start_timeout_s} s (it reserves "
                f"{_requests(actor_options)}; free now: {ray.available_resources()}). Lower max_in_flight or the "
                "actor's num_cpus (RolloutConfig.ray_actor_options), or add nodes.") from exc
        except BaseException:
            self.close()
            raise
        self.metadata = dict(metadata)

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """One call on the actor, waited for. Never lets Ray connect again on its own: Ray's ``.remote()`` calls
        ``ray.init()`` when Ray is not initialized, and after ``ray.shutdown()`` that re-joins the old cluster from
        whichever thread still holds this env; if that cluster is going down, Ray ends the whole process."""
        ray = _ray()
        actor = getattr(self, "_actor", None)
        if actor is None:
            raise RuntimeError(f"this RayEnv ({self.env_id}) is closed; make a new one")
        if not ray.is_initialized():
            raise RuntimeError(f"Ray was shut down while a RayEnv ({self.env_id}) was still open; close envs (or "
                               "let the rollout engine finish) before ray.shutdown()")
        try:
            wait = self._timeout if timeout is None else timeout
            return ray.get(getattr(actor, method).remote(*args), timeout=wait)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(f"{self.env_id} on Ray did not answer within {wait} s") from exc
        except ray.exceptions.RayActorError:
            self._actor_died = True  # close() has nothing to wait for
            raise

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        result, self._state_key = self._call("reset", seed, options)
        return result

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        result, self._state_key = self._call("step", action)
        return result

    def state_key(self) -> str | None:
        """The remote env's anchor state (GiGPO), sent back with every reset and step: no extra round trip."""
        key = getattr(self, "_state_key", None)
        if isinstance(key, Exception):
            raise key
        return key

    def action_choices(self) -> tuple[str, ...] | None:
        """The remote env's valid replies this turn (``constrain_actions``; one actor call, asked only then)."""
        choices = self._call("action_choices")
        return None if choices is None else tuple(choices)

    def truncate_episode(self, reason: str) -> tuple[dict[str, Any], float] | None:
        """The remote env's outcome for a truncation from outside (the rollout engine's context limit) and the
        reward still due (``AgentEnv.truncate_episode``); ``None`` when its env cannot say (the default applies)."""
        return self._call("truncate_episode", reason)

    def reference_solver(self) -> Any:
        """The remote env's reference solver for this episode (it runs beside the env; each call is one actor
        call), so ``ReferencePolicy`` and BC demonstrations work with Ray env workers too."""
        return self._solver("reference")

    def shortcut_solver(self) -> Any:
        """The remote env's shortcut solver (imperfect demonstrations), as :meth:`reference_solver`."""
        return self._solver("shortcut")

    def _solver(self, kind: str) -> Any:
        self._call("start_solver", kind)
        return lambda observation: self._call("solve", observation)

    def where(self) -> dict[str, Any]:
        """Which Ray node and worker process hold this env (for tests and placement checks)."""
        return self._call("where")

    def close(self) -> None:
        """Close the remote env and end its actor; safe on an actor that already died, and after
        ``ray.shutdown()`` (the cluster's actors are gone with it, and no call may re-connect Ray)."""
        ray = _ray()
        actor, self._actor = getattr(self, "_actor", None), None
        if actor is None or not ray.is_initialized():
            return
        if not getattr(self, "_actor_died", False):
            try:
                ray.get(actor.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a dead actor or node has nothing left to close
                pass
        if ray.is_initialized():
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
