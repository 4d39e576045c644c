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

Beyond the core endpoints it speaks what agent frameworks send to ``vllm serve``: SSE streaming with
``stream_options.include_usage``, ``n > 1``, Hermes tool-call parsing into ``message.tool_calls`` (the
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` format of vLLM's ``hermes`` parser), the vLLM
sampling extras ``stop_token_ids``, ``ignore_eos`` and ``skip_special_tokens``, and ``/tokenize``,
``/detokenize`` and a Prometheus ``/metrics``. Sampling numbers are checked per request (NaN, infinity,
strings are a 400 for that request alone), a client that disconnects cancels its rows in the running batch
(:meth:`HFPolicy.generate`'s ``cancelled`` events), and chat templates and tokenisation run in a small thread
pool so that a huge body never stalls the event loop.

Where it differs from ``vllm serve``, on purpose or for lack of need:

* Log-probs are those :class:`HFPolicy` reports: of the temperature-scaled distribution the token was
  drawn from (what trainers recompute), and so are the alternatives (completions ``logprobs: k``, chat
  ``top_logprobs: k``), which is what entropy-guided branching (ARPO) measures through a server. As in
  vLLM, a completions position lists the k best tokens plus the sampled one when it is not among them;
  chat lists exactly k.
* Batches are static (a batch runs until its longest row ends) rather than continuous.
* Streaming is not token by token as the model runs: a request's generation finishes first (its batch is
  static anyway), then it is sent as one SSE chunk per token, decoded incrementally so a multi-byte
  character never splits, and the deltas join to exactly the non-streamed text. With tool parsing on, the
  text outside the calls comes as one delta and the parsed calls in the last delta.
* A seed makes a request reproducible whatever else shares its batch (HFPolicy draws each row from its own
  seeded stream; each of the ``n`` choices gets a seed derived from the request's). Batches of different
  shapes can still differ in the last float bits of a log-prob, as in vLLM.
* ``tool_choice`` ``"required"`` or a named function is accepted but not enforced (vLLM forces it with
  guided decoding): the output is parsed as for ``"auto"``, and a model that wrote no call gets its text
  back with ``finish_reason`` ``"stop"``/``"length"``; no call is ever invented. ``"none"`` returns the text
  unparsed.
* ``stop_token_ids`` are applied to the finished generation (it is cut after the first such token, which
  stays in ``token_ids`` as in vLLM), so tokens past it are computed and dropped. ``ignore_eos`` continues a
  row that ended on an end-of-turn token with a new generation over prompt + output until ``max_tokens``.
* Knobs that need the decoding loop (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``,
  presence/frequency penalties, ``logit_bias``) accept only their neutral value and are a 400 otherwise;
  no ``echo``, ``suffix``, ``best_of`` other than ``n``, structured output or guided decoding.
  ``store``, ``metadata``, ``service_tier``, ``parallel_tool_calls`` and ``user`` are accepted and ignored.
  Other unknown fields are refused (400, with a did-you-mean) instead of ignored, so a misspelled
  parameter never passes silently. An unknown model is a 404 ``model_not_found``, as with OpenAI and vLLM.
* ``/metrics`` uses the ``agentgym:`` prefix (see :func:`_prometheus_text` for the names).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import json
import logging
import math
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
from agentgym.parsers import HermesParser
from agentgym.policies.base import Generation, SamplingParams
from agentgym.policies.hf import row_seeds

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise DependencyNotInstalled("fastapi", "serve", "the OpenAI-compatible server") from exc

if TYPE_CHECKING:
    from agentgym.policies.hf import HFPolicy

__all__ = ["BatchStats", "ServerThread", "create_app", "main", "run_server", "serve_in_background"]

logger = logging.getLogger(__name__)

#: Most log-probs alternatives a request may ask for (vLLM's default ``max_logprobs``).
MAX_LOGPROBS = 20
#: How often a waiting request checks whether its client is still connected.
_DISCONNECT_POLL_S = 0.1

#: Accepted for compatibility with OpenAI clients and ignored (they do not change what is generated).
_IGNORED_FIELDS = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls"})
#: vLLM sampling extras, on both endpoints.
_VLLM_SAMPLING_FIELDS = frozenset({
    "return_token_ids", "return_tokens_as_token_ids", "include_stop_str_in_output", "add_special_tokens",
    "stop_token_ids", "ignore_eos", "min_tokens", "skip_special_tokens", "top_k", "min_p", "repetition_penalty",
})
_COMPLETION_FIELDS = frozenset({
    # OpenAI
    "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
    "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "seed",
}) | _IGNORED_FIELDS | _VLLM_SAMPLING_FIELDS
_CHAT_FIELDS = frozenset({
    # OpenAI
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
    "logit_bias", "tools", "tool_choice", "response_format",
    # vLLM extensions
    "add_generation_prompt", "chat_template_kwargs",
}) | _IGNORED_FIELDS | _VLLM_SAMPLING_FIELDS
_TOKENIZE_FIELDS = frozenset({
    "model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "tools", "chat_template_kwargs",
    "return_token_strs",
})
_DETOKENIZE_FIELDS = frozenset({"model", "tokens"})
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
    # JSON bodies may carry NaN/Infinity literals (Python's json accepts them); they would poison a whole batch.
    if not math.isfinite(value):
        raise APIError(f"{key!r} must be a finite number, got {value!r}; send a real number.", param=key)
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
    for key in ("presence_penalty", "frequency_penalty"):
        if _get_float(body, key, 0.0) != 0.0:
            raise APIError(f"{key!r} is not supported by this server; omit it or set it to 0.", param=key,
                           code="unsupported")
    if body.get("logit_bias"):
        raise APIError("'logit_bias' is not supported by this server; omit it.", param="logit_bias", code="unsupported")
    _check_ignored(body)


def _check_ignored(body: Mapping[str, Any]) -> None:
    """Fields accepted for compatibility and ignored still get their type checked, as OpenAI does."""
    for key, kind, name in (("user", str, "a string"), ("service_tier", str, "a string"),
                            ("store", bool, "true or false"), ("parallel_tool_calls", bool, "true or false"),
                            ("metadata", Mapping, "an object")):
        value = body.get(key)
        if value is not None and not isinstance(value, kind):
            raise APIError(f"{key!r} must be {name}, got {value!r} (it is accepted and ignored; omit it).", param=key)


def _neutral_only(body: Mapping[str, Any], key: str, value: float, neutral: Sequence[float], fix: str) -> None:
    if value not in neutral:
        raise APIError(f"{key!r} = {value!r} is not supported by this server: its sampler has no {key} (HFPolicy "
                       f"samples with temperature and top_p only). {fix}", param=key, code="unsupported")


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
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True


def _parse_stream(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """``(stream, include_usage, continuous_usage_stats)``; ``stream_options`` only with ``stream: true``."""
    stream = _get_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise APIError("'stream_options' is only valid with 'stream': true; drop it or set stream.",
                       param="stream_options")
    if not isinstance(options, Mapping):
        raise APIError(f"'stream_options' must be an object like {{'include_usage': true}}, got {options!r}.",
                       param="stream_options")
    allowed = ("include_usage", "continuous_usage_stats")
    for key in options:
        if key not in allowed:
            raise APIError(f"Unrecognized stream option {key!r}.{did_you_mean(str(key), allowed)} Supported: "
                           f"{', '.join(allowed)}.", param="stream_options")
    return stream, _get_bool(options, "include_usage", False), _get_bool(options, "continuous_usage_stats", False)


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
    n = _get_int(body, "n", 1, minimum=1)
    stream, include_usage, continuous = _parse_stream(body)
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_token_ids):
        raise APIError(f"'stop_token_ids' must be a list of token ids (integers >= 0), got {stop_token_ids!r}.",
                       param="stop_token_ids")
    top_k = _get_int(body, "top_k", -1, minimum=-1)
    _neutral_only(body, "top_k", top_k, (-1, 0), "Omit it or send -1 (disabled); use top_p to truncate.")
    min_p = _get_float(body, "min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise APIError(f"'min_p' must be in [0, 1], got {min_p}.", param="min_p")
    _neutral_only(body, "min_p", min_p, (0.0,), "Omit it or send 0; use top_p to truncate.")
    repetition_penalty = _get_float(body, "repetition_penalty", 1.0)
    if repetition_penalty <= 0:
        raise APIError(f"'repetition_penalty' must be > 0, got {repetition_penalty}.", param="repetition_penalty")
    _neutral_only(body, "repetition_penalty", repetition_penalty, (1.0,), "Omit it or send 1.")
    min_tokens = _get_int(body, "min_tokens", 0, minimum=0)
    if min_tokens:
        raise APIError(f"'min_tokens' = {min_tokens} is not supported by this server: it needs the sampler to mask "
                       "end-of-turn tokens, which HFPolicy does not do. Omit it (or send 0); for fixed-length "
                       "outputs send 'ignore_eos': true with max_tokens.", param="min_tokens", code="unsupported")
    return _Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=_get_stop(body), seed=seed,
        include_stop=_get_bool(body, "include_stop_str_in_output", False),
        return_token_ids=_get_bool(body, "return_token_ids", False),
        tokens_as_ids=_get_bool(body, "return_tokens_as_token_ids", False),
        n=n, stream=stream, include_usage=include_usage, continuous_usage=continuous,
        stop_token_ids=tuple(dict.fromkeys(stop_token_ids)), ignore_eos=_get_bool(body, "ignore_eos", False),
        skip_special_tokens=_get_bool(body, "skip_special_tokens", True),
    )


def _message_text(content: Any, index: int, vision: bool = False) -> str | list[dict[str, Any]] | None:
    """Flatten OpenAI content (a string or a list of text parts) to the string chat templates expect; for a vision
    model, content with ``image_url`` parts (data URIs) becomes agentgym content parts (text and
    ``{"type": "image", "image": ImageRef}``), which its processor's template renders."""
    if content is None or isinstance(content, str):
        return content
    if vision and isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") == "image_url"
                                                    for p in content):
        return _vision_parts(content, index)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image_url":
                raise APIError(f"messages[{index}].content has an image, but this server's model reads text only; "
                               "serve a vision-language model (a directory with its processor) or send text.",
                               param=f"messages[{index}].content", code="images_unsupported")
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


def _vision_parts(content: list[Any], index: int) -> list[dict[str, Any]]:
    """Text and image parts of one message for a vision model; images must be inline data URIs."""
    from agentgym.utils.images import ImageRef

    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            try:
                parts.append({"type": "image", "image": ImageRef.from_data_uri(str(url))})
            except AgentGymError as exc:
                raise APIError(f"messages[{index}].content[{j}]: {exc}", param=f"messages[{index}].content") from exc
        else:
            raise APIError(f"messages[{index}].content[{j}]: only text and image_url parts are supported, got "
                           f"{kind!r}.", param=f"messages[{index}].content")
    return parts


def _parse_messages(body: Mapping[str, Any], vision: bool = False) -> list[dict[str, Any]]:
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
        clean["content"] = _message_text(msg.get("content"), i, vision)
        if clean["content"] is None and not msg.get("tool_calls"):
            raise APIError(f"messages[{i}].content is missing.", param=f"messages[{i}].content")
        out.append(clean)
    return out


# ---- batching --------------------------------------------------------------------------------------


@dataclass
class BatchStats:
    """Counters of the batcher, exposed on ``app.state.stats``, ``GET /health`` and ``GET /metrics``.

    Attributes:
        generate_calls: How many ``policy.generate`` calls ran (one per batch).
        requests: How many sequences those calls generated.
        max_batch_seen: Largest batch run so far.
        tokens_generated: Completion tokens generated in total (rows cancelled midway count what they made).
        prompt_tokens: Prompt tokens of the sequences run.
        queued: Sequences waiting right now.
        running: Sequences in the batch running right now.
        aborted: Sequences stopped early because their client went away.
    """

    generate_calls: int = 0
    requests: int = 0
    max_batch_seen: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    queued: int = 0
    running: int = 0
    aborted: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "generate_calls": self.generate_calls, "requests": self.requests, "max_batch_seen": self.max_batch_seen,
            "tokens_generated": self.tokens_generated, "prompt_tokens": self.prompt_tokens, "queued": self.queued,
            "running": self.running, "aborted": self.aborted,
        }


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
        self._cancellable = _accepts_cancelled(policy)
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

    async def submit(self, prompts: Sequence[list[int]],
                     sampling: SamplingParams | Sequence[SamplingParams],
                     images: Sequence[list[Any]] | None = None) -> list[Generation]:
        """Queue one request's sequences (one sampling for all, or one per sequence) and wait for them, in order.

        If the caller is cancelled (its client disconnected), queued sequences are skipped and running ones
        are stopped at the policy's next decoding step.
        """
        if self._queue is None:
            raise APIError("The server is not running (the batcher was not started).", status=503, type="server_error")
        if self._queue.qsize() + len(prompts) > self.max_queue_size:
            raise APIError(
                f"The server is overloaded ({self._queue.qsize()} sequences queued, limit {self.max_queue_size}); "
                "retry later.", status=503, type="server_error", code="overloaded",
            )
        loop = asyncio.get_running_loop()
        samplings = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
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


# ---- the app ---------------------------------------------------------------------------------------


def _text_config(policy: Any) -> Any:
    """The language model's config (a vision-language model nests it as its text config)."""
    config = getattr(getattr(policy, "model", None), "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _max_model_len(policy: Any) -> int | None:
    config = _text_config(policy)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _vocab_size(policy: Any) -> int | None:
    config = _text_config(policy)
    sizes = [getattr(config, "vocab_size", None)]
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        with contextlib.suppress(TypeError):
            sizes.append(len(tokenizer))
    sizes = [s for s in sizes if isinstance(s, int) and s > 0]
    # The embedding matrix bounds valid ids; the tokenizer may know fewer (padding rows) or more (added tokens
    # not yet resized into the model), so the smaller of the two is the safe bound.
    return min(sizes) if sizes else None


@dataclass
class _Output:
    """One choice after the server's post-processing (stop token ids, stop strings, special tokens)."""

    ids: list[int]
    text: str
    finish_reason: str
    stop_reason: str | int | None
    gen: Generation
    #: The ids whose decoding gives ``text`` before stop strings cut it (for incremental stream deltas).
    text_ids: list[int] = field(default_factory=list)


def _sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n\n"


_SSE_DONE = "data: [DONE]\n\n"


class _Server:
    """Request handling shared by the endpoints; holds the policy, tokenizer and batcher."""

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
        self._tool_parser = HermesParser(native=False)
        # Chat templates and tokenisation of big bodies run here, off the event loop; small and separate from
        # the generation thread so they never wait behind a batch.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentgym-tokenize")
        #: Finished choices by finish reason, and HTTP responses by endpoint and status (for /metrics).
        self.finished: dict[str, int] = {}
        self.responses: dict[tuple[str, int], int] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn: Any, *args: Any) -> Any:
        """Run CPU-bound request work (templates, tokenisation) in the tokenizer pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

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

    def check_n(self, n: int, sequences: int) -> None:
        limit = self.batcher.max_queue_size
        if n * sequences > limit:
            raise APIError(f"This request asks for {n * sequences} sequences (n={n} per prompt), more than the server "
                           f"queues at once ({limit}); lower n or split the request.", param="n")

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
        if gen.top_logprobs is None or gen.top_token_ids is None or len(gen.top_logprobs) < n:
            raise APIError(f"The model backend returned no top-{k} log-probs for this request; serve an HFPolicy "
                           "(agentgym serve MODEL) or omit top log-probs.", status=500, code="no_top_logprobs",
                           type="server_error")
        rows = []
        for values, ids in zip(gen.top_logprobs[:n], gen.top_token_ids[:n]):
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

    # -- generation --
    async def _submit(self, prompts: list[list[int]], s: _Sampling, max_tokens: list[int], top_logprobs: int,
                      seed: int | None, images: list[list[Any]] | None = None) -> list[Generation]:
        # Sequences of one request share sampling params except max_tokens (context left differs per prompt).
        by_limit: dict[int, list[int]] = {}
        for i, m in enumerate(max_tokens):
            by_limit.setdefault(m, []).append(i)
        out: list[Generation | None] = [None] * len(prompts)
        # Each sequence (choice) gets its own seed derived from the request's: choices differ, and a seeded request
        # samples the same tokens whatever other requests share its batch (the policy samples per row).
        # The first sequence keeps the request's seed, so a one-choice request samples what HFPolicy does in-process.
        seeds = [seed] + row_seeds([seed] * len(prompts))[1:] if prompts else []
        calls = []
        for limit, indices in by_limit.items():
            params = [SamplingParams(max_tokens=limit, temperature=s.temperature, top_p=s.top_p, stop=s.stop,
                                     seed=seeds[i], top_logprobs=top_logprobs) for i in indices]
            calls.append((indices, self.batcher.submit([prompts[i] for i in indices], params,
                                                       [images[i] for i in indices] if images else None)))
        results = await asyncio.gather(*(c for _, c in calls))
        for (indices, _), gens in zip(calls, results):
            for i, gen in zip(indices, gens):
                out[i] = gen
        return [g for g in out if g is not None]

    async def generate(self, prompts: list[list[int]], s: _Sampling, max_tokens: list[int],
                       top_logprobs: int = 0, images: list[list[Any]] | None = None) -> list[_Output]:
        """``s.n`` independent samples per prompt (choice ``i * n + j`` is prompt i's sample j), post-processed.

        Each copy gets its own seed derived from the request's (independent samples), and the policy samples per
        row, so a seeded request reproduces all n whatever else runs in its batch.
        """
        seqs = [p for p in prompts for _ in range(s.n)]
        limits = [m for m in max_tokens for _ in range(s.n)]
        seq_images = [i for i in images for _ in range(s.n)] if images else None
        gens = await self._submit(seqs, s, limits, top_logprobs, s.seed, seq_images)
        if s.ignore_eos:
            gens = await self._continue_past_eos(seqs, gens, s, limits, top_logprobs, seq_images)
        return [self.finish(g, s) for g in gens]

    def _ended_on_eos(self, gen: Generation, s: _Sampling) -> bool:
        """Whether the row stopped on an end-of-turn token (not a stop string, stop token id or the length)."""
        ids = gen.token_ids or ()
        return (gen.finish_reason == "stop" and bool(ids) and self.apply_stop(gen.text, s.stop, True)[1] is None
                and not any(t in s.stop_token_ids for t in ids))

    async def _continue_past_eos(self, prompts: list[list[int]], gens: list[Generation], s: _Sampling,
                                 limits: list[int], top_logprobs: int,
                                 images: list[list[Any]] | None = None) -> list[Generation]:
        """``ignore_eos``: a row that ended on an end-of-turn token goes on from prompt + output (the token kept in
        context, as vLLM does) until ``max_tokens``; each continuation is one more generation of that row."""
        gens = list(gens)
        while True:
            todo = [i for i, g in enumerate(gens)
                    if self._ended_on_eos(g, s) and len(g.token_ids or ()) < limits[i]]
            if not todo:
                return gens
            made = [list(gens[i].token_ids or ()) for i in todo]
            # A different seed per continuation: the same one would replay the random numbers of the first part.
            seed = None if s.seed is None else (s.seed * 1_000_003 + len(made[0])) % (1 << 63)
            more = await self._submit([prompts[i] + m for i, m in zip(todo, made)], s,
                                      [limits[i] - len(m) for i, m in zip(todo, made)], top_logprobs, seed,
                                      [images[i] for i in todo] if images else None)
            for i, extra in zip(todo, more):
                gens[i] = self._join(gens[i], extra)

    def _join(self, first: Generation, extra: Generation) -> Generation:
        def cat(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
            return None if a is None or b is None else tuple(a) + tuple(b)

        ids = tuple(first.token_ids or ()) + tuple(extra.token_ids or ())
        # The whole text decoded again (finish() applies the request's stop strings to it).
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return Generation(text=text, token_ids=ids, logprobs=cat(first.logprobs, extra.logprobs),
                          entropies=cat(first.entropies, extra.entropies), finish_reason=extra.finish_reason,
                          top_logprobs=cat(first.top_logprobs, extra.top_logprobs),
                          top_token_ids=cat(first.top_token_ids, extra.top_token_ids))

    def finish(self, gen: Generation, s: _Sampling) -> _Output:
        """Apply what the policy does not: stop token ids, ``skip_special_tokens`` and the stop-string rules."""
        ids = list(gen.token_ids or ())
        finish_reason = gen.finish_reason
        stop_reason: str | int | None = None
        cut = next((i for i, t in enumerate(ids) if t in s.stop_token_ids), None)
        ends_on_token = cut is not None or self._ended_on_eos(gen, s)
        if cut is not None:
            ids, finish_reason, stop_reason = ids[: cut + 1], "stop", ids[cut]
        # Like vLLM, the token that ended the row (EOS or a stop token id) is not part of the text unless asked.
        text_ids = ids[:-1] if ends_on_token and ids and not s.include_stop else ids
        if cut is None and s.skip_special_tokens:
            raw = gen.text  # the policy's own decoding (it already holds any stop string it stopped at)
        else:
            raw = self.tokenizer.decode(text_ids, skip_special_tokens=s.skip_special_tokens)
        text, stop_string = self.apply_stop(raw, s.stop, s.include_stop)
        if stop_string is not None:
            finish_reason, stop_reason = "stop", stop_string
        self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
        return _Output(ids=ids, text=text, finish_reason=finish_reason, stop_reason=stop_reason, gen=gen,
                       text_ids=text_ids)

    def text_pieces(self, out: _Output, skip_special: bool) -> list[str]:
        """One text delta per token whose concatenation is exactly ``out.text``.

        Tokens are decoded incrementally over a short window (a token is released only once its bytes form whole
        characters, so a multi-byte character is never split across deltas), and the deltas are taken as slices
        of the final text, so stop strings and special-token rules apply exactly as in the non-streamed reply.
        """
        final, ids = out.text, out.text_ids
        pieces: list[str] = []
        emitted = prefix = read = 0
        for k in range(len(out.ids)):
            new = ""
            if k < len(ids):
                before = self.tokenizer.decode(ids[prefix:read], skip_special_tokens=skip_special)
                now = self.tokenizer.decode(ids[prefix:k + 1], skip_special_tokens=skip_special)
                if len(now) > len(before) and not now.endswith("\ufffd"):
                    new = now[len(before):]
                    prefix, read = read, k + 1
            piece = final[emitted:emitted + len(new)]
            emitted += len(piece)
            pieces.append(piece)
        if pieces:
            pieces[-1] += final[emitted:]
        return pieces

    @staticmethod
    def usage(prompts: Sequence[Sequence[int]], outs: Sequence[_Output]) -> dict[str, int]:
        """Prompt tokens count once per prompt (not per choice), as in OpenAI and vLLM."""
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(o.ids) for o in outs)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def completion_logprobs(self, out: _Output, k: int, as_ids: bool) -> dict[str, list[Any]]:
        ids = out.ids
        tokens = [self.token_text(t, as_ids) for t in ids]
        offsets, pos = [], 0
        for tok in tokens:
            offsets.append(pos)
            pos += 0 if as_ids else len(tok)
        lps = out.gen.logprobs
        return {
            "tokens": tokens,
            "token_logprobs": [float(x) for x in lps[: len(ids)]] if lps is not None else [None] * len(ids),
            "top_logprobs": self.alternatives(out.gen, len(ids), k, as_ids) if k else None,
            "text_offset": offsets,
        }

    def chat_logprobs(self, out: _Output, k: int | None, as_ids: bool) -> list[dict[str, Any]]:
        ids = out.ids
        lps = list(out.gen.logprobs[: len(ids)]) if out.gen.logprobs is not None else [None] * len(ids)
        best = self.alternatives(out.gen, len(ids), k, as_ids) if k else None
        content = []
        for pos, (t, lp) in enumerate(zip(ids, lps)):
            tok = self.token_text(t, as_ids)
            top = [] if best is None else [{"token": alt, "logprob": value, "bytes": list(alt.encode("utf-8"))}
                                           for alt, value in list(best[pos].items())[:k]]
            content.append({"token": tok, "logprob": None if lp is None else float(lp),
                            "bytes": list(tok.encode("utf-8")), "top_logprobs": top})
        return content

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

    async def completions(self, body: Mapping[str, Any]) -> dict[str, Any] | AsyncIterator[str]:
        """The reply as a dict, or (``stream: true``) an async iterator of SSE lines; validation errors raise
        before anything is sent."""
        _check_fields(body, _COMPLETION_FIELDS, "/v1/completions")
        self.check_model(body)
        _reject_unsupported(body)
        if _get_bool(body, "echo", False):
            raise APIError("'echo' is not supported by this server; omit it.", param="echo", code="unsupported")
        if body.get("suffix") is not None:
            raise APIError("'suffix' (insertion) is not supported by this server; omit it.", param="suffix",
                           code="unsupported")
        logprobs = _get_int(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
        s = _parse_sampling(body, default_max_tokens=16)
        best_of = _get_int(body, "best_of", None, minimum=1)
        if best_of is not None and best_of != s.n:
            raise APIError(f"'best_of' = {best_of} is not supported by this server (it returns every sample); omit "
                           f"it or set it to n ({s.n}).", param="best_of", code="unsupported")
        prompts = await self.off_loop(self.parse_prompts, body)
        self.check_n(s.n, len(prompts))
        max_tokens = [self.resolve_max_tokens(s.max_tokens, len(p), "prompt") for p in prompts]
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if s.stream:
            return self._stream_completions(prompts, s, max_tokens, logprobs, rid, created)
        outs = await self.generate(prompts, s, max_tokens, top_logprobs=logprobs or 0)
        choices = []
        for i, out in enumerate(outs):
            choice: dict[str, Any] = {"index": i, "text": out.text, "logprobs": None,
                                      "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            if logprobs is not None:
                choice["logprobs"] = self.completion_logprobs(out, logprobs, s.tokens_as_ids)
            if s.return_token_ids:
                choice["prompt_token_ids"] = list(prompts[i // s.n])
                choice["token_ids"] = out.ids
            choices.append(choice)
        return {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": self.usage(prompts, outs)}

    async def _stream_completions(self, prompts: list[list[int]], s: _Sampling, max_tokens: list[int],
                                  logprobs: int | None, rid: str, created: int) -> AsyncIterator[str]:
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name}
        try:
            outs = await self.generate(prompts, s, max_tokens, top_logprobs=logprobs or 0)
        except APIError as exc:
            yield _sse({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})
            yield _SSE_DONE
            return
        sent = 0
        prompt_tokens = sum(len(p) for p in prompts)
        for c, out in enumerate(outs):
            pieces = self.text_pieces(out, s.skip_special_tokens) or [out.text]
            lp = self.completion_logprobs(out, logprobs, s.tokens_as_ids) if logprobs is not None else None
            last = len(pieces) - 1
            for i, piece in enumerate(pieces):
                choice: dict[str, Any] = {"index": c, "text": piece, "logprobs": None,
                                          "finish_reason": out.finish_reason if i == last else None,
                                          "stop_reason": out.stop_reason if i == last else None}
                if lp is not None and out.ids:
                    choice["logprobs"] = {key: (None if v is None else v[i:i + 1]) for key, v in lp.items()}
                if s.return_token_ids:
                    choice["token_ids"] = out.ids[i:i + 1]
                    if i == 0:
                        choice["prompt_token_ids"] = list(prompts[c // s.n])
                sent += 1 if out.ids else 0
                if not piece and i != last and lp is None and not s.return_token_ids:
                    continue
                chunk: dict[str, Any] = {**head, "choices": [choice]}
                if s.include_usage and s.continuous_usage:
                    chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                                      "total_tokens": prompt_tokens + sent}
                yield _sse(chunk)
        if s.include_usage:
            yield _sse({**head, "choices": [], "usage": self.usage(prompts, outs)})
        yield _SSE_DONE

    # -- /v1/chat/completions --
    def render_chat(self, body: Mapping[str, Any]) -> tuple[list[int], list[Any]]:
        """The prompt ids of a chat request and the images whose tokens they hold (a vision model's processor
        expands each image's placeholder exactly as the ChatAgent does)."""
        from agentgym.utils.images import image_parts

        processor = getattr(self.policy, "processor", None)
        messages = _parse_messages(body, vision=processor is not None)
        images = [image for m in messages for image in image_parts(m.get("content"))]
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError("This model's tokenizer has no chat template; use /v1/completions with a raw prompt.",
                           param="messages", code="no_chat_template")
        tools = _parse_tools(body)
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, Mapping):
            raise APIError("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
        add_generation_prompt = _get_bool(body, "add_generation_prompt", True)
        if getattr(processor, "chat_template", None):  # the template that renders image parts
            template_kwargs = {"chat_template": processor.chat_template, **dict(template_kwargs)}
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                **dict(template_kwargs),
            )
        except Exception as exc:
            raise APIError(f"The chat template rejected the messages: {exc}", param="messages") from exc
        # The template already holds any BOS; encoding it again must not add another (what ChatAgent does too).
        add_special = _get_bool(body, "add_special_tokens", False)
        if images:
            encoded = processor(text=[text], images=[image.array() for image in images], add_special_tokens=add_special)
            ids = [int(t) for t in encoded["input_ids"][0]]
        else:
            ids = list(self.tokenizer.encode(text, add_special_tokens=add_special))
        self.check_prompt_ids(ids, "messages")
        return ids, images

    def tool_calls(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """Hermes ``<tool_call>`` blocks of the reply as OpenAI tool calls, and the text outside them.

        The content is what is left once the calls are cut out, stripped; ``None`` when nothing is left. A block
        that is not valid JSON is not a call and stays in the content (as with vLLM's hermes parser).
        """
        parsed = self._tool_parser.parse(text)
        if not parsed.calls:
            return text, []
        rest, last = [], 0
        for pos, call in zip(parsed.positions, parsed.calls):
            rest.append(text[last:pos])
            last = pos + len(call.raw)
        rest.append(text[last:])
        content = "".join(rest).strip() or None
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments), ensure_ascii=False)}}
                 for call in parsed.calls]
        return content, calls

    async def chat(self, body: Mapping[str, Any]) -> dict[str, Any] | AsyncIterator[str]:
        """The reply as a dict, or (``stream: true``) an async iterator of SSE lines; validation errors raise
        before anything is sent."""
        _check_fields(body, _CHAT_FIELDS, "/v1/chat/completions")
        self.check_model(body)
        _reject_unsupported(body)
        want_logprobs = _get_bool(body, "logprobs", False)
        top_logprobs = _get_int(body, "top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
        if top_logprobs is not None and not want_logprobs:
            raise APIError("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
        if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
            raise APIError("Send either 'max_tokens' or 'max_completion_tokens', not both.", param="max_tokens")
        fmt = body.get("response_format")
        if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
            raise APIError("'response_format' other than {'type': 'text'} is not supported by this server.",
                           param="response_format", code="unsupported")
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        s = _parse_sampling(body, max_tokens_key=key, default_max_tokens=None)
        parse_tools = _tool_choice(body, _parse_tools(body)) != "none"
        self.check_n(s.n, 1)
        prompt_ids, images = await self.off_loop(self.render_chat, body)
        max_tokens = self.resolve_max_tokens(s.max_tokens, len(prompt_ids), "messages")
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        k = top_logprobs if want_logprobs else None
        if s.stream:
            return self._stream_chat(prompt_ids, s, max_tokens, k, want_logprobs, parse_tools, rid, created, images)
        outs = await self.generate([prompt_ids], s, [max_tokens], top_logprobs=top_logprobs or 0,
                                   images=[images] if images else None)
        choices = []
        for i, out in enumerate(outs):
            message: dict[str, Any] = {"role": "assistant", "content": out.text}
            finish_reason = out.finish_reason
            if parse_tools:
                content, calls = self.tool_calls(out.text)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish_reason = "tool_calls"
            choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None,
                                      "finish_reason": finish_reason, "stop_reason": out.stop_reason}
            if want_logprobs:
                choice["logprobs"] = {"content": self.chat_logprobs(out, top_logprobs, s.tokens_as_ids)}
            if s.return_token_ids:
                choice["token_ids"] = out.ids
            choices.append(choice)
        response: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": created,
                                    "model": self.model_name, "choices": choices,
                                    "usage": self.usage([prompt_ids], outs)}
        if s.return_token_ids:
            response["prompt_token_ids"] = prompt_ids
        return response

    async def _stream_chat(self, prompt_ids: list[int], s: _Sampling, max_tokens: int, top_logprobs: int | None,
                           want_logprobs: bool, parse_tools: bool, rid: str, created: int,
                           images: list[Any] | None = None) -> AsyncIterator[str]:
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        prompt_tokens = len(prompt_ids)
        sent = 0

        def chunk(index: int, delta: dict[str, Any], *, logprobs: Any = None, finish: str | None = None,
                  stop_reason: str | int | None = None, token_ids: list[int] | None = None) -> str:
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = stop_reason
            if token_ids is not None:
                choice["token_ids"] = token_ids
            body: dict[str, Any] = {**head, "choices": [choice]}
            if s.include_usage and s.continuous_usage:
                body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                                 "total_tokens": prompt_tokens + sent}
            return _sse(body)

        # The role comes first, at once, as with vLLM (the client sees the request accepted).
        for c in range(s.n):
            if c == 0 and s.return_token_ids:
                yield _sse({**head, "prompt_token_ids": prompt_ids, "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]})
            else:
                yield chunk(c, {"role": "assistant", "content": ""})
        try:
            outs = await self.generate([prompt_ids], s, [max_tokens], top_logprobs=top_logprobs or 0,
                                       images=[images] if images else None)
        except APIError as exc:
            yield _sse({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})
            yield _SSE_DONE
            return
        for c, out in enumerate(outs):
            entries = self.chat_logprobs(out, top_logprobs, s.tokens_as_ids) if want_logprobs else None
            content, calls = self.tool_calls(out.text) if parse_tools else (out.text, [])
            token_ids = out.ids if s.return_token_ids else None
            if calls:
                # The calls are known only once the text is complete: the content outside them in one delta, the
                # parsed calls in the next (what OpenAI's stream accumulators expect).
                sent += len(out.ids)
                if content:
                    yield chunk(c, {"content": content}, token_ids=token_ids,
                                logprobs={"content": entries} if entries is not None else None)
                    entries, token_ids = None, None
                deltas = [{"index": j, "id": call["id"], "type": "function", "function": call["function"]}
                          for j, call in enumerate(calls)]
                yield chunk(c, {"tool_calls": deltas}, token_ids=token_ids,
                            logprobs={"content": entries} if entries is not None else None)
                yield chunk(c, {}, finish="tool_calls", stop_reason=out.stop_reason)
                continue
            for i, piece in enumerate(self.text_pieces(out, s.skip_special_tokens)):
                sent += 1
                if not piece and entries is None and token_ids is None:
                    continue
                yield chunk(c, {"content": piece}, logprobs={"content": entries[i:i + 1]} if entries else None,
                            token_ids=out.ids[i:i + 1] if token_ids is not None else None)
            yield chunk(c, {}, finish=out.finish_reason, stop_reason=out.stop_reason)
        if s.include_usage:
            yield _sse({**head, "choices": [], "usage": self.usage([prompt_ids], outs)})
        yield _SSE_DONE

    # -- /tokenize and /detokenize (vLLM) --
    def _tokenize(self, body: Mapping[str, Any]) -> list[int]:
        if "messages" in body:
            return self.render_chat(body)[0]
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise APIError(f"'prompt' must be a string, got {type(prompt).__name__}.", param="prompt")
        return list(self.tokenizer.encode(prompt, add_special_tokens=_get_bool(body, "add_special_tokens", True)))

    async def tokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_fields(body, _TOKENIZE_FIELDS, "/tokenize")
        self.check_model(body)
        if ("messages" in body) == ("prompt" in body):
            raise APIError("Send exactly one of 'prompt' (a string) or 'messages' (a chat).", param="prompt")
        ids = await self.off_loop(self._tokenize, body)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if _get_bool(body, "return_token_strs", False) else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_fields(body, _DETOKENIZE_FIELDS, "/detokenize")
        self.check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise APIError(f"'tokens' must be a list of token ids, got {tokens!r}.", param="tokens")
        if tokens:
            self.check_prompt_ids(tokens, "tokens")
        return {"prompt": await self.off_loop(self.tokenizer.decode, tokens)}

    def models(self) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.model_name, "object": "model", "created": self.created,
                                "owned_by": "agentgym", "root": self.model_name, "parent": None}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return {"object": "list", "data": [card]}


def _parse_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """``tools`` as the chat template receives them, checked for the OpenAI function shape."""
    tools = body.get("tools")
    if tools is None:
        return None
    shape = "a list of {'type': 'function', 'function': {'name': ..., 'parameters': {...}}} objects"
    if not isinstance(tools, list):
        raise APIError(f"'tools' must be {shape}.", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (not isinstance(tool, Mapping) or tool.get("type", "function") != "function"
                or not isinstance(function, Mapping) or not isinstance(function.get("name"), str)
                or not function["name"]):
            raise APIError(f"tools[{i}] is not a function tool; 'tools' must be {shape}.", param=f"tools[{i}]")
    return [dict(t) for t in tools]


def _tool_choice(body: Mapping[str, Any], tools: list[dict[str, Any]] | None) -> str:
    """Validate ``tool_choice``; returns ``"none"`` (plain text) or the mode under which calls are parsed."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice == "none":
        return "none"
    named = None
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, Mapping) or not isinstance(
                function.get("name"), str):
            raise APIError("'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                           f"{{'name': ...}}}}, got {choice!r}.", param="tool_choice")
        named = function["name"]
    elif choice not in ("auto", "required"):
        raise APIError(f"'tool_choice' must be 'none', 'auto', 'required' or a named function, got {choice!r}."
                       f"{did_you_mean(str(choice), ('none', 'auto', 'required'))}", param="tool_choice")
    if not tools:
        raise APIError(f"'tool_choice' {choice!r} needs 'tools': send the tools the model may call, or drop "
                       "tool_choice.", param="tool_choice")
    if named is not None:
        names = [t["function"]["name"] for t in tools]
        if named not in names:
            raise APIError(f"'tool_choice' names the function {named!r}, which is not in 'tools' "
                           f"({', '.join(names)}).{did_you_mean(named, names)} Name one of the tools.",
                           param="tool_choice")
        return "named"
    return str(choice)


def _prometheus_text(server: _Server, stats: BatchStats) -> str:
    """``/metrics`` in the Prometheus text exposition format (version 0.0.4), every series labelled with the
    model name. Names: ``agentgym:generation_tokens_total``, ``agentgym:prompt_tokens_total``,
    ``agentgym:sequences_total``, ``agentgym:generate_calls_total``, ``agentgym:sequences_aborted_total``,
    ``agentgym:request_success_total{finished_reason}`` (choices), ``agentgym:http_responses_total{endpoint,
    status}``, and the gauges ``agentgym:num_requests_waiting``, ``agentgym:num_requests_running``,
    ``agentgym:max_batch_size_seen`` (vLLM's ``vllm:`` metrics with our prefix where one exists)."""
    model = server.model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]) -> None:
        lines.append(f"# HELP agentgym:{name} {help_text}")
        lines.append(f"# TYPE agentgym:{name} {kind}")
        for labels, value in samples:
            lines.append(f'agentgym:{name}{{model_name="{model}"{labels}}} {value}')

    metric("generation_tokens_total", "counter", "Completion tokens generated.", [("", stats.tokens_generated)])
    metric("prompt_tokens_total", "counter", "Prompt tokens of the sequences run.", [("", stats.prompt_tokens)])
    metric("sequences_total", "counter", "Sequences generated.", [("", stats.requests)])
    metric("generate_calls_total", "counter", "Batches run (policy.generate calls).", [("", stats.generate_calls)])
    metric("sequences_aborted_total", "counter", "Sequences stopped early because the client went away.",
           [("", stats.aborted)])
    metric("request_success_total", "counter", "Choices returned, by finish reason.",
           [(f',finished_reason="{reason}"', count) for reason, count in sorted(server.finished.items())])
    metric("http_responses_total", "counter", "HTTP responses of the API endpoints, by endpoint and status.",
           [(f',endpoint="{endpoint}",status="{status}"', count)
            for (endpoint, status), count in sorted(server.responses.items())])
    metric("num_requests_waiting", "gauge", "Sequences queued for the next batch.", [("", stats.queued)])
    metric("num_requests_running", "gauge", "Sequences in the running batch.", [("", stats.running)])
    metric("max_batch_size_seen", "gauge", "Largest batch run so far.", [("", stats.max_batch_seen)])
    return "\n".join(lines) + "\n"


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
            (an :class:`~agentgym.policies.hf.HFPolicy`). When ``generate`` also takes ``cancelled=`` (one
            ``threading.Event`` per prompt), rows of clients that disconnect are stopped mid-batch.
        model_name: The id clients must send as ``model`` (and that ``/v1/models`` lists).
        max_batch_size: Most sequences in one ``policy.generate`` call; bounds memory and latency.
        batch_window_s: How long the batcher waits for more requests after the first one arrives; a few
            milliseconds let concurrent clients land in the same batch.
        max_queue_size: Sequences that may wait at once; beyond it requests get 503 (clients retry), so an
            overloaded server sheds load instead of growing without bound.

    Returns:
        The app: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``), ``GET /v1/models``,
        ``POST /tokenize``, ``POST /detokenize``, ``GET /health`` and ``GET /metrics``. ``app.state.stats``
        (:class:`BatchStats`) counts batches and requests.
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
            server.close()

    app = FastAPI(title="agentgym OpenAI-compatible server", lifespan=lifespan)
    app.state.stats = batcher.stats
    app.state.policy = policy
    app.state.model_name = model_name

    def counted(endpoint: str, response: Response) -> Response:
        key = (endpoint, response.status_code)
        server.responses[key] = server.responses.get(key, 0) + 1
        return response

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return counted(request.url.path, exc.response())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, str(exc.detail), code=str(exc.status_code))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error while serving a request")
        return counted(request.url.path, _error_response(500, f"Internal server error: {type(exc).__name__}: {exc}",
                                                         type="server_error"))

    async def answer(request: Request, handler: Any) -> Response:
        """Run a generation endpoint; a stream goes out as SSE, anything else as JSON.

        A client that disconnects while its request waits cancels the handler, which stops its sequences (queued
        ones are skipped; running ones end at the next decoding step). Streams are cancelled by Starlette itself
        when the client goes away.
        """
        body = await _json_body(request)
        task = asyncio.ensure_future(handler(body))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
                if done:
                    break
                if await request.is_disconnected():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                    logger.info("Client of %s disconnected; its request was cancelled", request.url.path)
                    return counted(request.url.path, Response(status_code=499))
        finally:
            if not task.done():  # this handler itself was cancelled (shutdown): stop the work too
                task.cancel()
        result = task.result()
        if isinstance(result, dict):
            return counted(request.url.path, JSONResponse(result))
        return counted(request.url.path, StreamingResponse(result, media_type="text/event-stream",
                                                           headers={"Cache-Control": "no-cache"}))

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(server.models())

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "model": model_name, **batcher.stats.as_dict()})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(_prometheus_text(server, batcher.stats),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, server.completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, server.chat)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        return JSONResponse(await server.tokenize(await _json_body(request)))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        return JSONResponse(await server.detokenize(await _json_body(request)))

    return app


# ---- running it ------------------------------------------------------------------------------------


def _check_model_dir(model_dir: str | Path) -> Path:
    """The local model directory: ``model_dir`` itself, or a Hub id's snapshot in the local Hugging Face cache."""
    from agentgym.models.loading import resolve_model_dir

    return resolve_model_dir(model_dir)


def _served_name(model_dir: str | Path, path: Path) -> str:
    """Default id clients send as ``model``: the Hub id as given, else the directory's name (a snapshot's name
    is a commit hash, which nobody would guess)."""
    from agentgym.models.loading import is_hub_id

    from_hub = is_hub_id(model_dir) and not Path(str(model_dir)).expanduser().is_dir()
    return str(model_dir) if from_hub else path.resolve().name


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
    record_dir: str | Path | None = None,
) -> None:
    """Serve a local HF model directory until interrupted (what ``agentgym serve`` runs).

    Args:
        model_dir: A directory written by ``save_pretrained`` (model and tokenizer).
        host: Interface to bind; the default stays on loopback so nothing is exposed by accident.
        port: TCP port.
        model_name: Id clients send as ``model``; defaults to the directory's name.
        max_batch_size: Most sequences per forward batch.
        record_dir: Put the recording gateway (:mod:`agentgym.serving.gateway`) in front and write sessions here.
    """
    path = _check_model_dir(model_dir)
    if not 0 <= port <= 65535:
        raise ConfigError(f"port must be in [0, 65535], got {port}.")
    uvicorn = _import_uvicorn()
    name = model_name or _served_name(model_dir, path)
    app = create_app(_load_policy(path), model_name=name, max_batch_size=max_batch_size)
    if record_dir is not None:
        from agentgym.serving.gateway import create_gateway_app

        app = create_gateway_app(app, record_dir)
        logger.info("Recording sessions in %s (name each session: see agentgym.serving.gateway)", record_dir)
    logger.info("Serving %s as %r on http://%s:%d/v1", path, name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")


class ServerThread:
    """Runs the server in a background thread on a free port (for tests, notebooks and benchmarks).

    Binding the socket here (port 0 picks a free one) rather than letting uvicorn do it means the port is
    known before the thread starts and no other process can take it in between.

    Args:
        model_dir_or_policy: A model directory, or an already loaded policy (tests reuse one model), or a ready
            FastAPI app (e.g. the recording gateway in front of a remote server), served as it is.
        host: Interface to bind.
        port: TCP port; 0 picks a free one.
        model_name: Id clients send as ``model``; defaults to the directory's name or ``policy.name``.
        max_batch_size: Most sequences per forward batch.
        batch_window_s: See :func:`create_app`.
        startup_timeout_s: How long :meth:`start` waits for ``/v1/models`` to answer.
        record_dir: Put the recording gateway (:mod:`agentgym.serving.gateway`) in front of the model and write sessions
            here (``app.state.gateway`` opens sessions from Python).

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
        record_dir: str | Path | None = None,
    ) -> None:
        if isinstance(model_dir_or_policy, FastAPI):
            self.policy, name = getattr(model_dir_or_policy.state, "policy", None), model_name or "model"
        elif isinstance(model_dir_or_policy, (str, Path)):
            path = _check_model_dir(model_dir_or_policy)
            self.policy = _load_policy(path)
            name = model_name or _served_name(model_dir_or_policy, path)
        else:
            self.policy = model_dir_or_policy
            name = model_name or getattr(model_dir_or_policy, "name", None) or "model"
        self.model_name = name
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        if isinstance(model_dir_or_policy, FastAPI):
            self.app = model_dir_or_policy
        else:
            self.app = create_app(self.policy, model_name=name, max_batch_size=max_batch_size,
                                  batch_window_s=batch_window_s)
        if record_dir is not None:
            from agentgym.serving.gateway import create_gateway_app

            self.app = create_gateway_app(self.app, record_dir)
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
    """``python -m agentgym.serving.openai_server MODEL_DIR [--host H] [--port P] [--model-name N] [--max-batch-size B]``."""
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
