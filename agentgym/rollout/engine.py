"""The rollout engine: many episodes at once, policy calls batched across episodes, env steps concurrent.

One engine serves evaluation and training. Each episode is a coroutine: reset the env (in a worker
thread), ask the policy for an action, step the env (in a worker thread, under a timeout), repeat. Policy
requests from all episodes meet in a :class:`PolicyBatcher`, which sends whatever is queued as one batch
as soon as the policy has a free slot. Episodes therefore pipeline: while some wait on slow tools,
others generate, and no turn waits for the slowest episode of a synchronous batch.

An env that raises or hangs ends only its own episode (``end_reason="error"``); finished trajectories
are streamed to JSONL as they complete, so a crash of the whole process loses no finished episode, and a
trajectory that cannot be written is counted (``stats["write_failures"]``) without costing the others.

The step timeout counts only the time an env call runs, never the time it waited for a free worker. Env
calls run on :class:`EnvExecutor`'s daemon threads: a call that runs past the timeout ends its episode,
its env is abandoned (closed from another thread, never reused), a fresh worker takes the stuck one's
place, and a call that never returns cannot keep the process from exiting (``ThreadPoolExecutor`` joins
its threads at exit). Sandboxed code has its own, shorter limit inside the sandbox, so a stuck sandbox
call still comes back; only in-process Python that never returns leaves a thread behind, and that thread
holds nothing but its abandoned env.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
import traceback
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError, ContextLengthExceeded
from agentgym.utils.fast_records import quick_init
from agentgym.utils.gc_tuning import relaxed_gc
from agentgym.utils.images import ImageRef, observation_parts
from agentgym.policies.base import Generation, GenerationRequest, Policy, SamplingParams
from agentgym.storage import TrajectoryWriter
from agentgym.suite import Task, TaskSuite
from agentgym.trajectory import Trajectory, Turn, jsonable

__all__ = ["DISCARD_THREAD_NAME", "IDLE_CHEAP_ENVS", "act_per_request", "apply_action", "apply_action_inline",
           "call_env", "context_limit_outcome", "context_limit_reached", "discard_env", "EnvExecutor",
           "episode_outcome", "episodes_for_suite", "EpisodeSpec", "error_outcome", "IdleCheapEnvs", "keyed_step",
           "log_context_refusal", "PolicyBatcher", "read_state_key", "RolloutConfig", "RolloutEngine",
           "run_coroutine", "run_reference_episode", "summarize", "TurnResult"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutConfig:
    """How the engine runs episodes.

    Attributes:
        max_in_flight: Episodes running at once.
        sampling: Sampling parameters for every turn.
        step_timeout_s: An env ``reset``/``step`` running longer ends its episode with ``error`` (the time
            counts from when the call starts running, not from when it was queued for a worker).
        env_workers: Threads that run env ``reset``/``step`` calls (daemon threads, see :class:`EnvExecutor`).
        max_context_tokens: When the prompt plus ``sampling.max_tokens`` would exceed this, the episode ends
            with ``context_limit`` (token-level policies only).
        system_prompt: Replaces the env's instructions as the system prompt. ``None`` uses the policy's
            ``default_system_prompt`` (the prompt a trained model was trained with), else the env's instructions.
        observation_role: Chat role of observations after the first (``user`` or ``tool``).
        template_tools: ``auto`` passes the env's ``info["tools"]`` to the chat template (``tools=``, each
            family's native tool format; templates without tools ignore them); ``never`` leaves tools to the
            system prompt text only.
        batch_window_s: How long the batcher waits for more requests before sending a batch.
        deterministic: Send a policy batch only when every running episode waits for the policy, in
            episode order. Runs are then reproducible (training and exact resume rely on it), at the cost
            of the overlap between env steps and generation. In both modes each request carries its own
            seed derived from ``sampling.seed``, the episode and the turn (``None`` stays unseeded), so turns
            sample fresh randomness. In-process policies (HFPolicy, VLLMPolicy) draw each request from its own
            seeded stream, so a seeded run samples the same tokens however timing groups requests into
            batches; ``deterministic`` also fixes the batches themselves, which removes the last float-level
            differences between batch shapes (and the order of env steps).
        progress: Show a progress bar of finished episodes: ``"auto"`` (default) shows it when stderr is a
            terminal, ``True``/``False`` force it on or off.
        env_backend: ``local`` runs envs in this process (worker threads); ``ray`` runs each env in a Ray actor
            anywhere in the cluster this process is connected to (:mod:`agentgym.rollout.ray_envs`), while the policy
            and its batching stay here.
        ray_actor_options: Ray actor options for ``env_backend: ray`` (e.g. ``{"num_cpus": 1}``), merged over
            :data:`agentgym.rollout.ray_envs.DEFAULT_ACTOR_OPTIONS`.
        constrain_actions: Decode each reply as one of the env's valid actions
            (:meth:`~agentgym.env.AgentEnv.action_choices`, asked every turn) instead of free text: no turn is
            void and the tokens the choice forces are left out of training (``Turn.action_forced``). Needs a
            policy that ``supports_choices`` (HFPolicy) and an env with a finite action set (BabyAI, Sokoban,
            Maze); an env without one ends its episodes with an error that says so.
        gc_threshold: While a run is in progress, the garbage collector's youngest generation runs every
            ``gc_threshold`` net allocations instead of CPython's 700 (:mod:`agentgym.utils.gc_tuning`): each turn
            allocates many short-lived objects next to many long-lived ones, and frequent collections walked
            them all. The interpreter's thresholds come back when the run ends. ``None`` leaves the collector
            alone.
    """

    max_in_flight: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    step_timeout_s: float = 60.0
    env_workers: int = 32
    max_context_tokens: int | None = None
    system_prompt: str | None = None
    observation_role: str = "user"
    template_tools: str = "auto"
    batch_window_s: float = 0.002
    deterministic: bool = False
    progress: bool | str = "auto"
    env_backend: str = "local"
    ray_actor_options: Mapping[str, Any] | None = None
    constrain_actions: bool = False
    gc_threshold: int | None = 20_000

    def __post_init__(self) -> None:
        if self.gc_threshold is not None and (type(self.gc_threshold) is not int or self.gc_threshold < 1):
            raise ConfigError(f"gc_threshold must be a positive number of allocations (20000: the default) or None "
                              f"(leave the garbage collector alone), got {self.gc_threshold!r}.")
        if not isinstance(self.constrain_actions, bool):
            raise ConfigError(f"constrain_actions must be true or false, got {self.constrain_actions!r}.")
        if self.constrain_actions and self.sampling.choices:
            raise ConfigError("Set either constrain_actions (the env lists the choices every turn) or "
                              "sampling.choices (one fixed list), not both.")
        if self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {self.max_in_flight}.")
        if self.step_timeout_s <= 0:
            raise ConfigError(f"step_timeout_s must be > 0 seconds, got {self.step_timeout_s}.")
        if self.env_workers < 1:
            raise ConfigError(f"env_workers must be >= 1, got {self.env_workers}.")
        if self.max_context_tokens is not None and self.max_context_tokens <= self.sampling.max_tokens:
            raise ConfigError(
                f"max_context_tokens ({self.max_context_tokens}) must exceed sampling.max_tokens "
                f"({self.sampling.max_tokens}), or no turn fits."
            )
        if self.observation_role not in ("user", "tool"):
            raise ConfigError(f"observation_role must be 'user' or 'tool', got {self.observation_role!r}.")
        if self.template_tools not in ("auto", "never"):
            raise ConfigError(f"template_tools must be 'auto' or 'never', got {self.template_tools!r}.")
        if self.env_backend not in ("local", "ray"):
            raise ConfigError(f"env_backend must be 'local' or 'ray' (env workers as Ray actors), got {self.env_backend!r}.")
        if self.ray_actor_options is not None and self.env_backend != "ray":
            raise ConfigError("ray_actor_options applies to env_backend='ray' only; set env_backend='ray' or drop it.")
        if not isinstance(self.progress, bool) and self.progress != "auto":
            raise ConfigError(f"progress must be True, False or 'auto' (a bar when stderr is a terminal), "
                              f"got {self.progress!r}.")


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: which env, which task (or none: the env samples one from the seed), which seed."""

    env_id: str
    task: Task | None = None
    seed: int | None = None
    group_id: str = ""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    sampling_seed: int | None = None
    """The episode's own sampling seed: turn ``t`` samples with a seed derived from it and ``t`` alone, so its
    randomness depends on nothing else (not its position in the run, the rank that runs it, the batches timing
    forms, or how many episodes run at once). ``None``: derived from ``RolloutConfig.sampling.seed`` and the
    episode's index in the run."""


