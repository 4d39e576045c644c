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

__all__ = ["RayEnv", "DEFAULT_ACTOR_OPTIONS"]

DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 0, "scheduling_strategy": "SPREAD", "max_restarts": 0}
"""No CPU reserved per env worker (envs mostly wait on tools, and a reservation would leave episodes queued for a
free CPU: pass ``num_cpus`` to cap workers per node), spread over the nodes, never restarted mid-episode (a
restarted actor would hold a fresh env, silently out of step with the episode)."""

_HOST_CLASS: Any = None


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise DependencyNotInstalled("ray", "ray", "env workers on Ray (RolloutConfig.env_backend='ray')") from exc
    return ray


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

    Raises:
        DependencyNotInstalled: Ray is not installed.
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, *,
                 actor_options: Mapping[str, Any] | None = None, call_timeout_s: float | None = None) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.env_id = env_id
        self._timeout = call_timeout_s
        options = {**DEFAULT_ACTOR_OPTIONS, **dict(actor_options or {})}
        self._actor_died = False
        self._actor = _host_class().options(**options).remote(env_id, dict(env_kwargs or {}))
        self.observation_space, self.action_space, metadata = self._call("spaces")
        self.metadata = dict(metadata)

    def _call(self, method: str, *args: Any) -> Any:
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
            return ray.get(getattr(actor, method).remote(*args), timeout=self._timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(f"{self.env_id} on Ray did not answer within {self._timeout} s") from exc
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
