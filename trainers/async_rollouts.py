"""Asynchronous rollouts: the next steps' episodes are generated while the current step trains.

With ``max_staleness: k`` (k >= 1) the trainer's sampling runs in a rollout worker with its own copy of the policy
weights. The trainer hands the worker step ``s`` (a :class:`RolloutJob`: plain data) as soon as it has applied update
``s - k``, so a step's rollouts start at most ``k`` updates behind the weights they train; the worker generates the
steps in order and streams each step's trajectories back; the trainer takes each step's batch, learns, and publishes
its new weights (:class:`WeightMailbox`). The worker loads the newest published weights before every generation
batch, so an episode in flight at an update goes on with the new weights (a partial rollout), every token keeping
the log-prob of the policy that sampled it. Weights change only between two generation calls and the KV cache is
dropped when they do (:class:`~agentgym.policies.HFPolicy` checks the weights' version), so each turn is sampled by
exactly one version: the worker records it per turn (``Trajectory.metadata["policy_versions"]``; a branch inherits
its parent's versions for the turns they share), and the per-step log gives the exact per-token lag. The update
corrects for the lag with the recorded behaviour log-probs (``off_policy_correction``, :mod:`agentgym.trainers.grpo`).

Nothing is dropped: a step's batch holds every episode of every task group of that step, however slow, so slow,
hard tasks are never starved; the per-step log says how stale the batch was (``async/staleness``: updates between
the weights that started it and the weights it trains; ``async/token_staleness_mean|max``: the same per sampled
token; ``async/partial_episodes``: episodes sampled by more than one version) and how many episodes each task got.

Where the worker runs (``async_worker``):

* ``thread`` (default): a thread of the trainer's process. Starts at once and costs no second interpreter; it wins
  when the worker's time goes to env latency and batched torch kernels, which release the GIL, and for vLLM, whose
  engine runs its own processes anyway.
* ``process``: a process of its own (``forkserver``; the envs, the engine and an HF copy of the model all run in it).
  The trainer's Python (batching, the optimizer) and the worker's (the rollout engine, chat templates, env
  steps) no longer share one GIL; it costs a few seconds to start (a fresh interpreter imports torch) and a second
  copy of the weights in shared memory. Envs registered at run time in the trainer's process are registered again
  in the worker, so their entry points must be importable (a module-level function or a ``"module:attr"`` string).
  A worker that crashes or is killed surfaces in the trainer as :class:`RolloutWorkerDied` (the steps it had
  already delivered are still trained on); ``close`` stops it and leaves no child process. The worker is a daemon
  process (it never outlives the trainer), so envs in it may start subprocesses but not ``multiprocessing`` children.

Reproducibility does not depend on the worker or its timing: every episode samples from its own seed, so the same
episode sampled by the same weights gives the same tokens in a thread, a process or synchronously (tested).
"""

from __future__ import annotations

import contextvars
import copy
import logging
import multiprocessing
import queue
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.rollout import EpisodeSpec, RolloutConfig
from agentgym.trajectory import Trajectory

__all__ = ["AsyncRollouts", "RolloutJob", "RolloutWorkerDied", "WeightMailbox", "versioned_policy_class"]

logger = logging.getLogger(__name__)

#: How often a waiting trainer checks that the worker is still alive (seconds).
_POLL_S = 0.2
#: How long a trainer keeps reading after the worker died without a word (its last message may be in transit).
_LAST_WORDS_S = 2.0
#: How long close() lets a stopping worker finish before terminating it (seconds).
_STOP_GRACE_S = 10.0


class RolloutWorkerDied(AgentGymError):
    """The rollout worker stopped (it raised, crashed or was killed) before delivering a step the trainer needs."""


@dataclass(frozen=True)
class RolloutJob:
    """One step's sampling as plain data: what a rollout worker, in this process or another, needs to run it.

    Attributes:
        step: The training step these episodes are for.
        specs: The episodes (``group_size`` per task, each with its own sampling seed).
        rollout: The rollout engine's settings (sampling, context limit, env backend).
        branching: ARPO's branching-sampler settings (a :class:`~agentgym.rollout.branching.BranchingConfig`), or ``None``
            for independent episodes from the rollout engine.
    """

    step: int
    specs: tuple[EpisodeSpec, ...]
    rollout: RolloutConfig
    branching: Any = None

    def run(self, policy: Any) -> tuple[list[Trajectory], dict[str, Any]]:
        """The step's trajectories and the sampler's statistics (branching counts; empty for the engine)."""
        if self.branching is None:
            from agentgym.rollout import RolloutEngine

            return RolloutEngine(policy, self.rollout).run(list(self.specs)), {}
        from agentgym.rollout.branching import BranchingSampler

        sampler = BranchingSampler(policy, self.rollout, self.branching)
        return sampler.run(list(self.specs)), dict(sampler.stats)