def episodes_for_suite(
    suite: TaskSuite, split: str = "test", *, group_size: int = 1, seed: int = 0, limit: int | None = None
) -> list[EpisodeSpec]:
    """Episode specs for a suite split: ``group_size`` rollouts per task, seeds derived from ``seed``."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}.")
    tasks = suite.split(split)
    if limit is not None:
        tasks = tasks[:limit]
    specs = []
    for i, task in enumerate(tasks):
        for g in range(group_size):
            specs.append(
                EpisodeSpec(env_id=suite.env_id, task=task, seed=seed + i * group_size + g,
                            group_id=f"{suite.name}/{task.id}", env_kwargs=dict(suite.env_kwargs))
            )
    return specs


class PolicyBatcher:
    """Collects generation requests from episodes and sends them to the policy in batches."""

    def __init__(self, policy: Policy, window_s: float, deterministic: bool = False) -> None:
        self.policy = policy
        self.window_s = window_s
        self.deterministic = deterministic
        self.running = 0  # episodes started and not finished (deterministic mode waits for all of them)
        self.queue: list[tuple[int, GenerationRequest, asyncio.Future[Generation]]] = []
        self.wakeup = asyncio.Event()
        self.slots = asyncio.Semaphore(max(1, policy.max_concurrency))
        self.calls = 0
        self._task: asyncio.Task[None] | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._inflight: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._task = self._event_loop.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for t in list(self._inflight):
            t.cancel()

    def submit(self, request: GenerationRequest, order: int = 0) -> asyncio.Future[Generation]:
        """Queue ``request`` for the next batch; await the returned future for its generation.

        A plain function returning the future, not a coroutine: each turn's wake-up then resumes one coroutine
        frame fewer (call it after :meth:`start`, on the loop it started on)."""
        future: asyncio.Future[Generation] = (self._event_loop or asyncio.get_running_loop()).create_future()
        self.queue.append((order, request, future))
        self.wakeup.set()
        return future

    def episode_started(self) -> None:
        self.running += 1

    def episode_finished(self) -> None:
        self.running -= 1
        self.wakeup.set()

    def _ready(self) -> bool:
        if not self.queue:
            return False
        if not self.deterministic:
            return True
        return len(self.queue) >= min(self.running, self.policy.max_batch_size)

    async def _loop(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            if not self._ready():
                continue
            await self.slots.acquire()
            if (not self.deterministic and self.window_s and self.policy.max_batch_size > 1
                    and len(self.queue) < self.policy.max_batch_size):
                await asyncio.sleep(self.window_s)
            if not self._ready():
                self.slots.release()
                continue
            if self.deterministic:
                self.queue.sort(key=lambda item: item[0])
            batch = self.queue[: self.policy.max_batch_size]
            del self.queue[: len(batch)]
            if self.queue:
                self.wakeup.set()
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _run(self, batch: list[tuple[int, GenerationRequest, asyncio.Future[Generation]]]) -> None:
        try:
            self.calls += 1
            generations = await act_per_request(self.policy, [request for _, request, _ in batch])
            for (_, _, fut), gen in zip(batch, generations):
                if fut.done():
                    continue
                if isinstance(gen, ContextLengthExceeded):
                    fut.set_exception(gen)
                else:
                    fut.set_result(gen)
        except BaseException as exc:  # noqa: BLE001 - forwarded to every waiting episode
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        finally:
            self.slots.release()
            self.wakeup.set()


async def act_per_request(policy: Policy, requests: Sequence[GenerationRequest]) -> list[Generation | ContextLengthExceeded]:
    """``policy.act(requests)``, where a prompt too long for the model fails only its own request.

    A batch the policy refuses with :class:`ContextLengthExceeded` is asked again one request at a time, so the
    episodes whose prompts fit still get their turn; each request that does not fit gets its error in its place.
    Any other failure is raised as before (it ends every episode of the batch).

    Raises:
        RuntimeError: The policy returned a different number of generations than requests.
    """
    try:
        generations: list[Generation | ContextLengthExceeded] = list(await policy.act(requests))
    except ContextLengthExceeded as exc:
        if len(requests) == 1:
            return [exc]
        generations = []
        for request in requests:
            generations.extend(await act_per_request(policy, [request]))
    if len(generations) != len(requests):
        raise RuntimeError(f"policy returned {len(generations)} generations for {len(requests)} requests")
    return generations


class EnvExecutor(concurrent.futures.Executor):
    """Runs env calls on at most ``workers`` daemon threads (started as calls need them), replacing a thread stuck in
    a timed-out call.

    Why not ``ThreadPoolExecutor``: Python joins its worker threads at interpreter exit, so a single env step
    that never returns keeps the whole process alive after the rollout has ended. Daemon threads are not
    joined; a stuck one is left behind with its abandoned env, and :meth:`replace_stuck_worker` starts
    another so the pool keeps its capacity. (Threads, not processes: envs hold sandboxes, browsers and
    sockets that cannot be moved to a child process, and their slow parts already run in one.)
    """

    def __init__(self, workers: int, name: str = "agentgym-env") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._name = name
        self._workers = max(1, workers)
        self._active = 0  # threads started and not replaced as stuck: the ones that count against ``workers``
        self._threads: list[threading.Thread] = []
        self._stuck: set[threading.Thread] = set()
        # Threads start on demand (a submit that finds none idle), up to ``workers``: a rollout whose envs all step
        # inline never starts one, where it used to start and join eight per run. One token per idle thread, in a
        # SimpleQueue rather than a Semaphore: a worker never takes a Python lock after a call (see _work).
        self._idle: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._closed = False

    def _spawn(self) -> None:
        self._active += 1
        thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("EnvExecutor is shut down; env calls cannot be scheduled after the rollout ended.")
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._queue.put((future, fn, args, kwargs))
            try:
                self._idle.get_nowait()
            except queue.Empty:
                if self._active < self._workers:
                    self._spawn()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - delivered to the waiting episode
                    future.set_exception(exc)
            del future, fn, args, kwargs
            # Lock-free test first: taking the lock after every call made submit() wait on workers that wait on
            # the GIL (a switch interval each), about 0.4 ms a submit with 256 episodes starting at once.
            if self._stuck and threading.current_thread() in self._stuck:
                with self._lock:  # it was replaced while stuck: keep the count
                    self._stuck.discard(threading.current_thread())
                return
            if self._queue.empty():  # going idle: say so; with calls queued it takes one without a token
                self._idle.put(None)

    def replace_stuck_worker(self, thread: threading.Thread) -> None:
        """``thread`` runs a call that is past its timeout: start a replacement; ``thread`` exits when it returns."""
        with self._lock:
            if self._closed or thread in self._stuck or thread not in self._threads:
                return
            self._stuck.add(thread)
            self._active -= 1
            self._spawn()  # at once, not at the next submit: an idle token may be stale, and calls may be queued

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)
        if wait:  # a stuck thread may never return; it is a daemon and is not waited for
            for thread in self._threads:
                if thread not in self._stuck:
                    thread.join()


class _EnvPool:
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

            import agentgym  # noqa: F401 - registers ids

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

    def build(self, spec: EpisodeSpec) -> Any:
        """A new env for ``spec``: a Ray actor with ``env_backend: ray``, else ``gym.make`` in this process."""
        if self._config.env_backend == "ray":
            from agentgym.rollout.ray_envs import RayEnv

            return RayEnv(spec.env_id, spec.env_kwargs, actor_options=self._config.ray_actor_options)
        import gymnasium as gym

        # Gymnasium's passive checker re-validates every first reset/step; registered envs are already
        # checked by check_agent_env, so the engine skips it (it costs ~0.4 ms per new env).
        registered = self._registered(spec)
        return gym.make(spec.env_id if registered is None else registered, disable_env_checker=True,
                        **dict(spec.env_kwargs))

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


def _class_says_cheap(env_id: str) -> bool:
    """``cheap_steps`` of the class ``env_id`` is registered with (``False`` when it is not a class, or unknown)."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import agentgym  # noqa: F401 - registers ids

    try:
        entry_point = gym.spec(env_id).entry_point
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    except Exception:  # noqa: BLE001 - gym.make raises the real error, in the worker thread as before
        return False
    return isinstance(creator, type) and getattr(creator, "cheap_steps", False) is True


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


