"""Env reuse: an env that ended its episode cleanly plays the next one instead of being built again.

Browsers, sandboxes and sockets are slow to build, so each run keeps its idle envs (:class:`EnvPool`); idle
``cheap_steps`` envs even outlive the run (:data:`IDLE_CHEAP_ENVS`). An env that failed is never reused: it is closed
from a daemon thread (:func:`discard_env`), where a close that hangs holds up nothing.

Envs are looked up in Gymnasium's registry by id; the ids are there already, since importing any ``agentgym`` module
runs the package's ``__init__``, which registers them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from agentgym.reference import prepare_env_tasks, prepares_tasks
from agentgym.rollout.specs import EpisodeSpec, RolloutConfig
from agentgym.suite import Task

__all__ = ["DISCARD_THREAD_NAME", "IDLE_CHEAP_ENVS", "EnvPool", "IdleCheapEnvs", "discard_env", "prepare_tasks", "tasks_to_prepare"]

logger = logging.getLogger(__name__)


class EnvPool:
    """Reuses idle envs per (env_id, kwargs) so browsers and sandboxes are not rebuilt every episode.

    Idle ``cheap_steps`` envs outlive the run: :meth:`close` hands them to :data:`IDLE_CHEAP_ENVS`, where the next run
    of any engine in this process takes them (trainers build an engine per step, so each step used to build every
    env again: for GuessNumber that was a sixth of a free-policy run). Other envs hold browsers, sandboxes and
    sockets, and are closed with the run as before.
    """

    def __init__(self, config: RolloutConfig | None = None) -> None:
        self._idle: dict[str, list[Any]] = defaultdict(list)
        self._lock = threading.Lock()
        self._config = config or RolloutConfig()
        self._cheap: dict[str, bool] = {}
        self._specs: dict[str, Any] = {}
        self._ids: dict[str, tuple[str, bool]] = {}  # idle key -> (env id, whether the key shows its kwargs by value)

    @staticmethod
    def _key(spec: EpisodeSpec) -> str:
        return spec.env_id + repr(sorted(spec.env_kwargs.items())) if spec.env_kwargs else spec.env_id

    def take_idle(self, spec: EpisodeSpec) -> Any | None:
        """An idle env for ``spec`` (cheap, no thread hop needed): this run's own, else one an earlier run left
        (:data:`IDLE_CHEAP_ENVS`, ``cheap_steps`` envs only), else ``None``."""
        key = self._key(spec)
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop()
        return IDLE_CHEAP_ENVS.take(key, self._registered(spec)) if self.cheap_to_make(spec) else None

    def _registered(self, spec: EpisodeSpec) -> Any:
        """Gymnasium's registered spec of ``spec.env_id``, looked up once per id and run (parsing the id on every
        ``gym.make`` cost ~10 us per episode); ``None`` when the id is not registered."""
        registered = self._specs.get(spec.env_id)
        if registered is None:
            import gymnasium as gym

            registered = self._specs[spec.env_id] = gym.registry.get(spec.env_id)
        return registered

    def cheap_to_make(self, spec: EpisodeSpec) -> bool:
        """Whether ``spec``'s env class says ``cheap_steps`` (pure in-process computation, construction included),
        so the engine builds it on the event loop instead of paying a worker-thread round trip per episode.
        Read from the registered class, never from an instance: building one to ask would cost what it saves."""
        cheap = self._cheap.get(spec.env_id)  # a class attribute: the env id alone decides
        if cheap is None:
            cheap = self._config.env_backend != "ray" and _class_says_cheap(spec.env_id)
            self._cheap[spec.env_id] = cheap
        return cheap

    def acquire(self, spec: EpisodeSpec) -> Any:
        """An idle env for ``spec`` if there is one, else a new one (:meth:`build`)."""
        env = self.take_idle(spec)
        return self.build(spec) if env is None else env

    def max_envs(self) -> int | None:
        """The most envs this run can hold at once (``None``: no limit): with ``env_backend: ray``, the env actors
        that fit in the cluster's free resources (:func:`~agentgym.rollout.ray_envs.ray_env_capacity`, at least 1)."""
        if self._config.env_backend != "ray":
            return None
        from agentgym.rollout.ray_envs import ray_env_capacity

        capacity = ray_env_capacity(self._config.ray_actor_options)
        return None if capacity is None else max(1, capacity)

    def build_timeout_s(self) -> float:
        """The engine's bound on one :meth:`build`. A Ray env's build starts a worker process and imports the env
        (paid once per actor, queued behind other actors on a busy node), so it is bounded by the actor's own start
        timeout, not by ``step_timeout_s``; the margin lets that timeout fire first and kill the actor itself."""
        if self._config.env_backend != "ray":
            return self._config.step_timeout_s
        from agentgym.rollout.ray_envs import DEFAULT_START_TIMEOUT_S

        return DEFAULT_START_TIMEOUT_S + 60.0

    def build(self, spec: EpisodeSpec) -> Any:
        """A new env for ``spec``: a Ray actor with ``env_backend: ray``, else ``gym.make`` in this process."""
        if self._config.env_backend == "ray":
            from agentgym.rollout.ray_envs import RayEnv

            self._close_idle_except(self._key(spec))  # their reserved resources may be what the new actor needs
            return RayEnv(spec.env_id, spec.env_kwargs, actor_options=self._config.ray_actor_options)
        import gymnasium as gym

        # Gymnasium's passive checker re-validates every first reset/step; registered envs are already
        # checked by check_agent_env, so the engine skips it (it costs ~0.4 ms per new env).
        registered = self._registered(spec)
        return gym.make(spec.env_id if registered is None else registered, disable_env_checker=True,
                        **dict(spec.env_kwargs))

    def _close_idle_except(self, key: str) -> None:
        """Close the idle envs kept for other env kwargs (Ray: each holds an actor's reservation)."""
        with self._lock:
            others = [k for k in self._idle if k != key and self._idle[k]]
            envs = [env for k in others for env in self._idle.pop(k)]
        for env in envs:
            _close_quietly(env)

    def release(self, spec: EpisodeSpec, env: Any) -> None:
        key = self._key(spec)
        with self._lock:
            self._idle[key].append(env)
            if key not in self._ids:  # the kwargs are the same for every env under one key
                self._ids[key] = (spec.env_id, _shown_by_value(spec.env_kwargs))

    def finish(self, spec: EpisodeSpec, env: Any, *, healthy: bool) -> None:
        """An episode is done with ``env``: keep it for the next episode if it ended cleanly, else discard it."""
        if healthy:
            self.release(spec, env)
        else:
            discard_env(env)

    def close(self) -> None:
        """End of the run: idle ``cheap_steps`` envs go to :data:`IDLE_CHEAP_ENVS` for later runs, the rest close."""
        with self._lock:
            idle = dict(self._idle)
            self._idle.clear()
        to_close: list[Any] = []
        for key, envs in idle.items():
            env_id, by_value = self._ids.get(key, ("", False))
            registered = self._specs.get(env_id)
            if envs and by_value and registered is not None and self._cheap.get(env_id):
                # the instance must agree with its class (one that holds a model opponent turns cheap_steps off)
                cheap: list[Any] = []
                for env in envs:
                    (cheap if getattr(env.unwrapped, "cheap_steps", False) is True else to_close).append(env)
                to_close.extend(IDLE_CHEAP_ENVS.keep(key, registered, cheap))
            else:
                to_close.extend(envs)
        for env in to_close:
            try:
                env.close()
            except Exception:
                logger.warning("closing an env failed", exc_info=True)


