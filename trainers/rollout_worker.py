"""The rollout worker's side of asynchronous rollouts: its serving loop, and the process it runs in when
``async_worker: process`` (:mod:`agentgym.trainers.async_rollouts` holds the trainer's side).
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.rollout import EpisodeSpec, RolloutConfig
from agentgym.trajectory import Trajectory

from agentgym.trainers.policy_versions import TURN_VERSIONS, WeightMailbox, with_versions, versioned_policy_class

__all__ = [
    "custom_env_specs", "drain", "exit_description", "process_main", "RolloutJob", "serve", "worker_context",
    "worker_threads"
]


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


def serve(policy: Any, next_job: Callable[[], RolloutJob | None], deliver: Callable[[tuple[Any, ...]], None],
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
        token = TURN_VERSIONS.set(recorder)
        try:
            version = policy.refresh()
            trajectories, stats = job.run(policy)
            message: tuple[Any, ...] = ("ok", job.step, version, with_versions(trajectories, recorder), stats,
                                        time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
            deliver(("error", job.step, None if portable else exc, traceback.format_exc()))
            return
        finally:
            TURN_VERSIONS.reset(token)
        deliver(message)


def worker_context() -> Any:
    """``forkserver`` with torch, transformers and this module preloaded in the server: the first worker of a
    Python session pays for importing them (seconds), later ones start in milliseconds; unlike ``fork``, the
    server has no threads (torch's, the trainer's) whose locks a child could inherit held. The main script is
    preloaded too (as ``spawn`` would import it), so env factories defined in it reach the worker."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch", "transformers", "agentgym.policies.hf", __name__])
    return ctx


def drain(connection: Any, results: queue.Queue[tuple[Any, ...]]) -> None:
    """Move the worker process's messages into ``results`` until its end closes, then put ``("gone",)``."""
    try:
        while True:
            results.put(connection.recv())
    except (EOFError, OSError):
        results.put(("gone",))


def exit_description(code: int | None) -> str:
    """How a worker process ended, from its exit code, in words for the error the trainer raises."""
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def worker_threads() -> int:
    """Torch threads for the worker process: half the cores, so it and the trainer do not oversubscribe them."""
    import torch

    return max(1, torch.get_num_threads() // 2)


def custom_env_specs(env_ids: Sequence[str]) -> dict[str, Any]:
    """Gymnasium specs of the ids that were registered at run time (not by agentgym's catalogue) in this process."""
    import gymnasium as gym

    from agentgym.registration.catalogue import env_ids as catalogue_ids

    known = set(catalogue_ids())
    return {i: gym.spec(i) for i in env_ids if i not in known and i in gym.registry}


def process_main(model: Any, tokenizer: Any, options: dict[str, Any], mailbox: WeightMailbox, version: int,
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
        serve(policy, next_job, outbox.put, True)
    finally:
        outbox.put(None)
        thread.join()
        send.close()
