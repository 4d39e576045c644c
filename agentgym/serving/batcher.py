"""The batcher of the OpenAI-compatible server: every request's sequences join the policy's running batch.

With an :class:`~agentgym.policies.hf.HFPolicy` on its continuous sampler (the default), each sequence is handed to
:meth:`~agentgym.policies.hf.HFPolicy.continuous_submit`: it joins the running decode batch at the next step
(continuous batching), its tokens come back one decode step at a time (live streaming), a disconnect stops its row
at the next step, and its keys and values stay cached for a later prompt that extends it (prefix reuse). The number
of sequences waiting for a slot is bounded: past ``max_queue_size`` the server answers 503.

Otherwise (a scripted stand-in, a vision-language model, a sequence longer than a slot) a bounded queue takes the
sequences and a worker thread runs up to ``max_batch_size`` of them in a
single :meth:`~agentgym.policies.hf.HFPolicy.generate` call. Throughput therefore grows with concurrency while
memory and CPU use stay bounded, and the event loop stays free to accept and validate requests while a batch
runs. A full queue answers 503 so an overloaded server sheds load instead of growing without bound, and a client
that disconnects cancels its rows (queued ones are skipped, running ones stop at the policy's next decoding step
through ``generate``'s ``cancelled`` events).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.policies.base import Generation, SamplingParams
from agentgym.serving.metrics import BatchStats
from agentgym.serving.openai_protocol import APIError

if TYPE_CHECKING:
    from agentgym.policies.hf import HFPolicy

__all__ = ["Batcher"]

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Generation] = field(repr=False)
    #: Set when the client no longer waits; the policy then stops the row at its next decoding step.
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    #: The images whose tokens ``prompt_ids`` hold (a vision model's chat request), in order.
    images: list[Any] = field(default_factory=list, repr=False)


def _accepts_cancelled(policy: Any) -> bool:
    """Whether ``policy.generate`` takes ``cancelled=`` (HFPolicy does; a scripted stand-in may not)."""
    try:
        params = inspect.signature(policy.generate).parameters
    except (TypeError, ValueError):
        return False
    return "cancelled" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class Batcher:
    """Runs queued sequences through ``policy.generate`` in bounded batches, one batch at a time.

    One batch at a time because an in-process model already uses every core: two overlapping batches
    would only compete for them, while one bigger batch amortises each forward pass over more sequences.
    """

    def __init__(self, policy: HFPolicy, *, max_batch_size: int, window_s: float, max_queue_size: int,
                 prefix_reuse: bool = True) -> None:
        self.policy = policy
        self.prefix_reuse = prefix_reuse
        self._continuous = callable(getattr(policy, "continuous_submit", None))
        self.max_batch_size = max_batch_size
        self.window_s = window_s
        self.max_queue_size = max_queue_size
        self.stats = BatchStats()
        self._cancellable = _accepts_cancelled(policy)
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: Tokens the decode thread produced for streams on each event loop, not yet handed over (see _deliver).
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        self._pending_lock = threading.Lock()

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentgym-generate")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="agentgym-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._queue is not None:
            while not self._queue.empty():
                job = self._queue.get_nowait()
                if not job.future.done():
                    job.future.set_exception(APIError("The server is shutting down.", status=503, type="server_error"))
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def refresh(self) -> None:
        """Update the queue-length and running-rows gauges from the continuous sampler (before they are read)."""
        if self._continuous:
            waiting, running = self.policy.continuous_load()
            self.stats.queued = waiting + (self._queue.qsize() if self._queue is not None else 0)
            self.stats.running = running

    async def submit(self, prompts: Sequence[list[int]],
                     sampling: SamplingParams | Sequence[SamplingParams],
                     images: Sequence[list[Any]] | None = None,
                     on_token: Callable[[int, int, float, Any], None] | None = None) -> list[Generation]:
        """Queue one request's sequences (one sampling for all, or one per sequence) and wait for them, in order.

        ``on_token(sequence index, token id, log-prob, top)`` is called on the event loop with each token as the
        policy samples it (only on the continuous path; otherwise nothing streams before the result).
        If the caller is cancelled (its client disconnected), queued sequences are skipped and running ones
        are stopped at the policy's next decoding step.
        """
        if self._queue is None:
            raise APIError("The server is not running (the batcher was not started).", status=503, type="server_error")
        samplings = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        if self._continuous and not images:
            return await self._submit_continuous(list(prompts), samplings, on_token)
        return await self._submit_batched(prompts, samplings, images)

    def _overloaded(self, queued: int, adding: int) -> None:
        if queued + adding > self.max_queue_size:
            raise APIError(
                f"The server is overloaded ({queued} sequences queued, limit {self.max_queue_size}); "
                "retry later.", status=503, type="server_error", code="overloaded",
            )

    async def _submit_continuous(self, prompts: list[list[int]], samplings: list[SamplingParams],
                                 on_token: Callable[[int, int, float, Any], None] | None) -> list[Generation]:
        """Each sequence into the continuous sampler; the ones that cannot go there take the batched path."""
        waiting, _ = self.policy.continuous_load()
        assert self._queue is not None
        self._overloaded(waiting + self._queue.qsize(), len(prompts))
        loop = asyncio.get_running_loop()
        cancels = [threading.Event() for _ in prompts]
        futures: list[Any] = []
        fallback: list[int] = []
        for i, (prompt, sp) in enumerate(zip(prompts, samplings, strict=True)):
            future = self.policy.continuous_submit(prompt, sp, on_token=self._hook(i, loop, on_token),
                                                   cancel=cancels[i], reuse_prefix=self.prefix_reuse)
            if future is None:
                fallback.append(i)
            futures.append(future)
        waits = [asyncio.wrap_future(f) for f in futures if f is not None]
        try:
            done = list(await asyncio.gather(*waits))
            extra = await self._submit_batched([prompts[i] for i in fallback], [samplings[i] for i in fallback],
                                               None) if fallback else []
        finally:
            for event in cancels:  # a client that went away: its rows leave the batch (harmless for finished rows)
                event.set()
        out: list[Generation] = []
        it_done, it_extra = iter(done), iter(extra)
        for i, (prompt, future) in enumerate(zip(prompts, futures)):
            gen = next(it_extra) if future is None else next(it_done)
            if future is not None:
                self.stats.requests += 1
                self.stats.prompt_tokens += len(prompt)
                self.stats.tokens_generated += len(gen.token_ids or ())
                self.stats.aborted += gen.finish_reason == "abort"
            out.append(gen)
        return out

    def _hook(self, index: int, loop: asyncio.AbstractEventLoop,
              on_token: Callable[[int, int, float, Any], None] | None) -> Callable[[int, float, Any], None]:
        """The decode thread's per-token callback of one sequence: latency metrics, then ``on_token`` on the loop."""
        start = time.perf_counter()
        last = [0.0]
        stats = self.stats

        def hook(token: int, logprob: float, top: Any) -> None:
            now = time.perf_counter()
            if last[0]:
                stats.inter_token_latency.observe(now - last[0])
            else:
                stats.time_to_first_token.observe(now - start)
                # Rows decoding together when this one joined: the continuous path's batch size.
                stats.max_batch_seen = max(stats.max_batch_seen, self.policy.continuous_load()[1])
            last[0] = now
            stats.token_rate.add(now)
            if on_token is not None:
                self._deliver(loop, on_token, (index, token, logprob, top))

        return hook

    def _deliver(self, loop: asyncio.AbstractEventLoop, on_token: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Queue one token for ``on_token`` on ``loop``; the first token queued since the loop last drained wakes
        it, so a decode step that feeds many streaming rows costs the event loop one wake-up (a self-pipe write),
        not one per row."""
        with self._pending_lock:
            pending = self._pending.setdefault(loop, [])
            pending.append((on_token, args))
            wake = len(pending) == 1
        if wake:
            loop.call_soon_threadsafe(self._drain, loop)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the queued tokens to their streams, in the order the decode thread produced them."""
        with self._pending_lock:
            pending = self._pending.pop(loop, [])
        for on_token, args in pending:
            on_token(*args)

    async def _submit_batched(self, prompts: Sequence[list[int]], samplings: list[SamplingParams],
                              images: Sequence[list[Any]] | None) -> list[Generation]:
        assert self._queue is not None
        self._overloaded(self._queue.qsize(), len(prompts))
        loop = asyncio.get_running_loop()
        jobs = [_Job(list(p), sp, loop.create_future(), images=list(images[i]) if images else [])
                for i, (p, sp) in enumerate(zip(prompts, samplings, strict=True))]
        for job in jobs:
            self._queue.put_nowait(job)
        self.stats.queued = self._queue.qsize()
        try:
            return list(await asyncio.gather(*(job.future for job in jobs)))
        finally:
            for job in jobs:  # a client that went away: its queued jobs are skipped, running ones stopped
                # (gather has usually cancelled the futures already when the caller is cancelled)
                if not job.future.done() or job.future.cancelled():
                    job.cancel.set()
                    job.future.cancel()

    async def _collect(self) -> list[_Job]:
        """Wait for one job, give concurrent clients ``window_s`` to join it, then take up to a full batch."""
        assert self._queue is not None
        batch = [await self._queue.get()]
        if self.window_s > 0 and self._queue.qsize() < self.max_batch_size - 1:
            await asyncio.sleep(self.window_s)
        while len(batch) < self.max_batch_size and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return [job for job in batch if not job.future.done()]

    def _run(self, batch: list[_Job]) -> list[Generation]:
        """One ``policy.generate`` call (in the worker thread)."""
        prompts = [job.prompt_ids for job in batch]
        samplings = [job.sampling for job in batch]
        extra: dict[str, Any] = {"images": [job.images for job in batch]} if any(job.images for job in batch) else {}
        if self._cancellable:
            generations = self.policy.generate(prompts, samplings, cancelled=[job.cancel for job in batch], **extra)
        else:
            generations = self.policy.generate(prompts, samplings, **extra)
        if len(generations) != len(batch):
            raise RuntimeError(f"policy.generate returned {len(generations)} generations for {len(batch)} prompts")
        return list(generations)

    async def _run_isolated(self, batch: list[_Job], loop: asyncio.AbstractEventLoop) -> list[Generation | None]:
        """Run a batch; if it fails, run its sequences one by one so one bad row fails only its own request."""
        try:
            return list(await loop.run_in_executor(self._executor, self._run, batch))
        except Exception as exc:
            if len(batch) == 1:
                self._fail(batch, exc)
                return [None]
            logger.warning("A batch of %d sequences failed (%s: %s); running them one by one", len(batch),
                           type(exc).__name__, exc)
        out: list[Generation | None] = []
        for job in batch:
            if job.future.done():
                out.append(None)
                continue
            try:
                out.extend(await loop.run_in_executor(self._executor, self._run, [job]))
            except Exception as exc:
                self._fail([job], exc)
                out.append(None)
        return out

    @staticmethod
    def _fail(jobs: list[_Job], exc: Exception) -> None:
        logger.error("Generation failed for %d sequence(s): %s: %s", len(jobs), type(exc).__name__, exc,
                     exc_info=exc)
        error = APIError(f"Generation failed: {type(exc).__name__}: {exc}", status=500, type="server_error")
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)

    async def _loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            self.stats.queued = self._queue.qsize()
            if not batch:
                continue
            self.stats.running = len(batch)
            try:
                generations = await self._run_isolated(batch, loop)
            except asyncio.CancelledError:
                for job in batch:
                    job.cancel.set()
                    if not job.future.done():
                        job.future.set_exception(APIError("The server is shutting down.", status=503,
                                                          type="server_error"))
                raise
            finally:
                self.stats.running = 0
            self.stats.generate_calls += 1
            self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(batch))
            for job, gen in zip(batch, generations, strict=True):
                if gen is None:
                    continue
                self.stats.requests += 1
                self.stats.prompt_tokens += len(job.prompt_ids)
                self.stats.tokens_generated += len(gen.token_ids or ())
                self.stats.aborted += gen.finish_reason == "abort"
                if not job.future.done():
                    job.future.set_result(gen)
