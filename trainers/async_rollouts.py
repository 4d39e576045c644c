"""Asynchronous rollouts: the next steps' episodes are generated while the current step trains.

With ``max_staleness: k`` (k >= 1) the trainer's sampling runs in a background rollout worker with its own copy
of the policy weights. The worker generates step ``s`` as soon as the trainer has applied update ``s - k`` (so a
step's rollouts start at most ``k`` updates behind the weights they train), and queues them; the trainer takes each
step's batch from the queue, learns, and publishes its new weights to the worker. Publishing happens between two
generation batches, so an episode in flight at an update goes on with the new weights (a partial rollout), every
token keeping the log-prob of the policy that sampled it. The update corrects for the lag with the recorded
behaviour log-probs (``off_policy_correction``, :mod:`agentgym.trainers.grpo`).

Nothing is dropped: a step's batch holds every episode of every task group of that step, however slow, so slow,
hard tasks are never starved; the per-step log says how stale the batch was (``async/staleness``: updates between
the weights that started it and the weights it trains) and how many episodes each task got.

Why a thread and not a process: the worker's time goes to env latency and batched generation, both of which release
the GIL (sleeping, sandbox I/O, torch kernels); its own weight copy means the trainer's backward pass and the
worker's forward passes never share a tensor.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections import Counter
from typing import Any

from agentgym.trajectory import Trajectory

__all__ = ["AsyncRollouts"]

logger = logging.getLogger(__name__)


class AsyncRollouts:
    """The background rollout worker of one training run (see the module docstring).

    Args:
        trainer: The :class:`~agentgym.trainers.loop.OnlineTrainer` whose ``_rollout_plan``, ``_rollout_config`` and
            model it samples with.
        start_step: The first step to generate (a resumed run starts where its checkpoint stopped).
        max_staleness: ``k``: step ``s`` is generated once update ``s - k`` has been applied.
    """

    def __init__(self, trainer: Any, start_step: int, max_staleness: int) -> None:
        from agentgym.policies.hf import HFPolicy

        self.trainer = trainer
        self.max_staleness = max_staleness
        self.version = start_step  # updates applied so far
        self._changed = threading.Condition()
        self._weights_lock = threading.Lock()
        self._queue: queue.Queue[tuple[int, int, list[Trajectory] | BaseException, float]] = queue.Queue()
        self._stop = False
        cfg = trainer.config
        self._model = copy.deepcopy(trainer.model).eval()
        for p in self._model.parameters():
            p.requires_grad_(False)
        lock = self._weights_lock

        class _Locked(HFPolicy):
            def generate(self, *args: Any, **kwargs: Any) -> Any:
                with lock:  # weights change only between two generation batches
                    return super().generate(*args, **kwargs)

        self.policy = _Locked(self._model, trainer.tokenizer, device=cfg.device, max_batch_size=cfg.max_in_flight,
                              name=cfg.trainer_name)
        self._thread = threading.Thread(target=self._run, args=(start_step, cfg.steps), name="agentgym-rollouts",
                                        daemon=True)
        self._thread.start()

    def _run(self, start: int, stop: int) -> None:
        from agentgym.rollout import RolloutEngine

        for step in range(start, stop):
            with self._changed:
                self._changed.wait_for(lambda s=step: self._stop or self.version >= s - self.max_staleness)
                if self._stop:
                    return
                version = self.version
            started = time.perf_counter()
            try:
                specs, sampling = self.trainer._rollout_plan(step)
                result: list[Trajectory] | BaseException = RolloutEngine(
                    self.policy, self.trainer._rollout_config(sampling)).run(specs)
            except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
                result = exc
            self._queue.put((step, version, result, time.perf_counter() - started))

    def take(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Step ``step``'s episodes (waiting for them if needed) and the lag metrics."""
        waited = time.perf_counter()
        got, version, result, generate_s = self._queue.get()
        if got != step:
            raise RuntimeError(f"asynchronous rollouts out of order: expected step {step}, got {got}")
        if isinstance(result, BaseException):
            raise result
        per_task = Counter(t.group_id for t in result)
        return result, {
            "async/staleness": float(self.version - version),
            "async/wait_s": time.perf_counter() - waited,
            "async/generate_s": generate_s,
            "async/dropped_episodes": 0.0,
            "async/episodes_per_task_min": float(min(per_task.values(), default=0)),
            "async/episodes_per_task_max": float(max(per_task.values(), default=0)),
        }

    def publish(self, model: Any) -> None:
        """Copy the trainer's new weights into the worker's model and count the update."""
        with self._weights_lock:
            self._model.load_state_dict(model.state_dict())
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def close(self) -> None:
        """Stop generating (a batch being generated finishes first); safe to call twice."""
        with self._changed:
            self._stop = True
            self._changed.notify_all()
        self._thread.join(timeout=60)