class IdleCheapEnvs:
    """Idle ``cheap_steps`` envs that runs leave behind, for later runs in this process to reuse (thread-safe).

    Only ``cheap_steps`` envs come here: their state is plain in-process data that ``reset`` starts afresh, exactly
    as when the engine reuses an env for the next episode of the same run. Each group remembers the registered
    spec its envs were built from, so an id registered again (another class, other defaults) never gets an old
    env. At most ``limit`` envs are kept in all: beyond it the groups used least recently are closed first, so
    runs whose episodes each pass other env kwargs cannot pile envs up.
    """

    def __init__(self, limit: int = 2048) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._groups: OrderedDict[str, tuple[Any, list[Any]]] = OrderedDict()  # least recently used first
        self._count = 0

    def take(self, key: str, registered: Any) -> Any | None:
        """An idle env built from ``registered`` (the id's current registered spec), or ``None``."""
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                return None
            if group[0] is registered:
                if not group[1]:
                    return None
                self._count -= 1
                return group[1].pop()
            del self._groups[key]  # registered again since: these envs are another env's
            self._count -= len(group[1])
            stale = group[1]
        for env in stale:
            discard_env(env)
        return None

    def keep(self, key: str, registered: Any, envs: list[Any]) -> list[Any]:
        """Keep ``envs`` (built from ``registered``) for later runs; returns the envs to close: those of an older
        registration of the id, and the least recently used beyond ``limit``."""
        to_close: list[Any] = []
        with self._lock:
            group = self._groups.pop(key, None)
            if group is not None and group[0] is not registered:
                to_close.extend(group[1])
                self._count -= len(group[1])
                group = None
            if group is None:
                group = (registered, [])
            self._groups[key] = group  # now the most recently used
            group[1].extend(envs)
            self._count += len(envs)
            while self._count > self.limit:
                oldest = next(iter(self._groups.values()))[1]
                excess = min(len(oldest), self._count - self.limit)
                to_close.extend(oldest[:excess])
                del oldest[:excess]
                self._count -= excess
                if not oldest:
                    self._groups.popitem(last=False)
        return to_close

    def __len__(self) -> int:
        with self._lock:
            return self._count

    def clear(self) -> None:
        """Close and forget every idle env (e.g. after changing an env class in place, or to free their memory)."""
        with self._lock:
            groups = list(self._groups.values())
            self._groups.clear()
            self._count = 0
        for _, envs in groups:
            for env in envs:
                _close_quietly(env)