class RolloutEngine:
    """Run episodes with a policy; see the module docstring for how work overlaps.

    Args:
        policy: Any :class:`Policy`. When it has a tokenizer, trajectories carry exact token ids.
        config: Engine settings.
    """

    def __init__(self, policy: Policy, config: RolloutConfig | None = None) -> None:
        self.policy = policy
        self.config = config or RolloutConfig()
        self.stats: dict[str, Any] = {}
        self._run_id = ""

    def _sampling_for(self, spec: EpisodeSpec, episode_index: int, turn: int) -> SamplingParams:
        # Every (episode, turn) gets its own seed in both modes: one seed reused on every turn replays one random
        # stream, so a sampled policy repeated the same turn over and over.
        if spec.sampling_seed is not None and self.config.sampling.seed is not None:
            return turn_sampling(dataclasses.replace(self.config.sampling, seed=spec.sampling_seed), 0, turn)
        return turn_sampling(self.config.sampling, episode_index, turn)

    def run(
        self,
        episodes: Sequence[EpisodeSpec],
        *,
        writer: TrajectoryWriter | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run all episodes and return their trajectories in the order of ``episodes``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_coroutine(self.arun(episodes, writer=writer, on_trajectory=on_trajectory))
        raise RuntimeError("RolloutEngine.run() was called inside a running event loop; use 'await engine.arun(...)'.")

    async def arun(
        self,
        episodes: Sequence[EpisodeSpec],
        *,
        writer: TrajectoryWriter | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Async version of :meth:`run`."""
        with relaxed_gc(self.config.gc_threshold):
            return await self._arun(list(episodes), writer=writer, on_trajectory=on_trajectory)

    async def _arun(self, episodes: list[EpisodeSpec], *, writer: TrajectoryWriter | None,
                    on_trajectory: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        if self.config.constrain_actions and not getattr(self.policy, "supports_choices", False):
            raise ConfigError(f"constrain_actions needs a policy that decodes under SamplingParams.choices; "
                              f"{type(self.policy).__name__} does not (HFPolicy does). Turn constrain_actions off.")
        self._run_id = uuid.uuid4().hex[:8]
        results: list[Trajectory | None] = [None] * len(episodes)
        batcher = PolicyBatcher(self.policy, self.config.batch_window_s, self.config.deterministic)
        batcher.start()
        pool = _EnvPool(self.config)
        executor = EnvExecutor(self.config.env_workers)
        write_failures = 0
        limiter = asyncio.Semaphore(self.config.max_in_flight)
        progress = _Progress(len(episodes), enabled=self.config.progress)
        started = time.perf_counter()

        async def run_one(index: int, spec: EpisodeSpec) -> None:
            async with limiter:
                batcher.episode_started()
                try:
                    traj = await self._episode(spec, index, batcher, pool, executor)
                finally:
                    batcher.episode_finished()
            results[index] = traj
            if writer is not None:
                nonlocal write_failures
                try:
                    if not await asyncio.to_thread(writer.write, traj):
                        write_failures += 1  # kept in the writer's errors file
                except Exception:  # noqa: BLE001 - e.g. disk full: this trajectory is returned, the rest go on
                    write_failures += 1
                    logger.exception("writing trajectory %s to %s failed", traj.traj_id, writer.path)
            if on_trajectory is not None:
                on_trajectory(traj)
            progress.advance(traj)

        try:
            with progress:
                await asyncio.gather(*(run_one(i, s) for i, s in enumerate(episodes)))
        finally:
            await batcher.stop()
            pool.close()
            executor.shutdown(wait=False, cancel_futures=True)
        finished = [r for r in results if r is not None]
        errors = [t for t in finished if t.end_reason == "error"]
        self.stats = {"policy_calls": batcher.calls, "episodes": len(episodes), "errors": len(errors),
                      "write_failures": write_failures, "wall_s": time.perf_counter() - started}
        if errors:  # trainers drop these episodes: say so, with a reason, instead of training on less silently
            logger.warning("%d of %d episodes ended with end_reason='error' (first: %s)", len(errors),
                           len(finished), error_reason(errors[0]))
        forks = sum(int(t.metadata.get("template_forks", 0)) for t in finished)
        mismatches = sum(int(t.metadata.get("prompt_mismatches", 0)) for t in finished)
        if forks or mismatches:  # once per run: the linear sequence is what was trained on, the render differs
            logger.info("chat template: %d turn(s) differ from a fresh render (template forks); %d action(s) sampled "
                        "from another prompt kept text without ids", forks, mismatches)
        return finished

    async def _call_env(self, executor: concurrent.futures.Executor, fn: Callable[..., Any], *args: Any,
                        inline: bool = False, **kwargs: Any) -> Any:
        return await call_env(executor, self.config.step_timeout_s, fn, *args, inline=inline, **kwargs)

    async def _episode(
        self, spec: EpisodeSpec, index: int, batcher: PolicyBatcher, pool: _EnvPool,
        executor: concurrent.futures.Executor,
    ) -> Trajectory:
        cfg = self.config
        episode_id = f"{self._run_id}-{index}"
        t0 = time.perf_counter()
        policy_s = env_s = 0.0
        turns: list[Turn] = []
        outcome: dict[str, Any] = {}
        error: str | None = None
        env: Any = None
        healthy = False
        task_id = spec.task.id if spec.task is not None else ""
        try:
            env = pool.take_idle(spec)
            if env is None:
                env = await self._call_env(executor, pool.build, spec, inline=pool.cheap_to_make(spec))
            options = {"task": spec.task} if spec.task is not None else None
            inline = bool(getattr(env.unwrapped, "cheap_steps", False))
            te = time.perf_counter()
            observation, info = await self._call_env(executor, env.reset, seed=spec.seed, options=options, inline=inline)
            env_s += time.perf_counter() - te
            task_id = info.get("task_id", task_id)
            self.policy.begin_episode(episode_id, env)
            agent = open_conversation(self.policy, cfg, info, observation)
            observation = _text_of(observation)
            # decided once per episode, not per turn: without a tokenizer no context limit applies, and without a
            # seed every turn samples with the config's own parameters
            limited = cfg.max_context_tokens is not None and self.policy.tokenizer is not None
            fixed_sampling = cfg.sampling if cfg.sampling.seed is None else None
            while True:
                if limited and context_limit_reached(agent, self.policy, cfg):
                    outcome = context_limit_outcome()
                    healthy = True
                    break
                sampling = fixed_sampling if fixed_sampling is not None else self._sampling_for(spec, index, len(turns))
                if cfg.constrain_actions:  # an env call like any other: a Ray env answers from its actor
                    choices = await self._call_env(executor, action_choices_of, env, inline=inline)
                    sampling = dataclasses.replace(sampling, choices=choices)
                tp = time.perf_counter()
                try:
                    generation = await batcher.submit(agent.request(sampling, episode_id), index)
                except ContextLengthExceeded as exc:  # the model refused the prompt as too long: a truncation
                    log_context_refusal(exc, turns_taken=len(turns))
                    outcome = context_limit_outcome()
                    healthy = True
                    break
                policy_s += time.perf_counter() - tp
                step = apply_action_inline(self.policy, agent, env, observation, generation) if inline else \
                    await apply_action(self.policy, agent, env, observation, generation, executor, cfg.step_timeout_s,
                                       inline=False)
                env_s += step.env_s
                turns.append(step.turn)
                observation = step.observation
                if step.outcome is not None:
                    outcome = step.outcome
                    healthy = outcome.get("end_reason") != "error"
                    break
        except TimeoutError:
            error = (f"env call exceeded step_timeout_s={cfg.step_timeout_s} (counted from when it started running; "
                     "raise RolloutConfig.step_timeout_s if the env is slow but healthy)")
        except Exception as exc:  # noqa: BLE001 - an episode's failure must not end the others
            error = f"{type(exc).__name__}: {exc}"
            logger.debug("episode %s failed:\n%s", episode_id, traceback.format_exc())
        finally:
            self.policy.end_episode(episode_id)
            if env is not None:
                pool.finish(spec, env, healthy=healthy)
        metadata: dict[str, Any] = {}
        if error is not None:
            outcome = error_outcome()
        elif turns:
            metadata = final_state(agent, observation)
        timing = {"policy_s": policy_s, "env_s": env_s, "wall_s": time.perf_counter() - t0}
        return Trajectory(
            env_id=spec.env_id, task_id=task_id, seed=spec.seed, turns=tuple(turns), outcome=outcome,
            end_reason=str(outcome.get("end_reason", "error")), policy=self.policy.name, timing=timing,
            traj_id=episode_id, group_id=spec.group_id, error=error, metadata=metadata,
        )


_Result = TypeVar("_Result")


def run_coroutine(coroutine: Coroutine[Any, Any, _Result]) -> _Result:
    """``asyncio.run(coroutine)`` for a coroutine with a large result, without Python formatting that result.

    Why: on the main thread ``asyncio.run`` puts back its Ctrl-C handler on the way out, and on CPython 3.11
    reading the handler formats ``repr`` of the finished main task, result included: for a list of trajectories,
    every turn of the first six in full, about 8 ms for 256 episodes of 20 turns with token ids, per run.
    """
    results: list[_Result] = []

    async def main() -> None:
        results.append(await coroutine)

    asyncio.run(main())
    return results[0]


def action_choices_of(env: Any) -> tuple[str, ...]:
    """The env's valid replies for this turn (``env.unwrapped.action_choices()``), for ``constrain_actions``.

    Raises:
        ConfigError: The env has no finite action set to decode into.
    """
    ask = getattr(getattr(env, "unwrapped", env), "action_choices", None)
    choices = ask() if callable(ask) else None
    if not choices:
        name = getattr(getattr(env, "spec", None), "id", None) or type(getattr(env, "unwrapped", env)).__name__
        raise ConfigError(f"constrain_actions is on but {name} lists no action choices (its actions take free "
                          "text); turn constrain_actions off for this env.")
    return tuple(choices)


def turn_sampling(sampling: SamplingParams, episode_index: int, turn: int) -> SamplingParams:
    """Deterministic runs: each (episode, turn) request gets its own seed derived from ``sampling.seed``."""
    if sampling.seed is None:
        return sampling
    seed = (sampling.seed * 1_000_003 + episode_index * 1009 + turn) % (2**63 - 1)
    return dataclasses.replace(sampling, seed=seed)


async def call_env(executor: concurrent.futures.Executor, timeout_s: float, fn: Callable[..., Any], *args: Any,
                   inline: bool = False, **kwargs: Any) -> Any:
    """Run an env call in a worker thread, inline for ``cheap_steps`` envs.

    ``timeout_s`` counts from the moment a worker starts the call: time spent queued behind other episodes'
    env calls is the engine's business, not the env's, and must not turn a healthy slow env into an error.

    Raises:
        TimeoutError: The call ran longer than ``timeout_s`` (its worker is replaced, see :class:`EnvExecutor`).
    """
    if inline:
        return fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    started: asyncio.Future[tuple[float, threading.Thread]] = loop.create_future()

    def job() -> Any:
        try:
            loop.call_soon_threadsafe(_resolve, started, (time.monotonic(), threading.current_thread()))
        except RuntimeError:  # the event loop is gone: the rollout ended while this call was queued
            return None
        return fn(*args, **kwargs)

    done = loop.run_in_executor(executor, job)
    await asyncio.wait((started, done), return_when=asyncio.FIRST_COMPLETED)
    if not done.done():
        start, thread = started.result()
        remaining = start + timeout_s - time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout=max(remaining, 0.0))
        except TimeoutError:
            done.cancel()
            if isinstance(executor, EnvExecutor):
                executor.replace_stuck_worker(thread)
            raise
    started.cancel()
    return done.result()


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def open_conversation(policy: Policy, config: RolloutConfig, reset_info: Mapping[str, Any], observation: Any) -> ChatAgent:
    """The agent's conversation after ``env.reset``: system prompt (the config's, else the policy's default), the
    env's instructions and first observation (a ``str``, or ``{"text", "image"}`` whose image the agent shows a
    policy that ``accepts_images``), and the env's tool schemas for chat templates that render tools natively
    (``template_tools: auto``; templates without tools ignore them). Shared by the engine and the branching
    sampler, so a branched group is prompted exactly as independent rollouts are."""
    system_prompt = config.system_prompt if config.system_prompt is not None else policy.default_system_prompt
    agent = ChatAgent(policy.tokenizer, system_prompt=system_prompt, observation_role=config.observation_role,
                      images=policy.accepts_images, processor=policy.processor)
    tools = reset_info.get("tools") if config.template_tools == "auto" else None
    text, images = observation_parts(observation)
    agent.start(str(reset_info.get("instructions", "")), text, tools=tools or None, images=images)
    return agent


def context_limit_reached(agent: ChatAgent, policy: Policy, config: RolloutConfig) -> bool:
    """Whether the next turn could overflow ``config.max_context_tokens`` (prompt so far plus a full turn).

    Checked before every generation, by the engine and the branching sampler alike: the episode then ends
    as a truncation (:func:`context_limit_outcome`) instead of sending the model a prompt it cannot take.
    Policies without a tokenizer count no tokens, so the limit does not apply to them.
    """
    return (config.max_context_tokens is not None and policy.tokenizer is not None
            and agent.num_tokens + config.sampling.max_tokens > config.max_context_tokens)


def context_limit_outcome() -> dict[str, Any]:
    """The outcome of an episode stopped by the context limit: a truncation that failed, score 0."""
    return {"success": False, "score": 0.0, "end_reason": "context_limit"}


_first_prompt_refusal_logged = False


def log_context_refusal(exc: ContextLengthExceeded, *, turns_taken: int) -> None:
    """Log that the model refused an episode's prompt as too long (the episode ends as ``context_limit``).

    A refused first prompt is a warning, logged once per process: no turn fitted at all, which is a setting (a
    system prompt or ``max_tokens`` too large for the model's context) rather than an episode that grew too long,
    and every episode would otherwise end quietly with no turns.
    """
    global _first_prompt_refusal_logged
    if turns_taken or _first_prompt_refusal_logged:
        logger.debug("prompt refused as too long after %d turns: %s", turns_taken, exc)
        return
    _first_prompt_refusal_logged = True
    logger.warning("The model refused an episode's first prompt as too long (%s). Such episodes end with "
                   "end_reason='context_limit' and no turns: shorten the system prompt, lower sampling.max_tokens, or "
                   "serve the model with a longer context.", exc)


def error_reason(trajectory: Trajectory) -> str:
    """Why an episode ended with ``end_reason="error"``: the engine's own error, else the error the env reported on
    its last turn (a crashed browser, a dead sandbox), which ``Trajectory.error`` does not carry."""
    if trajectory.error:
        return trajectory.error
    errors = trajectory.turns[-1].info.get("errors") if trajectory.turns else None
    return str(errors[-1]) if errors else "the env ended the episode with end_reason='error' and gave no reason"


def error_outcome() -> dict[str, Any]:
    """The outcome of an episode that failed (env error, timeout, policy error): not a success, score 0."""
    return {"success": False, "score": 0.0, "end_reason": "error"}


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


def make_turn(observation: str, generation: Generation, reward: float, step_info: Mapping[str, Any],
              prompt_ids: tuple[int, ...] | None, action_ids: tuple[int, ...] | None,
              state_key: str | None = None, images: tuple[ImageRef, ...] = ()) -> Turn:
    """The :class:`Turn` record of one generated action and the env's answer to it."""
    return Turn(
        images=images,
        observation=observation, action=generation.text, reward=float(reward),
        info=jsonable(step_info.get("turn", {})), prompt_token_ids=prompt_ids, action_token_ids=action_ids,
        action_logprobs=generation.logprobs if action_ids is not None else None,
        action_entropies=generation.entropies if action_ids is not None else None,
        action_forced=generation.forced if action_ids is not None else None,
        finish_reason=generation.finish_reason, state_key=state_key,
    )


@quick_init
@dataclass(frozen=True)
class TurnResult:
    """What one applied action produced: its :class:`Turn`, the next observation's text, and the episode's
    outcome when this action ended it (``None`` while it goes on)."""

    turn: Turn
    observation: str
    outcome: dict[str, Any] | None
    env_s: float


async def apply_action(policy: Policy, agent: ChatAgent, env: Any, observation: str, generation: Generation,
                       executor: concurrent.futures.Executor, timeout_s: float, *, inline: bool) -> TurnResult:
    """One turn after the policy answered: record the action in the conversation, read the env's anchor state
    and step the env with it (one env call, see :func:`keyed_step`), then add the env's answer to the
    conversation. The engine and the branching sampler both take every turn through here (or, for an env that
    steps inline, through :func:`apply_action_inline`, its synchronous form), so a trajectory records the same
    fields whichever sampler made it.

    Raises:
        TimeoutError: The env call ran past ``timeout_s``; any error the env's ``step`` raised.
    """
    if inline:
        return apply_action_inline(policy, agent, env, observation, generation)
    prompt_ids, images, action_ids = _record_action(policy, agent, generation)
    started = time.perf_counter()
    state_key, result = await call_env(executor, timeout_s, keyed_step, env, generation.text)
    return _finish_turn(agent, observation, generation, result, state_key, prompt_ids, action_ids, images,
                        time.perf_counter() - started)


def apply_action_inline(policy: Policy, agent: ChatAgent, env: Any, observation: str,
                        generation: Generation) -> TurnResult:
    """:func:`apply_action` for a ``cheap_steps`` env, stepped right here: no coroutine to create and resume per
    turn, which the engine's hot loop would otherwise pay on every turn of every inline env."""
    prompt_ids, images, action_ids = _record_action(policy, agent, generation)
    started = time.perf_counter()
    state_key, result = keyed_step(env, generation.text)
    return _finish_turn(agent, observation, generation, result, state_key, prompt_ids, action_ids, images,
                        time.perf_counter() - started)


def _record_action(policy: Policy, agent: ChatAgent,
                   generation: Generation) -> tuple[tuple[int, ...] | None, tuple[ImageRef, ...], tuple[int, ...] | None]:
    """Put the action into the conversation; the prompt ids and images the turn records, and the action's ids."""
    prompt_ids = tuple(agent.pending_prompt_ids) if policy.tokenizer is not None else None
    images = agent.observation_images
    return prompt_ids, images, agent.record_action(generation)


def _finish_turn(agent: ChatAgent, observation: str, generation: Generation, result: tuple[Any, ...],
                 state_key: str | None, prompt_ids: tuple[int, ...] | None, action_ids: tuple[int, ...] | None,
                 images: tuple[ImageRef, ...], env_s: float) -> TurnResult:
    """The turn's record from the env's answer, which goes into the conversation."""
    next_obs, reward, terminated, truncated, info = result
    turn = make_turn(observation, generation, reward, info, prompt_ids, action_ids, state_key, images)
    next_text, next_images = observation_parts(next_obs)
    agent.add_observation(next_text, images=next_images)
    outcome = episode_outcome(info, truncated) if terminated or truncated else None
    return TurnResult(turn=turn, observation=next_text, outcome=outcome, env_s=env_s)


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


def final_state(agent: ChatAgent, observation: str) -> dict[str, Any]:
    """Trajectory metadata for the observation after the last action, which no turn records.

    A critic bootstraps from it when an episode is truncated (spec 2.3: ``V(s')`` of the state the time limit
    cut off), and a report shows it (the env's last word: "Correct!", the final page). ``observation`` must
    already be in ``agent``'s conversation (its last message); its rendered token ids come with it.
    """
    out: dict[str, Any] = {"final_observation": observation}
    if agent.observation_images:  # saved beside the JSONL like every turn's images
        out["final_images"] = list(agent.observation_images)
    if agent.tokenizer is not None:
        out["final_prompt_token_ids"] = list(agent.pending_prompt_ids)
        # Turns where a fresh template render differs from the linear sampled sequence, and actions sampled
        # from a prompt other than the agent's (their ids are not recorded): see ChatAgent.
        out["template_forks"] = agent.template_forks
        out["prompt_mismatches"] = agent.prompt_mismatches
    return out


def _text_of(observation: Any) -> str:
    """The text part of an observation (GUI envs return ``{"text", "image"}``)."""
    if isinstance(observation, Mapping):
        return str(observation.get("text", ""))
    return str(observation)


class _Progress:
    """Finished episodes and the running success rate, on the shared bar (:mod:`agentgym.utils.progress`)."""

    def __init__(self, total: int, enabled: bool | str) -> None:
        from agentgym.utils.progress import ProgressBar

        self.total = total
        self.done = 0
        self.successes = 0
        self._bar = ProgressBar(total, "episodes", enabled=enabled, unit="ep")

    def __enter__(self) -> _Progress:
        self._bar.__enter__()
        return self

    def advance(self, traj: Trajectory) -> None:
        self.done += 1
        self.successes += int(traj.success)
        if self._bar.enabled:  # the text is formatted only for a bar someone sees
            self._bar.advance(info=f"success {self.successes / self.done:.2f}")

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Aggregate eval metrics: success rate, mean turns, tool calls, tokens, errors, time.

    ``mean_action_tokens`` averages over the episodes whose every turn recorded its sampled token ids; it is
    ``None`` when no episode did (chat-mode policies), so reports show "n/a" rather than a false 0.
    """
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    ends: dict[str, int] = defaultdict(int)
    by_type: dict[str, list[bool]] = defaultdict(list)  # outcome["type"], e.g. search comparisons (chance 50 %)
    for t in trajectories:
        ends[t.end_reason] += 1
        if t.outcome.get("type"):
            by_type[str(t.outcome["type"])].append(t.success)
    extra = {"success_by_type": {k: sum(v) / len(v) for k, v in sorted(by_type.items())}} if by_type else {}
    with_ids = [t for t in trajectories if t.turns and all(turn.action_token_ids is not None for turn in t.turns)]
    return extra | {
        "episodes": n,
        "success_rate": sum(t.success for t in trajectories) / n,
        "mean_score": sum(t.score for t in trajectories) / n,
        "mean_turns": sum(len(t.turns) for t in trajectories) / n,
        "mean_tool_calls": sum(t.num_tool_calls for t in trajectories) / n,
        # Chat-mode policies (an OpenAI server without token ids) record no action ids: "not measured", never 0.
        "mean_action_tokens": (sum(t.num_action_tokens for t in with_ids) / len(with_ids)) if with_ids else None,
        "errors": ends.get("error", 0),
        "end_reasons": dict(ends),
        "template_forks": sum(int(t.metadata.get("template_forks", 0)) for t in trajectories),
        "prompt_mismatches": sum(int(t.metadata.get("prompt_mismatches", 0)) for t in trajectories),
        "mean_episode_s": sum(float(t.timing.get("wall_s", 0.0)) for t in trajectories) / n,
    }


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