class _Counter:
    """An int cell with the ``.value`` of a ``multiprocessing.RawValue``, for a mailbox read in this process."""

    def __init__(self, value: int) -> None:
        self.value = value


class WeightMailbox:
    """The newest published weights and their version: the trainer writes, the rollout worker reads.

    A sequence lock, so that neither side ever waits for the other (and a worker killed mid-read cannot block the
    trainer): the counter is odd while the trainer copies new weights in, and even (twice the version) once they
    are complete; a reader copies the tensors out and keeps the copy only if the counter did not move meanwhile.

    Args:
        state: The weights to start from (a state dict); the mailbox holds its own copy.
        version: Their version (updates applied so far).
        shared: Keep the copy in shared memory (CPU) with a shared counter, for a worker process; otherwise the
            copy stays on the tensors' device (a worker thread, or a vLLM engine loading from GPU memory).
        context: The ``multiprocessing`` context of the worker process (with ``shared``).
    """

    def __init__(self, state: Mapping[str, Any], version: int, *, shared: bool = False, context: Any = None) -> None:
        tensors = {}
        for name, tensor in state.items():
            t = tensor.detach().to("cpu" if shared else tensor.device, copy=True)
            tensors[name] = t.share_memory_() if shared else t
        self.tensors: dict[str, Any] = tensors
        self._seq: Any = context.RawValue("q", 2 * version) if shared else _Counter(2 * version)

    @property
    def version(self) -> int:
        """The version of the newest complete weights."""
        return self._seq.value // 2

    def publish(self, state: Mapping[str, Any], version: int) -> None:
        """Copy ``state`` (the same names and shapes as at construction) in as ``version``."""
        import torch

        missing = set(self.tensors) - set(state)
        if missing:
            raise AgentGymError(f"published weights lack {sorted(missing)[:3]}: the model changed its parameters "
                                "after asynchronous rollouts started.")
        self._seq.value = 2 * version - 1
        with torch.no_grad():
            for name, t in self.tensors.items():
                t.copy_(state[name], non_blocking=False)
        self._seq.value = 2 * version

    def read_into(self, load: Callable[[Mapping[str, Any]], Any], have: int) -> int:
        """Load the newest complete weights with ``load`` if newer than version ``have``; returns the version held."""
        while True:
            seq = self._seq.value
            if seq % 2:  # the trainer is copying new weights in: they are microseconds to milliseconds away
                time.sleep(0.001)
                continue
            if seq // 2 <= have:
                return have
            load(self.tensors)
            if self._seq.value == seq:
                return seq // 2


# The per-turn version record of the job a worker is running (None outside a job: evaluation records nothing).
_RECORDER: contextvars.ContextVar[dict[str, list[int]] | None] = contextvars.ContextVar("agentgym_async_recorder",
                                                                                         default=None)
# The versions of the generation calls one act() made (act -> asyncio.to_thread(generate) copies the context).
_CALL_VERSIONS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("agentgym_async_calls", default=None)


