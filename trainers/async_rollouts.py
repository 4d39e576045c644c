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

import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from agentgym.errors import AgentGymError, ConfigError
from agentgym.trajectory import Trajectory

from agentgym.trainers.policy_versions import WeightMailbox, lag_metrics, versioned_policy_class
from agentgym.trainers.precision import sampling_copy
from agentgym.trainers.rollout_worker import (
    RolloutJob,
    custom_env_specs,
    drain,
    exit_description,
    process_main,
    serve,
    worker_context,
    worker_threads,
)

__all__ = ["AsyncRollouts", "RolloutJob", "RolloutWorkerDied", "versioned_policy_class", "WeightMailbox"]

logger = logging.getLogger(__name__)


#: How often a waiting trainer checks that the worker is still alive (seconds).
_POLL_S = 0.2
#: How long a trainer keeps reading after the worker died without a word (its last message may be in transit).
_LAST_WORDS_S = 2.0
#: How long close() lets a stopping worker finish before terminating it (seconds).
_STOP_GRACE_S = 10.0


class RolloutWorkerDied(AgentGymError):
    """The rollout worker stopped (it raised, crashed or was killed) before delivering a step the trainer needs."""


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

            model = sampling_copy(self.trainer.model, cfg.mixed_precision)
            self.policy = versioned_policy_class(HFPolicy)(model, self.trainer.tokenizer, device=cfg.device,
                                                           max_batch_size=cfg.max_in_flight, name=cfg.trainer_name,
                                                           kv_cache_tokens=self.trainer._kv_cache_tokens())
            self.policy.attach_mailbox(self.mailbox, model.load_state_dict, version, self._stop)

        def next_job() -> RolloutJob | None:
            job = self._jobs.get()
            return None if self._stop.is_set() else job

        self._thread = threading.Thread(target=serve, args=(self.policy, next_job, self._results.put, False),
                                        name="agentgym-rollouts", daemon=True)
        self._thread.start()

    def _start_process(self, version: int) -> None:
        cfg = self.trainer.config
        if cfg.generation_backend != "hf":
            raise ConfigError("async_worker: process runs an HF copy of the model; vLLM already runs its engine in "
                              "processes of its own: use async_worker: thread with generation_backend: vllm.")
        ctx = worker_context()
        self._stop = ctx.Event()
        self._jobs = ctx.Queue()
        receive, send = ctx.Pipe(duplex=False)
        self.mailbox = WeightMailbox(self.trainer.model.state_dict(), version, shared=True, context=ctx)
        model = sampling_copy(self.trainer.model, cfg.mixed_precision).cpu()
        options = {"device": cfg.device, "max_batch_size": cfg.max_in_flight, "name": cfg.trainer_name,
                   "kv_cache_tokens": self.trainer._kv_cache_tokens()}
        self._process = ctx.Process(
            target=process_main, name="agentgym-rollouts", daemon=True,
            args=(model, self.trainer.tokenizer, options, self.mailbox, version, self._jobs, send, self._stop,
                  custom_env_specs([self.trainer.suite.env_id]), worker_threads()))
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
        self._receiver = threading.Thread(target=drain, args=(receive, self._results), name="agentgym-rollouts-recv",
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
            **lag_metrics(trajectories, self.version),
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
                                    f"{exit_description(self._process.exitcode)} before delivering the step the "
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