IDLE_CHEAP_ENVS = IdleCheapEnvs()
"""The process's idle ``cheap_steps`` envs (see :class:`IdleCheapEnvs`); ``IDLE_CHEAP_ENVS.clear()`` drops them."""


def _shown_by_value(value: Any) -> bool:
    """Whether ``repr(value)`` is made of values only (plain data, the built-in containers and tasks of them), so
    equal keys mean equal env kwargs. An object shown by its address (``<Foo object at 0x...>``) is not: once it is
    freed, another object can take its address and its key, so envs built with such kwargs are never kept beyond
    their run. Exact types only: a subclass may show itself any way it likes."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return True
    if kind in (list, tuple, set, frozenset):
        return all(_shown_by_value(item) for item in value)
    if kind is dict or kind is MappingProxyType:
        return all(_shown_by_value(k) and _shown_by_value(v) for k, v in value.items())
    if kind is Task:
        return all(_shown_by_value(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def _registered_class(env_id: str) -> type | None:
    """The class ``env_id`` is registered with (``None`` when its entry point is not a class, or unknown)."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    try:
        entry_point = gym.spec(env_id).entry_point
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    except Exception:  # noqa: BLE001 - gym.make raises the real error, in the worker thread as before
        return None
    return creator if isinstance(creator, type) else None


def _class_says_cheap(env_id: str) -> bool:
    """``cheap_steps`` of the class ``env_id`` is registered with (``False`` when it is not a class, or unknown)."""
    return getattr(_registered_class(env_id), "cheap_steps", False) is True


def tasks_to_prepare(episodes: Sequence[EpisodeSpec], config: RolloutConfig) -> list[tuple[str, type, list[Task]]]:
    """``(env id, its class, the distinct tasks the episodes name)`` for each env class that overrides
    :meth:`agentgym.env.AgentEnv.prepare_tasks` (cheap: most classes build nothing, and a run then starts no
    thread for it). None for ``env_backend: ray``: its envs run on other nodes, whose files this process cannot
    build."""
    if config.env_backend == "ray":
        return []
    by_env: dict[str, dict[str, Task]] = defaultdict(dict)
    for spec in episodes:
        if spec.task is not None:
            by_env[spec.env_id].setdefault(spec.task.id, spec.task)
    jobs = []
    for env_id, tasks in by_env.items():
        cls = _registered_class(env_id)
        if cls is not None and prepares_tasks(cls):
            jobs.append((env_id, cls, list(tasks.values())))
    return jobs


def prepare_tasks(jobs: Sequence[tuple[str, type, list[Task]]]) -> None:
    """Run :func:`tasks_to_prepare`'s jobs (:func:`agentgym.reference.prepare_env_tasks`: one that fails is logged,
    and its episodes build what they need in ``reset``)."""
    for env_id, cls, tasks in jobs:
        prepare_env_tasks(cls, tasks, label=env_id)


DISCARD_THREAD_NAME = "agentgym-env-discard"
"""Name of the threads that close discarded envs: whoever tears down what those envs use (a Ray cluster, a docker
daemon) can wait for them first."""


def discard_env(env: Any) -> None:
    """Close an env that must not be reused (it failed, timed out or was abandoned), from a daemon thread: a
    close that hangs (a stuck browser, a dead sandbox) must hold up neither the episode loop nor process exit."""
    threading.Thread(target=_close_quietly, args=(env,), name=DISCARD_THREAD_NAME, daemon=True).start()


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:
        logger.debug("close of a failed env raised", exc_info=True)