class _Versioned:
    """Mixin for an in-process token policy (HF, vLLM) that samples for a rollout worker.

    Before each generation call it loads the newest published weights (so a weight update lands between two
    generation batches, never inside one), and it records which version sampled each episode's turn. Until
    :meth:`attach_mailbox` is called it behaves exactly like the policy it extends.
    """

    _mailbox: WeightMailbox | None = None

    def attach_mailbox(self, mailbox: WeightMailbox, load: Callable[[Mapping[str, Any]], Any], version: int,
                       stop: Any = None) -> None:
        """Sample with the weights ``mailbox`` publishes, loading them with ``load``; ``version`` is held now."""
        self._mailbox, self._load_weights, self.loaded_version = mailbox, load, version
        self._stop_event = stop
        self._gate = threading.Lock()

    def detach_mailbox(self) -> None:
        """Load the newest published weights one last time, then sample as the plain policy again (a vLLM engine
        the trainer keeps using for evaluation after its rollout worker closed)."""
        if self._mailbox is not None:
            self.refresh()
            self._mailbox = None

    def refresh(self) -> int:
        """Load the newest published weights if there are newer ones; returns the version now held."""
        mailbox = self._mailbox
        if mailbox is None:
            return 0
        with self._gate:
            self.loaded_version = mailbox.read_into(self._load_weights, self.loaded_version)
            return self.loaded_version

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self._mailbox is None:
            return super().generate(*args, **kwargs)  # type: ignore[misc]
        if self._stop_event is not None and self._stop_event.is_set():
            raise AgentGymError("asynchronous rollouts are stopping (the trainer closed its rollout worker)")
        with self._gate:  # no weight load while a batch samples
            self.loaded_version = self._mailbox.read_into(self._load_weights, self.loaded_version)
            calls = _CALL_VERSIONS.get()
            if calls is not None:
                calls.append(self.loaded_version)
            return super().generate(*args, **kwargs)  # type: ignore[misc]

    async def act(self, requests: Sequence[Any]) -> Any:
        recorder = _RECORDER.get()
        if recorder is None:
            return await super().act(requests)  # type: ignore[misc]
        calls: list[int] = []
        token = _CALL_VERSIONS.set(calls)
        try:
            generations = await super().act(requests)  # type: ignore[misc]
        finally:
            _CALL_VERSIONS.reset(token)
        if calls:  # one generation call per act: every request's turn was sampled by that version
            for request in requests:
                recorder.setdefault(request.episode_id, []).append(calls[-1])
        return generations


_VERSIONED_CLASSES: dict[type, type] = {}


def versioned_policy_class(policy_class: type) -> type:
    """``policy_class`` (an in-process token policy: HF, vLLM) extended to sample for a rollout worker."""
    if issubclass(policy_class, _Versioned):
        return policy_class
    if policy_class not in _VERSIONED_CLASSES:
        _VERSIONED_CLASSES[policy_class] = type(f"Versioned{policy_class.__name__}", (_Versioned, policy_class),
                                                {"__module__": __name__})
    return _VERSIONED_CLASSES[policy_class]


def _with_versions(trajectories: list[Trajectory], recorded: Mapping[str, list[int]]) -> list[Trajectory]:
    """Each trajectory with ``metadata["policy_versions"]``: the weights' version that sampled each turn.

    A branch (ARPO) shares its first ``branch_turn`` turns with its parent, which sampled them under its own id.
    """
    by_id = {t.traj_id: t for t in trajectories}
    done: dict[str, list[int | None]] = {}

    def versions(t: Trajectory, depth: int = 0) -> list[int | None]:
        if t.traj_id in done:
            return done[t.traj_id]
        tree = t.metadata.get("tree") or {}
        parent, shared = tree.get("parent"), int(tree.get("branch_turn") or 0)
        prefix: list[int | None] = []
        if parent and shared:
            inherited = versions(by_id[parent], depth + 1) if parent in by_id and depth < 1000 else []
            prefix = (list(inherited) + [None] * shared)[:shared]
        result = (prefix + list(recorded.get(t.traj_id, [])))[: len(t.turns)]
        done[t.traj_id] = result + [None] * (len(t.turns) - len(result))
        return done[t.traj_id]

    return [replace(t, metadata={**t.metadata, "policy_versions": versions(t)}) for t in trajectories]


def _lag_metrics(trajectories: list[Trajectory], version: int) -> dict[str, float]:
    """Per-token and per-episode lag of a batch trained from weights ``version``."""
    tokens = lag_sum = 0
    lag_max = 0
    partial = 0
    for t in trajectories:
        versions = t.metadata.get("policy_versions") or []
        if len({v for v in versions if v is not None}) > 1:
            partial += 1
        for turn, v in zip(t.turns, versions):
            if v is None:
                continue
            n = len(turn.action_token_ids or ())
            tokens += n
            lag_sum += n * (version - v)
            if n:
                lag_max = max(lag_max, version - v)
    per_task = Counter(t.group_id for t in trajectories)
    return {
        "async/token_staleness_mean": lag_sum / tokens if tokens else 0.0,
        "async/token_staleness_max": float(lag_max),
        "async/partial_episodes": float(partial),
        "async/dropped_episodes": 0.0,
        "async/episodes_per_task_min": float(min(per_task.values(), default=0)),
        "async/episodes_per_task_max": float(max(per_task.values(), default=0)),
    }


