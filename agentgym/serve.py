"""An OpenAI-compatible HTTP server for a local Hugging Face model (``agentgym serve``).

Why a server of our own when ``vllm serve`` exists: vLLM needs CUDA, and the CPU machines this project
runs on still need to exercise the exact code path that talks to a remote model (``OpenAIPolicy``), to
serve the tiny model to several processes at once, and to let any OpenAI client talk to a trained
checkpoint. The server speaks the subset of the OpenAI API that agents use, plus the vLLM extensions that
token-level training needs (``return_token_ids``, ``return_tokens_as_token_ids``,
``include_stop_str_in_output``), so the same client code works against ``vllm serve`` on a GPU.

Requests are not run one by one: a bounded batcher queues them and runs up to ``max_batch_size`` of them
in a single :meth:`HFPolicy.generate` call in a worker thread, one batch at a time. Throughput therefore
grows with concurrency while memory and CPU use stay bounded, and the event loop stays free to accept
and validate requests while a batch runs.

Completion token ids include the EOS / end-of-turn token when the model ended with it (exactly what
:class:`~agentgym.policies.hf.HFPolicy` returns), so trajectories collected through the server have the
same token view as trajectories collected in-process.

Where it differs from ``vllm serve``, on purpose or for lack of need:

* Log-probs are those :class:`HFPolicy` reports: of the temperature-scaled distribution the token was
  drawn from (what trainers recompute), and so are the alternatives (completions ``logprobs: k``, chat
  ``top_logprobs: k``), which is what entropy-guided branching (ARPO) measures through a server. As in
  vLLM, a completions position lists the k best tokens plus the sampled one when it is not among them;
  chat lists exactly the k best.
* Batches are static (a batch runs until its longest row ends) rather than continuous.
* A seed makes a request reproducible when it runs in the same batch composition (HFPolicy seeds one
  generator per batch), e.g. a lone request; concurrent seeded requests still get independent samples.
* No streaming, ``n > 1``, ``echo``, ``suffix``, penalties, ``logit_bias``, structured output or tool-call
  parsing (tools are passed to the chat template; calls come back as text, which agentgym envs parse).
  Unknown request fields are refused (400, with a did-you-mean) instead of ignored, so a misspelled
  parameter never passes silently. An unknown model is a 404 ``model_not_found``, as with OpenAI and vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.errors import (
    AgentGymError,
    ConfigError,
    DependencyNotInstalled,
    did_you_mean,
)
from agentgym.policies.base import Generation, SamplingParams

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise DependencyNotInstalled("fastapi", "serve", "the OpenAI-compatible server") from exc

if TYPE_CHECKING:
    from agentgym.policies.hf import HFPolicy

__all__ = ["BatchStats", "ServerThread", "create_app", "main", "run_server", "serve_in_background"]

logger = logging.getLogger(__name__)

#: Most log-probs alternatives a request may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20

_COMPLETION_FIELDS = frozenset({
    # OpenAI
    "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
    "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "seed",
    # vLLM extensions
    "return_token_ids", "return_tokens_as_token_ids", "include_stop_str_in_output", "add_special_tokens",
})
_CHAT_FIELDS = frozenset({
    # OpenAI
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
    "logit_bias", "user", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    # vLLM extensions
    "return_token_ids", "return_tokens_as_token_ids", "include_stop_str_in_output", "add_special_tokens",
    "add_generation_prompt", "chat_template_kwargs",
})
_ROLES = ("system", "developer", "user", "assistant", "tool")


# ---- errors ----------------------------------------------------------------------------------------


class APIError(AgentGymError):
    """A request the server refuses; rendered in the OpenAI error format.

    Attributes:
        status: HTTP status code.
        message: What was wrong and how to fix it.
        param: The request field at fault, if any.
        code: A machine-readable code (OpenAI style), if any.
        type: OpenAI error type (``invalid_request_error``, ``server_error``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def response(self) -> JSONResponse:
        return _error_response(self.status, self.message, param=self.param, code=self.code, type=self.type)


def _error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None,
    type: str = "invalid_request_error",
) -> JSONResponse:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


