"""Which weights sampled each turn: the weight mailbox a rollout worker reads and the policy wrapper that records it.

The trainer publishes each update's weights to a :class:`WeightMailbox`; a policy class made by
:func:`versioned_policy_class` loads the newest ones before every generation call and records the version that
sampled each turn, from which the per-step lag metrics are computed.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agentgym.errors import AgentGymError
from agentgym.trajectory import Trajectory

__all__ = ["lag_metrics", "TURN_VERSIONS", "versioned_policy_class", "WeightMailbox", "with_versions"]

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
TURN_VERSIONS: contextvars.ContextVar[dict[str, list[int]] | None] = contextvars.ContextVar("agentgym_async_recorder",
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
        # Weights are swapped, and each turn's version recorded, around one ``generate`` call per batch. The HF
        # policy's continuous sampler decodes in its own thread outside that gate, so a rollout worker samples with
        # the reference loop, where every batch is one ``generate`` call.
        if getattr(self, "sampler", None) == "continuous":
            self._sampler_before_mailbox = "continuous"
            self.sampler = "reference"

    def detach_mailbox(self) -> None:
        """Load the newest published weights one last time, then sample as the plain policy again (a vLLM engine
        the trainer keeps using for evaluation after its rollout worker closed)."""
        if self._mailbox is not None:
            self.refresh()
            self._mailbox = None
            if getattr(self, "_sampler_before_mailbox", None):
                self.sampler = self._sampler_before_mailbox

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
        recorder = TURN_VERSIONS.get()
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


def with_versions(trajectories: list[Trajectory], recorded: Mapping[str, list[int]]) -> list[Trajectory]:
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


def lag_metrics(trajectories: list[Trajectory], version: int) -> dict[str, float]:
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