def _serve(policy: Any, next_job: Callable[[], RolloutJob | None], deliver: Callable[[tuple[Any, ...]], None],
           portable: bool) -> None:
    """The worker's loop: run each job with the newest weights and deliver ``(kind, step, ...)`` messages.

    ``("ok", step, start_version, trajectories, stats, generate_s)`` per step; on a failure one
    ``("error", step, exception or None, traceback text)`` and the loop ends (``portable``: the exception object is
    left out, since it may not pickle).
    """
    while True:
        job = next_job()
        if job is None:
            return
        started = time.perf_counter()
        recorder: dict[str, list[int]] = {}
        token = _RECORDER.set(recorder)
        try:
            version = policy.refresh()
            trajectories, stats = job.run(policy)
            message: tuple[Any, ...] = ("ok", job.step, version, _with_versions(trajectories, recorder), stats,
                                        time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            deliver(("error", job.step, None if portable else exc, traceback.format_exc()))
            return
        finally:
            _RECORDER.reset(token)
        deliver(message)


def _state_for_generation(trainer: Any) -> Mapping[str, Any]:
    """What the worker's generator loads: the model's own state dict (HF copy), or the merged weights (vLLM)."""
    if trainer.config.generation_backend == "vllm":
        state = trainer._sync_weights()
        return state if isinstance(state, Mapping) else state.state_dict()
    return trainer.model.state_dict()


class AsyncRollouts:
    """The rollout worker of one training run (see the module docstring).

    Args:
        trainer: The :class:`~agentgym.trainers.loop.OnlineTrainer` whose ``_rollout_job`` describes each step and
            whose model (or vLLM engine) samples.
        start_step: The first step to generate (a resumed run starts where its checkpoint stopped).
        max_staleness: ``k``: step ``s`` is handed to the worker once update ``s - k`` has been applied.
        worker: ``thread`` or ``process`` (the config's ``async_worker``).
    """

    def __init__(self, trainer: Any, start_step: int, max_staleness: int, worker: str = "thread") -> None:
        if worker not in ("thread", "process"):
            raise ConfigError(f"async_worker must be 'thread' or 'process', got {worker!r}.")
        self.trainer = trainer
        self.max_staleness = max_staleness
        self.worker = worker
        self.version = start_step  # updates applied so far
        self._stop_step = trainer.config.steps
        self._next_job = start_step
        self._closed = False
        self._delivered: dict[int, tuple[Any, ...]] = {}
        self._process: Any = None
        self._thread: threading.Thread | None = None
        if worker == "process":
            self._start_process(start_step)
        else:
            self._start_thread(start_step)
        self._submit_ready()

    # ---- starting the worker --------------------------------------------------------------------------
    def _start_thread(self, version: int) -> None:
        cfg = self.trainer.config
        self._stop = threading.Event()
        self._jobs: Any = queue.Queue()
        self._results: Any = queue.Queue()
        self.mailbox = WeightMailbox(_state_for_generation(self.trainer), version)
        if cfg.generation_backend == "vllm":  # the engine is the trainer's (built versioned), loading in place
            self.policy = self.trainer.policy
            self.policy.attach_mailbox(self.mailbox, self.policy.load_weights, version, self._stop)
        else:
            from agentgym.policies.hf import HFPolicy

            model = copy.deepcopy(self.trainer.model).eval()
            for p in model.parameters():
                p.requires_grad_(False)
            self.policy = versioned_policy_class(HFPolicy)(model, self.trainer.tokenizer, device=cfg.device,
                                                           max_batch_size=cfg.max_in_flight, name=cfg.trainer_name,
                                                           kv_cache_tokens=self.trainer._kv_cache_tokens())
            self.policy.attach_mailbox(self.mailbox, model.load_state_dict, version, self._stop)

        def next_job() -> RolloutJob | None:
            job = self._jobs.get()
            return None if self._stop.is_set() else job

        self._thread = threading.Thread(target=_serve, args=(self.policy, next_job, self._results.put, False),
                                        name="agentgym-rollouts", daemon=True)
        self._thread.start()

    def _start_process(self, version: int) -> None:
        cfg = self.trainer.config
        if cfg.generation_backend != "hf":
            raise ConfigError("async_worker: process runs an HF copy of the model; vLLM already runs its engine in "
                              "processes of its own: use async_worker: thread with generation_backend: vllm.")
        ctx = _worker_context()
        self._stop = ctx.Event()
        self._jobs = ctx.Queue()
        receive, send = ctx.Pipe(duplex=False)
        self.mailbox = WeightMailbox(self.trainer.model.state_dict(), version, shared=True, context=ctx)
        model = copy.deepcopy(self.trainer.model).cpu().eval()
        for p in model.parameters():
            p.requires_grad_(False)
        options = {"device": cfg.device, "max_batch_size": cfg.max_in_flight, "name": cfg.trainer_name,
                   "kv_cache_tokens": self.trainer._kv_cache_tokens()}
        self._process = ctx.Process(
            target=_process_main, name="agentgym-rollouts", daemon=True,
            args=(model, self.trainer.tokenizer, options, self.mailbox, version, self._jobs, send, self._stop,
                  _custom_env_specs([self.trainer.suite.env_id]), _worker_threads()))
        try:
            self._process.start()
        except Exception as exc:
            send.close()
            receive.close()
            raise ConfigError(f"could not start the rollout worker process ({type(exc).__name__}: {exc}); an env "
                              "registered at run time needs an importable entry point (a module-level function or a "
                              "'module:attr' string), or use async_worker: thread.") from exc
        send.close()  # the worker holds the only sending end: if it dies, reading gets EOF instead of waiting
        self._receive = receive
        self._results = queue.Queue()
        # Read every message as soon as it is sent, so that what the worker generated is here even if it dies later.
        self._receiver = threading.Thread(target=_drain, args=(receive, self._results), name="agentgym-rollouts-recv",
                                          daemon=True)
        self._receiver.start()
        del model

    # ---- the trainer's side ---------------------------------------------------------------------------
    def _submit_ready(self) -> None:
        """Hand the worker every step it may start now: ``s <= version + k`` (and before the run's last step)."""
        while self._next_job < self._stop_step and self._next_job <= self.version + self.max_staleness:
            self._jobs.put(self.trainer._rollout_job(self._next_job))
            self._next_job += 1

    def take(self, step: int) -> tuple[list[Trajectory], dict[str, Any], dict[str, float]]:
        """Step ``step``'s episodes (waiting for them if needed), the sampler's statistics and the lag metrics.

        Raises:
            RolloutWorkerDied: The worker failed or stopped before delivering ``step`` (the message says why).
        """
        waited = time.perf_counter()
        while step not in self._delivered:
            message = self._receive_one()
            if message[0] == "error":
                _, failed, exc, text = message
                if exc is not None:
                    raise exc
                raise RolloutWorkerDied(f"the rollout worker {self.worker} failed while generating step {failed}:\n"
                                        f"{text}")
            self._delivered[message[1]] = message
        _, _, version, trajectories, stats, generate_s = self._delivered.pop(step)
        return trajectories, stats, {
            "async/staleness": float(self.version - version),
            "async/wait_s": time.perf_counter() - waited,
            "async/generate_s": generate_s,
            **_lag_metrics(trajectories, self.version),
        }

    def _receive_one(self) -> tuple[Any, ...]:
        """The worker's next message; raises :class:`RolloutWorkerDied` once it is gone with nothing left to read."""
        if self._closed:
            raise RolloutWorkerDied("the rollout worker was closed.")
        dead_since = None
        while True:
            try:
                message = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                alive = self._process.is_alive() if self._process is not None else (
                    self._thread is not None and self._thread.is_alive())
                if alive:
                    dead_since = None
                    continue
                dead_since = dead_since or time.perf_counter()
                if time.perf_counter() - dead_since < _LAST_WORDS_S:  # its last message may still be in the pipe
                    continue
            else:
                if message[0] != "gone":
                    return message
            if self._process is None:
                raise RolloutWorkerDied("the rollout worker thread stopped without delivering the step the trainer "
                                        "waits for.")
            self._process.join(timeout=5)
            raise RolloutWorkerDied(f"the rollout worker process (pid {self._process.pid}) "
                                    f"{_exit_description(self._process.exitcode)} before delivering the step the "
                                    "trainer waits for; the steps it had delivered were trained on. Look for an "
                                    "out-of-memory kill (dmesg) or a crash in a native library; async_worker: "
                                    "thread runs the same rollouts in the trainer's process.")

    def publish(self, model: Any) -> None:
        """Make the trainer's new weights the newest version and hand the worker the steps that became ready."""
        self.version += 1
        state = _state_for_generation(self.trainer) if model is self.trainer.model else model.state_dict()
        self.mailbox.publish(state, self.version)
        if self._process is not None and not self._process.is_alive():
            return  # the next take() reports why; queueing more work for it would hide nothing and help nothing
        self._submit_ready()

    @property
    def pid(self) -> int | None:
        """The worker process's id (``None`` for a thread)."""
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """Stop generating (a batch being generated finishes first, episodes in flight are abandoned) and end the
        worker; safe to call twice, and no child process is left behind."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._jobs.put(None)
        if self._process is None:
            assert self._thread is not None
            self._thread.join(timeout=_STOP_GRACE_S)
            if self._thread.is_alive():
                logger.warning("the rollout worker thread is still finishing a generation batch; it stops after it")
            if self.policy is self.trainer.policy:  # vLLM: the engine serves the trainer's evaluations from now on
                self.policy.detach_mailbox()
            return
        process = self._process
        process.join(timeout=_STOP_GRACE_S)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()
        self._jobs.cancel_join_thread()  # a dead reader must not make our exit wait for the queue to drain
        self._jobs.close()
        self._receiver.join(timeout=5)  # the worker's end is closed now, so the receiver has read EOF
        self._receive.close()


def _worker_context() -> Any:
    """``forkserver`` with torch, transformers and this module preloaded in the server: the first worker of a
    Python session pays for importing them (seconds), later ones start in milliseconds; unlike ``fork``, the
    server has no threads (torch's, the trainer's) whose locks a child could inherit held. The main script is
    preloaded too (as ``spawn`` would import it), so env factories defined in it reach the worker."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "transformers", "agentgym.policies.hf", __name__])
    return ctx


def _drain(connection: Any, results: queue.Queue[tuple[Any, ...]]) -> None:
    """Move the worker process's messages into ``results`` until its end closes, then put ``("gone",)``."""
    try:
        while True:
            results.put(connection.recv())
    except (EOFError, OSError):
        results.put(("gone",))


def _exit_description(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _worker_threads() -> int:
    """Torch threads for the worker process: half the cores, so it and the trainer do not oversubscribe them."""
    import torch

    return max(1, torch.get_num_threads() // 2)


def _custom_env_specs(env_ids: Sequence[str]) -> dict[str, Any]:
    """Gymnasium specs of the ids that were registered at run time (not by agentgym's catalogue) in this process."""
    import gymnasium as gym

    from agentgym.registration.catalogue import env_ids as catalogue_ids

    known = set(catalogue_ids())
    return {i: gym.spec(i) for i in env_ids if i not in known and i in gym.registry}


def _process_main(model: Any, tokenizer: Any, options: dict[str, Any], mailbox: WeightMailbox, version: int,
                  jobs: Any, send: Any, stop: Any, env_specs: dict[str, Any], threads: int) -> None:
    """The worker process: an HF policy on its own model copy serving jobs until told to stop or orphaned."""
    import torch

    import agentgym  # noqa: F401 - registers the catalogue's envs
    from agentgym.policies.hf import HFPolicy

    torch.set_num_threads(threads)
    parent = multiprocessing.parent_process()
    import gymnasium as gym

    for env_id, spec in env_specs.items():  # envs the trainer's process registered at run time
        gym.registry.setdefault(env_id, spec)
    model = model.to(options["device"])
    policy = versioned_policy_class(HFPolicy)(model, tokenizer, device=options["device"],
                                              max_batch_size=options["max_batch_size"], name=options["name"],
                                              kv_cache_tokens=options["kv_cache_tokens"])
    policy.attach_mailbox(mailbox, model.load_state_dict, version, stop)
    outbox: queue.Queue[tuple[Any, ...] | None] = queue.Queue()

    def sender() -> None:  # a step's batch can be megabytes: the pipe must not hold up the next step's generation
        while (message := outbox.get()) is not None:
            send.send(message)

    thread = threading.Thread(target=sender, name="agentgym-rollouts-send", daemon=True)
    thread.start()

    def next_job() -> RolloutJob | None:
        while not stop.is_set():
            try:
                return jobs.get(timeout=0.5)
            except queue.Empty:
                if parent is not None and not parent.is_alive():  # the trainer is gone: nobody would read our work
                    return None
        return None

    try:
        _serve(policy, next_job, outbox.put, True)
    finally:
        outbox.put(None)
        thread.join()
        send.close()