# ---- request validation ----------------------------------------------------------------------------


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str], endpoint: str) -> None:
    """Reject unknown fields rather than ignore them: a misspelled ``max_token`` must not pass silently."""
    for key in body:
        if key not in allowed:
            raise APIError(
                f"Unrecognized request argument {key!r} for {endpoint}.{did_you_mean(key, allowed)} "
                f"Supported arguments: {', '.join(sorted(allowed))}.",
                param=key, code="unrecognized_argument",
            )


def _get_int(body: Mapping[str, Any], key: str, default: int | None, *, minimum: int | None = None,
             maximum: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{key!r} must be an integer, got {value!r}.", param=key)
    if minimum is not None and value < minimum:
        raise APIError(f"{key!r} must be >= {minimum}, got {value}.", param=key)
    if maximum is not None and value > maximum:
        raise APIError(f"{key!r} must be <= {maximum}, got {value}.", param=key)
    return value


def _get_float(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(f"{key!r} must be a number, got {value!r}.", param=key)
    return float(value)


def _get_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"{key!r} must be true or false, got {value!r}.", param=key)
    return value


def _get_stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise APIError(f"'stop' must be a string or a list of strings, got {stop!r}.", param="stop")
    if any(not s for s in items):
        raise APIError("'stop' strings must be non-empty.", param="stop")
    return tuple(dict.fromkeys(items))


def _reject_unsupported(body: Mapping[str, Any]) -> None:
    """Refuse features this server does not implement, instead of returning something subtly different."""
    if _get_bool(body, "stream", False):
        raise APIError("Streaming is not supported by this server; send 'stream': false (or omit it).",
                       param="stream", code="unsupported")
    if body.get("stream_options") is not None:
        raise APIError("'stream_options' is only valid with streaming, which this server does not support.",
                       param="stream_options", code="unsupported")
    if _get_int(body, "n", 1, minimum=1) != 1:
        raise APIError("'n' > 1 is not supported by this server; send n separate requests (they are batched "
                       "together), or omit n.", param="n", code="unsupported")
    for key in ("presence_penalty", "frequency_penalty"):
        if _get_float(body, key, 0.0) != 0.0:
            raise APIError(f"{key!r} is not supported by this server; omit it or set it to 0.", param=key,
                           code="unsupported")
    if body.get("logit_bias"):
        raise APIError("'logit_bias' is not supported by this server; omit it.", param="logit_bias", code="unsupported")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(f"'user' must be a string, got {user!r}.", param="user")


@dataclass(frozen=True)
class _Sampling:
    """Sampling fields shared by both endpoints, validated."""

    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    include_stop: bool
    return_token_ids: bool
    tokens_as_ids: bool


def _parse_sampling(body: Mapping[str, Any], *, max_tokens_key: str = "max_tokens",
                    default_max_tokens: int | None) -> _Sampling:
    max_tokens = _get_int(body, max_tokens_key, default_max_tokens, minimum=1)
    temperature = _get_float(body, "temperature", 1.0)
    if temperature < 0:
        raise APIError(f"'temperature' must be >= 0 (0 = greedy), got {temperature}.", param="temperature")
    top_p = _get_float(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise APIError(f"'top_p' must be in (0, 1], got {top_p}.", param="top_p")
    seed = _get_int(body, "seed", None)
    return _Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=_get_stop(body), seed=seed,
        include_stop=_get_bool(body, "include_stop_str_in_output", False),
        return_token_ids=_get_bool(body, "return_token_ids", False),
        tokens_as_ids=_get_bool(body, "return_tokens_as_token_ids", False),
    )


def _message_text(content: Any, index: int) -> str | None:
    """Flatten OpenAI content (a string or a list of text parts) to the string chat templates expect."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise APIError(
                    f"messages[{index}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported, "
                    f"got {kind!r}.", param=f"messages[{index}].content",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(f"messages[{index}].content must be a string or a list of text parts, got {content!r}.",
                   param=f"messages[{index}].content")


def _parse_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list of {'role', 'content'} objects.", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise APIError(f"messages[{i}] must be an object with 'role' and 'content', got {msg!r}.",
                           param=f"messages[{i}]")
        role = msg.get("role")
        if role not in _ROLES:
            raise APIError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}."
                f"{did_you_mean(str(role), _ROLES)}", param=f"messages[{i}].role",
            )
        clean = dict(msg)
        clean["content"] = _message_text(msg.get("content"), i)
        if clean["content"] is None and not msg.get("tool_calls"):
            raise APIError(f"messages[{i}].content is missing.", param=f"messages[{i}].content")
        out.append(clean)
    return out


# ---- batching --------------------------------------------------------------------------------------


@dataclass
class BatchStats:
    """Counters of the batcher, exposed on ``app.state.stats`` and ``GET /health``.

    Attributes:
        generate_calls: How many ``policy.generate`` calls ran (one per batch).
        requests: How many sequences those calls generated.
        max_batch_seen: Largest batch run so far.
        tokens_generated: Completion tokens generated in total.
        queued: Sequences waiting right now.
    """

    generate_calls: int = 0
    requests: int = 0
    max_batch_seen: int = 0
    tokens_generated: int = 0
    queued: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "generate_calls": self.generate_calls, "requests": self.requests, "max_batch_seen": self.max_batch_seen,
            "tokens_generated": self.tokens_generated, "queued": self.queued,
        }


@dataclass
class _Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Generation] = field(repr=False)


class _Batcher:
    """Runs queued sequences through ``policy.generate`` in bounded batches, one batch at a time.

    One batch at a time because an in-process model already uses every core: two overlapping batches
    would only compete for them, while one bigger batch amortises each forward pass over more sequences.
    """

    def __init__(self, policy: HFPolicy, *, max_batch_size: int, window_s: float, max_queue_size: int) -> None:
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.window_s = window_s
        self.max_queue_size = max_queue_size
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

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

    async def submit(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Queue one request's sequences and wait for their generations (in order)."""
        if self._queue is None:
            raise APIError("The server is not running (the batcher was not started).", status=503, type="server_error")
        if self._queue.qsize() + len(prompts) > self.max_queue_size:
            raise APIError(
                f"The server is overloaded ({self._queue.qsize()} sequences queued, limit {self.max_queue_size}); "
                "retry later.", status=503, type="server_error", code="overloaded",
            )
        loop = asyncio.get_running_loop()
        jobs = [_Job(list(p), sampling, loop.create_future()) for p in prompts]
        for job in jobs:
            self._queue.put_nowait(job)
        self.stats.queued = self._queue.qsize()
        try:
            return list(await asyncio.gather(*(job.future for job in jobs)))
        finally:
            for job in jobs:  # a client that went away: its queued jobs are skipped, not generated
                if not job.future.done():
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

    async def _loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            self.stats.queued = self._queue.qsize()
            if not batch:
                continue
            prompts = [job.prompt_ids for job in batch]
            samplings = [job.sampling for job in batch]
            try:
                generations = await loop.run_in_executor(self._executor, self.policy.generate, prompts, samplings)
                if len(generations) != len(batch):
                    raise RuntimeError(f"policy.generate returned {len(generations)} generations for {len(batch)} prompts")
            except asyncio.CancelledError:
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(APIError("The server is shutting down.", status=503, type="server_error"))
                raise
            except Exception as exc:
                logger.exception("Generation failed for a batch of %d sequences", len(batch))
                error = APIError(f"Generation failed: {type(exc).__name__}: {exc}", status=500, type="server_error")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            self.stats.generate_calls += 1
            self.stats.requests += len(batch)
            self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(batch))
            for job, gen in zip(batch, generations, strict=True):
                self.stats.tokens_generated += len(gen.token_ids or ())
                if not job.future.done():
                    job.future.set_result(gen)


