"""Policy calls batched across episodes: every episode's request meets the others' in one :class:`PolicyBatcher`.

The batcher sends whatever is queued as one batch as soon as the policy has a free slot, so episodes pipeline: while
some wait on slow tools, others generate, and no turn waits for the slowest episode of a synchronous batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agentgym.errors import ContextLengthExceeded
from agentgym.policies.base import Generation, GenerationRequest, Policy

__all__ = ["PolicyBatcher", "act_per_request"]


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