# ---- the app ---------------------------------------------------------------------------------------


def _max_model_len(policy: Any) -> int | None:
    config = getattr(getattr(policy, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _vocab_size(policy: Any) -> int | None:
    config = getattr(getattr(policy, "model", None), "config", None)
    sizes = [getattr(config, "vocab_size", None)]
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        with contextlib.suppress(TypeError):
            sizes.append(len(tokenizer))
    sizes = [s for s in sizes if isinstance(s, int) and s > 0]
    # The embedding matrix bounds valid ids; the tokenizer may know fewer (padding rows) or more (added tokens
    # not yet resized into the model), so the smaller of the two is the safe bound.
    return min(sizes) if sizes else None


class _Server:
    """Request handling shared by both endpoints; holds the policy, tokenizer and batcher."""

    def __init__(self, policy: HFPolicy, model_name: str, batcher: _Batcher) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        if self.tokenizer is None:
            raise ConfigError("The policy has no tokenizer; the server needs one to encode prompts and decode tokens.")
        self.model_name = model_name
        self.batcher = batcher
        self.max_model_len = _max_model_len(policy)
        self.vocab_size = _vocab_size(policy)
        self.created = int(time.time())
        self._token_text_cache: dict[int, str] = {}

    # -- shared helpers --
    def check_model(self, body: Mapping[str, Any]) -> None:
        model = body.get("model")
        if model is None:
            return  # like vLLM: a single-model server needs no model name
        if model != self.model_name:
            raise APIError(
                f"The model {model!r} does not exist on this server; it serves {self.model_name!r}."
                f"{did_you_mean(str(model), [self.model_name])}", status=404, param="model", code="model_not_found",
            )

    def check_prompt_ids(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError(f"'{param}' is empty; send at least one token or character.", param=param)
        if self.vocab_size is not None:
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise APIError(
                    f"'{param}' contains token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}.",
                    param=param,
                )

    def resolve_max_tokens(self, requested: int | None, prompt_len: int, param: str) -> int:
        """Check the context length like vLLM: prompt plus completion must fit in the model's positions."""
        limit = self.max_model_len
        if limit is not None and prompt_len >= limit:
            raise APIError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens. "
                "Shorten the prompt.", param=param, code="context_length_exceeded",
            )
        if requested is None:
            return limit - prompt_len if limit is not None else 256
        if limit is not None and prompt_len + requested > limit:
            raise APIError(
                f"This model's maximum context length is {limit} tokens; the prompt has {prompt_len} tokens and "
                f"max_tokens is {requested} ({prompt_len + requested} in all). Lower max_tokens to at most "
                f"{limit - prompt_len} or shorten the prompt.", param="max_tokens", code="context_length_exceeded",
            )
        return requested

    def token_text(self, token_id: int, as_id: bool) -> str:
        if as_id:
            return f"token_id:{token_id}"
        text = self._token_text_cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._token_text_cache) < 1_000_000:
                self._token_text_cache[token_id] = text
        return text

    def alternatives(self, gen: Generation, n: int, k: int, as_ids: bool) -> list[dict[str, float]]:
        """Per generated position, ``{token text: log-prob}`` of the k best tokens (then the sampled one when it
        is not among them), best first; a backend that cannot name them is a 500 that says so."""
        if gen.top_logprobs is None or gen.top_token_ids is None or len(gen.top_logprobs) != n:
            raise APIError(f"The model backend returned no top-{k} log-probs for this request; serve an HFPolicy "
                           "(agentgym serve MODEL) or omit top log-probs.", status=500, code="no_top_logprobs",
                           type="server_error")
        rows = []
        for values, ids in zip(gen.top_logprobs, gen.top_token_ids):
            row: dict[str, float] = {}
            for value, token in zip(values, ids):
                row.setdefault(self.token_text(token, as_ids), float(value))  # two ids can decode alike: keep the best
            rows.append(row)
        return rows

    @staticmethod
    def apply_stop(text: str, stops: Sequence[str], include: bool) -> tuple[str, str | None]:
        """Cut the text at the first stop string (OpenAI drops it; vLLM keeps it on request)."""
        best: tuple[int, str] | None = None
        for stop in stops:
            i = text.find(stop)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return text, None
        i, stop = best
        return (text[: i + len(stop)] if include else text[:i]), stop

    async def generate(self, prompts: list[list[int]], s: _Sampling, max_tokens: list[int],
                       top_logprobs: int = 0) -> list[Generation]:
        # Sequences of one request share sampling params except max_tokens (context left differs per prompt).
        by_limit: dict[int, list[int]] = {}
        for i, m in enumerate(max_tokens):
            by_limit.setdefault(m, []).append(i)
        out: list[Generation | None] = [None] * len(prompts)
        calls = []
        for limit, indices in by_limit.items():
            params = SamplingParams(max_tokens=limit, temperature=s.temperature, top_p=s.top_p, stop=s.stop, seed=s.seed,
                                    top_logprobs=top_logprobs)
            calls.append((indices, self.batcher.submit([prompts[i] for i in indices], params)))
        results = await asyncio.gather(*(c for _, c in calls))
        for (indices, _), gens in zip(calls, results):
            for i, gen in zip(indices, gens):
                out[i] = gen
        return [g for g in out if g is not None]

    @staticmethod
    def usage(prompts: Sequence[Sequence[int]], gens: Sequence[Generation]) -> dict[str, int]:
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(g.token_ids or ()) for g in gens)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    # -- /v1/completions --
    def parse_prompts(self, body: Mapping[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt")
        add_special = _get_bool(body, "add_special_tokens", True)

        def encode(text: str, param: str) -> list[int]:
            if not text:
                raise APIError(f"'{param}' is empty; send a non-empty string or a list of token ids.", param=param)
            return list(self.tokenizer.encode(text, add_special_tokens=add_special))

        def is_ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        if isinstance(prompt, str):
            prompts = [encode(prompt, "prompt")]
        elif is_ids(prompt) and (not prompt or not isinstance(prompt[0], list)):
            prompts = [list(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = [encode(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        elif isinstance(prompt, list) and prompt and all(is_ids(p) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise APIError(
                "'prompt' must be a non-empty string, a list of token ids, or a list of either "
                f"(got {type(prompt).__name__}).", param="prompt",
            )
        for i, ids in enumerate(prompts):
            self.check_prompt_ids(ids, "prompt" if len(prompts) == 1 else f"prompt[{i}]")
        return prompts

    async def completions(self, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_fields(body, _COMPLETION_FIELDS, "/v1/completions")
        self.check_model(body)
        _reject_unsupported(body)
        if _get_bool(body, "echo", False):
            raise APIError("'echo' is not supported by this server; omit it.", param="echo", code="unsupported")
        if body.get("suffix") is not None:
            raise APIError("'suffix' (insertion) is not supported by this server; omit it.", param="suffix",
                           code="unsupported")
        _get_int(body, "best_of", 1, minimum=1, maximum=1)
        logprobs = _get_int(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
        s = _parse_sampling(body, default_max_tokens=16)
        prompts = self.parse_prompts(body)
        max_tokens = [self.resolve_max_tokens(s.max_tokens, len(p), "prompt") for p in prompts]
        gens = await self.generate(prompts, s, max_tokens, top_logprobs=logprobs or 0)

        choices = []
        for i, (prompt_ids, gen) in enumerate(zip(prompts, gens)):
            text, stop_reason = self.apply_stop(gen.text, s.stop, s.include_stop)
            ids = list(gen.token_ids or ())
            choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None,
                                      "finish_reason": gen.finish_reason, "stop_reason": stop_reason}
            if logprobs is not None:
                tokens = [self.token_text(t, s.tokens_as_ids) for t in ids]
                offsets, pos = [], 0
                for tok in tokens:
                    offsets.append(pos)
                    pos += 0 if s.tokens_as_ids else len(tok)
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": [float(x) for x in gen.logprobs] if gen.logprobs is not None else [None] * len(ids),
                    "top_logprobs": self.alternatives(gen, len(ids), logprobs, s.tokens_as_ids) if logprobs else None,
                    "text_offset": offsets,
                }
            if s.return_token_ids:
                choice["prompt_token_ids"] = list(prompt_ids)
                choice["token_ids"] = ids
            choices.append(choice)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices, "usage": self.usage(prompts, gens),
        }

    # -- /v1/chat/completions --
    def render_chat(self, body: Mapping[str, Any]) -> list[int]:
        messages = _parse_messages(body)
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError("This model's tokenizer has no chat template; use /v1/completions with a raw prompt.",
                           param="messages", code="no_chat_template")
        tools = body.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools)):
            raise APIError("'tools' must be a list of function tool objects.", param="tools")
        tool_choice = body.get("tool_choice")
        if tool_choice not in (None, "auto", "none"):
            raise APIError("'tool_choice' may only be 'auto' or 'none' here: this server returns tool calls as text "
                           "and cannot force one.", param="tool_choice", code="unsupported")
        fmt = body.get("response_format")
        if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
            raise APIError("'response_format' other than {'type': 'text'} is not supported by this server.",
                           param="response_format", code="unsupported")
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, Mapping):
            raise APIError("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
        add_generation_prompt = _get_bool(body, "add_generation_prompt", True)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                **dict(template_kwargs),
            )
        except Exception as exc:
            raise APIError(f"The chat template rejected the messages: {exc}", param="messages") from exc
        # The template already holds any BOS; encoding it again must not add another (what ChatAgent does too).
        ids = list(self.tokenizer.encode(text, add_special_tokens=_get_bool(body, "add_special_tokens", False)))
        self.check_prompt_ids(ids, "messages")
        return ids

    async def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_fields(body, _CHAT_FIELDS, "/v1/chat/completions")
        self.check_model(body)
        _reject_unsupported(body)
        want_logprobs = _get_bool(body, "logprobs", False)
        top_logprobs = _get_int(body, "top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
        if top_logprobs is not None and not want_logprobs:
            raise APIError("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
        if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
            raise APIError("Send either 'max_tokens' or 'max_completion_tokens', not both.", param="max_tokens")
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        s = _parse_sampling(body, max_tokens_key=key, default_max_tokens=None)
        prompt_ids = self.render_chat(body)
        max_tokens = self.resolve_max_tokens(s.max_tokens, len(prompt_ids), "messages")
        (gen,) = await self.generate([prompt_ids], s, [max_tokens], top_logprobs=top_logprobs or 0)

        text, stop_reason = self.apply_stop(gen.text, s.stop, s.include_stop)
        ids = list(gen.token_ids or ())
        choice: dict[str, Any] = {
            "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": gen.finish_reason, "stop_reason": stop_reason,
        }
        if want_logprobs:
            lps = list(gen.logprobs) if gen.logprobs is not None else [None] * len(ids)
            best = self.alternatives(gen, len(ids), top_logprobs, s.tokens_as_ids) if top_logprobs else None
            content = []
            for pos, (t, lp) in enumerate(zip(ids, lps)):
                tok = self.token_text(t, s.tokens_as_ids)
                top = [] if best is None else [{"token": alt, "logprob": value, "bytes": list(alt.encode("utf-8"))}
                                               for alt, value in list(best[pos].items())[:top_logprobs]]
                content.append({"token": tok, "logprob": None if lp is None else float(lp),
                                "bytes": list(tok.encode("utf-8")), "top_logprobs": top})
            choice["logprobs"] = {"content": content}
        if s.return_token_ids:
            choice["token_ids"] = ids
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice], "usage": self.usage([prompt_ids], [gen]),
        }
        if s.return_token_ids:
            response["prompt_token_ids"] = prompt_ids
        return response

    def models(self) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.model_name, "object": "model", "created": self.created,
                                "owned_by": "agentgym", "root": self.model_name, "parent": None}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return {"object": "list", "data": [card]}


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except Exception as exc:
        raise APIError(f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise APIError(f"The request body must be a JSON object, got {type(body).__name__}.", code="invalid_json")
    return body


def create_app(
    policy: HFPolicy,
    *,
    model_name: str,
    max_batch_size: int = 32,
    batch_window_s: float = 0.005,
    max_queue_size: int = 4096,
) -> FastAPI:
    """Build the FastAPI app that serves ``policy`` under the OpenAI API.

    Args:
        policy: The model to serve; anything with ``tokenizer`` and ``generate(prompts, samplings)``
            (an :class:`~agentgym.policies.hf.HFPolicy`).
        model_name: The id clients must send as ``model`` (and that ``/v1/models`` lists).
        max_batch_size: Most sequences in one ``policy.generate`` call; bounds memory and latency.
        batch_window_s: How long the batcher waits for more requests after the first one arrives; a few
            milliseconds let concurrent clients land in the same batch.
        max_queue_size: Sequences that may wait at once; beyond it requests get 503 (clients retry), so an
            overloaded server sheds load instead of growing without bound.

    Returns:
        The app. ``app.state.stats`` (:class:`BatchStats`) counts batches and requests.
    """
    if not model_name:
        raise ConfigError("create_app needs a non-empty model_name (the id clients send as 'model').")
    if max_batch_size < 1:
        raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}.")
    if batch_window_s < 0:
        raise ConfigError(f"batch_window_s must be >= 0, got {batch_window_s}.")
    if max_queue_size < max_batch_size:
        raise ConfigError(f"max_queue_size ({max_queue_size}) must be >= max_batch_size ({max_batch_size}).")

    batcher = _Batcher(policy, max_batch_size=max_batch_size, window_s=batch_window_s, max_queue_size=max_queue_size)
    server = _Server(policy, model_name, batcher)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="agentgym OpenAI-compatible server", lifespan=lifespan)
    app.state.stats = batcher.stats
    app.state.policy = policy
    app.state.model_name = model_name

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, str(exc.detail), code=str(exc.status_code))

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error while serving a request")
        return _error_response(500, f"Internal server error: {type(exc).__name__}: {exc}", type="server_error")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(server.models())

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "model": model_name, **batcher.stats.as_dict()})

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        return JSONResponse(await server.completions(await _json_body(request)))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        return JSONResponse(await server.chat(await _json_body(request)))

    return app


# ---- running it ------------------------------------------------------------------------------------


def _check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir).expanduser()
    if not path.exists():
        raise ConfigError(f"Model directory {str(path)!r} does not exist. Pass a local Hugging Face model "
                          "directory (one with config.json and tokenizer files), e.g. one built by build_tiny_model.")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(f"{str(path)!r} is not a Hugging Face model directory: it has no config.json. Pass the "
                          "directory that save_pretrained wrote.")
    return path


def _load_policy(model_dir: str | Path) -> HFPolicy:
    path = _check_model_dir(model_dir)
    from agentgym.policies.hf import HFPolicy

    return HFPolicy.from_pretrained(str(path))


def _import_uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise DependencyNotInstalled("uvicorn", "serve", "the OpenAI-compatible server") from exc
    return uvicorn


def run_server(
    model_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    max_batch_size: int = 32,
) -> None:
    """Serve a local HF model directory until interrupted (what ``agentgym serve`` runs).

    Args:
        model_dir: A directory written by ``save_pretrained`` (model and tokenizer).
        host: Interface to bind; the default stays on loopback so nothing is exposed by accident.
        port: TCP port.
        model_name: Id clients send as ``model``; defaults to the directory's name.
        max_batch_size: Most sequences per forward batch.
    """
    path = _check_model_dir(model_dir)
    if not 0 <= port <= 65535:
        raise ConfigError(f"port must be in [0, 65535], got {port}.")
    uvicorn = _import_uvicorn()
    name = model_name or path.resolve().name
    app = create_app(_load_policy(path), model_name=name, max_batch_size=max_batch_size)
    logger.info("Serving %s as %r on http://%s:%d/v1", path, name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")


class ServerThread:
    """Runs the server in a background thread on a free port (for tests, notebooks and benchmarks).

    Binding the socket here (port 0 picks a free one) rather than letting uvicorn do it means the port is
    known before the thread starts and no other process can take it in between.

    Args:
        model_dir_or_policy: A model directory, or an already loaded policy (tests reuse one model).
        host: Interface to bind.
        port: TCP port; 0 picks a free one.
        model_name: Id clients send as ``model``; defaults to the directory's name or ``policy.name``.
        max_batch_size: Most sequences per forward batch.
        batch_window_s: See :func:`create_app`.
        startup_timeout_s: How long :meth:`start` waits for ``/v1/models`` to answer.

    Attributes:
        app: The FastAPI app (``app.state.stats`` counts batches).
        base_url: ``http://HOST:PORT/v1`` once started (what :class:`OpenAIPolicy` takes).
    """

    def __init__(
        self,
        model_dir_or_policy: str | Path | HFPolicy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
        max_batch_size: int = 32,
        batch_window_s: float = 0.005,
        startup_timeout_s: float = 60.0,
    ) -> None:
        if isinstance(model_dir_or_policy, (str, Path)):
            path = _check_model_dir(model_dir_or_policy)
            self.policy = _load_policy(path)
            name = model_name or path.resolve().name
        else:
            self.policy = model_dir_or_policy
            name = model_name or getattr(model_dir_or_policy, "name", None) or "model"
        self.model_name = name
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.app = create_app(self.policy, model_name=name, max_batch_size=max_batch_size,
                              batch_window_s=batch_window_s)
        self.base_url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> str:
        """Start serving and return the base URL once ``/v1/models`` answers."""
        if self._thread is not None:
            raise AgentGymError("ServerThread.start() called twice; use one ServerThread per server.")
        import httpx

        uvicorn = _import_uvicorn()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto must say TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose proto is
        # IPPROTO_TCP, and without it every response waits ~40 ms on Nagle plus delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"Cannot bind {self.host}:{self.port}: {exc}. Pick another port (0 = any free one).") from exc
        self.port = sock.getsockname()[1]
        host = f"[{self.host}]" if family == socket.AF_INET6 else self.host
        self.base_url = f"http://{host}:{self.port}/v1"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False)
        self._server = uvicorn.Server(config)

        def target() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=target, name=f"agentgym-serve-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if not self._thread.is_alive():
                raise AgentGymError(f"The server thread exited during start-up: {self._error!r}. See the log above.")
            try:
                if httpx.get(self.base_url + "/models", timeout=2.0).status_code == 200:
                    return self.base_url
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AgentGymError(f"The server at {self.base_url} did not answer within {self.startup_timeout_s} s.")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask uvicorn to exit (finishing requests in flight) and join the thread; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("The server thread on port %d did not stop within %.0f s.", self.port, timeout_s)
        self._thread = None
        self._server = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_background(
    model_dir_or_policy: str | Path | HFPolicy,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    model_name: str | None = None,
    max_batch_size: int = 32,
) -> Iterator[str]:
    """Serve in a background thread for the duration of a ``with`` block; yields the base URL (``.../v1``)."""
    server = ServerThread(model_dir_or_policy, host=host, port=port, model_name=model_name,
                          max_batch_size=max_batch_size)
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentgym.serve MODEL_DIR [--host H] [--port P] [--model-name N] [--max-batch-size B]``."""
    parser = argparse.ArgumentParser(prog="agentgym serve", description="Serve a local HF model (OpenAI API).")
    parser.add_argument("model_dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_server(args.model_dir, host=args.host, port=args.port, model_name=args.model_name,
               max_batch_size=args.max_batch_size)


if __name__ == "__main__":
    main()
