"""A policy backed by any OpenAI-compatible server (``vllm serve``, ``agentgym serve``, hosted APIs).

Two modes, because training and evaluation need different things:

* ``completions``: the agent's exact prompt token ids go to ``/v1/completions`` and the sampled token ids
  and log-probs come back (vLLM's ``return_token_ids`` / ``return_tokens_as_token_ids`` extensions), so
  nothing is re-tokenised and trajectories are fit for training. Needs a tokenizer and a server that
  accepts token-id prompts (vLLM, ``agentgym serve``).
* ``chat``: messages go to ``/v1/chat/completions`` and text comes back; works with any server, including
  hosted APIs, and is what evaluation of closed models uses. Given a tokenizer, the policy also asks
  for token ids and log-probs (``return_token_ids``: vLLM >= 0.10.2 and ``agentgym serve`` return them)
  so the agent can keep a token view. The server renders the conversation with *its* chat template, so
  the sampled ids are only trainable if that rendering equals the agent's: the policy puts the server's
  ``prompt_token_ids`` into :attr:`Generation.prompt_token_ids` and counts in :attr:`OpenAIPolicy.stats`
  how often they differ from the request's (``prompt_checked`` / ``prompt_mismatches``); the ChatAgent
  keeps a mismatched turn's text but never records its ids. A server that reports no prompt ids cannot
  be checked: the policy then returns no token ids at all (``prompt_unverified`` counts them, and a
  tokenising agent stops with an error) rather than ids that only look trainable. Training runs should
  use ``completions`` mode, where the server conditions on the agent's own ids.

Images (GUI screenshots) go to the server in chat mode as OpenAI ``image_url`` content parts holding a
``data:image/png;base64,...`` URI, the form vLLM, ``agentgym serve`` and hosted APIs accept for vision models;
``images=False`` shows a text-only model the text part of each observation instead. Completions mode sends token
ids, which cannot carry pixels, so it is text-only.

In both modes ``SamplingParams.top_logprobs = k`` asks the server for the k best alternatives per token
(``logprobs: k`` or ``top_logprobs: k``) and fills ``Generation.top_logprobs`` with them, the sampled token's
log-prob appended when it is not among them, as HFPolicy and VLLMPolicy do: that is what ARPO's
entropy-guided branching measures. A server that ignores the request is an error, not a silent guess.

Requests of one :meth:`OpenAIPolicy.act` call are sent concurrently (the server batches them), bounded by
``max_concurrency``; transient failures (connection errors, timeouts, 429, 5xx) are retried with
exponential backoff and jitter, while other 4xx errors fail at once with the server's message, because
retrying a bad request cannot help.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import ssl
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from agentgym.errors import AgentGymError, ConfigError, ContextLengthExceeded, DependencyNotInstalled
from agentgym.utils.images import ImageRef
from agentgym.policies.base import (
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    prompt_token_ids,
    refuse_choices,
)

__all__ = ["OpenAIContextLengthError", "OpenAIPolicy", "OpenAIServerError"]

logger = logging.getLogger(__name__)

_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")
_RETRY_AFTER_CAP_S = 60.0
_BACKGROUND: set[asyncio.Future[Any]] = set()  # keeps fire-and-forget closes alive until they finish


class OpenAIServerError(AgentGymError):
    """The server refused a request, or could not be reached after every retry.

    Attributes:
        status_code: The HTTP status of the last answer, or ``None`` when no answer came (connection error).
    """

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class OpenAIContextLengthError(OpenAIServerError, ContextLengthExceeded):
    """The server refused a request because its prompt plus ``max_tokens`` does not fit the model's context."""


# How OpenAI-compatible servers word a prompt that does not fit: OpenAI ("exceeds the context window"), vLLM and
# agentgym serve ("maximum context length is"), vLLM ("longer than the maximum model length", "is too long and exceeds
# limit"), LiteLLM and Mistral ("maximum context length of"), SGLang ("longer than the model's context length"),
# llama.cpp ("exceeds the available context size"), TGI ("`inputs` tokens + `max_new_tokens` must be <="), Anthropic's
# compatible endpoint ("prompt is too long"), xAI ("maximum prompt length is"). TGI's "`max_new_tokens` must be <= N"
# alone is a setting too large for any prompt, not a conversation that outgrew the model: it stays an error.
_CONTEXT_LENGTH_MESSAGE = re.compile(
    r"context[ _-]?(length|window)|exceeds? the available context|maximum model length|is too long and exceeds"
    r"|`inputs` tokens \+ `max_new_tokens` must be <=|prompt is too long|maximum prompt length", re.IGNORECASE)
_CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})


def _is_context_length_error(response: httpx.Response, message: str) -> bool:
    """Whether a refused request was refused for its length (then retrying it can never succeed)."""
    if response.status_code not in (400, 413, 422):
        return False
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping) and (error.get("code") in _CONTEXT_LENGTH_CODES
                                       or error.get("type") in _CONTEXT_LENGTH_CODES):
        return True
    return bool(_CONTEXT_LENGTH_MESSAGE.search(message))


async def _close_when_loop_shuts_down(clients: Sequence[httpx.AsyncClient]) -> AsyncIterator[None]:
    """An async generator whose ``finally`` closes ``clients``.

    Once started, the running loop tracks it, and ``asyncio.run`` finalises every live async generator
    (``loop.shutdown_asyncgens``) before it closes the loop. That is the last moment the client's
    connections can be closed on the loop that opened them, so a client never outlives its loop with
    sockets open, even when the caller never calls :meth:`OpenAIPolicy.aclose`.
    """
    try:
        yield
    finally:
        for client in clients:
            await client.aclose()


@dataclass
class _LoopState:
    """What must belong to one event loop: the HTTP clients, the concurrency bound, the discovery lock."""

    clients: list[httpx.AsyncClient]
    semaphore: asyncio.Semaphore
    model_lock: asyncio.Lock
    closer: Any  # the started _close_when_loop_shuts_down generator
    next_client: int = 0

    def client(self) -> httpx.AsyncClient:
        """Round-robin over the clients (see _CONNECTIONS_PER_CLIENT)."""
        self.next_client = (self.next_client + 1) % len(self.clients)
        return self.clients[self.next_client]


# httpcore's pool scans every connection for every queued request, which is quadratic: at 128 requests in
# flight on one client it spent ~20 ms of CPU per request (measured). Several small pools keep it linear.
_CONNECTIONS_PER_CLIENT = 8

# uvicorn, which serves vLLM, SGLang and `agentgym serve`, closes a connection idle for 5 s; httpx's default is to
# keep one for 5 s too, so a request sent on a connection the server is closing at that moment fails with a
# ReadError and waits out a retry's backoff (2 of the 3,072 requests of one benchmarks/rollout_throughput.py row,
# where tool calls leave connections idle for seconds). Forgetting idle connections a second sooner leaves no such race.
_KEEPALIVE_EXPIRY_S = 4.0


def _normalise_base_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigError("OpenAIPolicy needs base_url, e.g. 'http://127.0.0.1:8000/v1'.")
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"base_url {base_url!r} is not an http(s) URL; expected e.g. 'http://127.0.0.1:8000/v1'."
        )
    path = parts.path.rstrip("/")
    if not path:
        # OpenAI clients expect the /v1 prefix in base_url; a bare host almost always means ".../v1".
        logger.info("base_url %r has no path; using %r/v1 as OpenAI-compatible servers do.", base_url, base_url)
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _load_tokenizer(tokenizer: Any) -> Any:
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer
    path = Path(tokenizer).expanduser()
    if not path.exists():
        raise ConfigError(
            f"tokenizer path {str(path)!r} does not exist. Pass a local model/tokenizer directory or a tokenizer "
            "object (nothing is downloaded from a hub)."
        )
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise DependencyNotInstalled("transformers", "train", "loading a tokenizer for OpenAIPolicy") from exc
    return AutoTokenizer.from_pretrained(str(path))


def _server_message(response: httpx.Response) -> str:
    """The error message an OpenAI-style server put in its body, or the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail"):  # FastAPI default error shape
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return str(body)[:500]


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return min(max(float(value), 0.0), _RETRY_AFTER_CAP_S)
    except ValueError:
        return None


def _wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as OpenAI's API takes it: image parts (:class:`~agentgym.utils.images.ImageRef`) become ``image_url``
    parts with a PNG data URI; text and plain-string content pass unchanged."""
    content = message.get("content")
    if isinstance(content, str) or not content:
        return dict(message)
    parts = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image" and isinstance(part.get("image"), ImageRef):
            parts.append({"type": "image_url", "image_url": {"url": part["image"].data_uri()}})
        else:
            parts.append(dict(part))
    return {**message, "content": parts}


def _finish_reason(value: Any) -> str:
    return "length" if value == "length" else "stop"


class OpenAIPolicy(Policy):
    """Act through an OpenAI-compatible HTTP server.

    Args:
        base_url: The API root including ``/v1`` (``http://127.0.0.1:8000/v1``); a bare host gets ``/v1``.
        model: Model id to request; ``None`` asks ``GET /models`` on first use and takes the first one (a
            single-model server such as ``vllm serve`` or ``agentgym serve``).
        mode: ``completions`` (exact token ids in and out; for training) or ``chat`` (messages in, text out;
            works with any server).
        api_key: Bearer token; defaults to ``$OPENAI_API_KEY``, else ``"EMPTY"`` (what local servers accept).
        tokenizer: A tokenizer object or a local directory to load one from. Required in ``completions`` mode,
            where the agent tokenises the conversation. Setting it makes the policy token-level: the agent
            then expects token ids back (in chat mode only servers with ``return_token_ids`` give them).
        timeout_s: Per-request timeout; generation of long turns on a busy server can take a while.
        max_retries: Retries after the first attempt for connection errors, timeouts, 429 and 5xx.
        backoff_s: First retry delay; doubles each retry, with jitter so clients do not retry in lockstep.
        max_concurrency: Most HTTP requests in flight at once (the server batches them).
        extra_body: Extra JSON fields merged into every request body (e.g. vLLM's ``top_k``).
        name: Shown in eval tables; defaults to ``openai:MODEL``.
        images: In chat mode without a tokenizer, send observation images as ``image_url`` data URIs (a vision
            model); ``False`` sends the text part only (a text-only model). Completions mode and chat mode with a
            tokenizer are text-only (the agent's token view has no processor to expand images with).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        mode: Literal["completions", "chat"] = "chat",
        api_key: str | None = None,
        tokenizer: Any = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
        extra_body: Mapping[str, Any] | None = None,
        name: str | None = None,
        images: bool = True,
    ) -> None:
        if mode not in ("completions", "chat"):
            raise ConfigError(f"OpenAIPolicy mode must be 'completions' or 'chat', got {mode!r}.")
        if model is not None and (not isinstance(model, str) or not model):
            raise ConfigError(f"OpenAIPolicy model must be a non-empty string or None (discover it), got {model!r}.")
        if mode == "completions" and tokenizer is None:
            raise ConfigError(
                "OpenAIPolicy(mode='completions') needs tokenizer=... (the model's tokenizer object or local "
                "directory): the agent sends exact prompt token ids. Pass tokenizer, or use mode='chat'."
            )
        if not timeout_s > 0:
            raise ConfigError(f"OpenAIPolicy timeout_s must be > 0, got {timeout_s}.")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"OpenAIPolicy max_retries must be an integer >= 0, got {max_retries!r}.")
        if backoff_s < 0:
            raise ConfigError(f"OpenAIPolicy backoff_s must be >= 0, got {backoff_s}.")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ConfigError(f"OpenAIPolicy max_concurrency must be an integer >= 1, got {max_concurrency!r}.")
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ConfigError(f"OpenAIPolicy extra_body must be a dict of JSON fields, got {type(extra_body).__name__}.")
        self.base_url = _normalise_base_url(base_url)
        self.model = model
        self.mode = mode
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.tokenizer = _load_tokenizer(tokenizer)
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.extra_body = dict(extra_body or {})
        self._name = name
        if not isinstance(images, bool):
            raise ConfigError(f"OpenAIPolicy images must be True or False, got {images!r}.")
        self.accepts_images = images and mode == "chat" and self.tokenizer is None
        # The server batches on its own, so the rollout engine may keep many act() calls in flight; the
        # per-loop semaphore is what actually bounds the HTTP requests.
        self.max_concurrency = max_concurrency
        # The server batches on its own: the engine sends each request as its own call, so every episode
        # continues as soon as *its* reply arrives instead of waiting for a whole batch.
        self.max_batch_size = 1
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._tls: ssl.SSLContext | None = None  # built on first use, shared by every client (see _state)
        # Chat mode with a tokenizer: how many replies had their prompt checked against the server's
        # rendering, how many differed (their ids are not trainable) and how many could not be checked.
        self.stats: dict[str, int] = {"prompt_checked": 0, "prompt_mismatches": 0, "prompt_unverified": 0}
        self._warned: set[str] = set()

    @property
    def name(self) -> str:  # type: ignore[override]
        """``openai:MODEL`` unless given; follows the model found by discovery."""
        return self._name or f"openai:{self.model or self.base_url}"

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    # ---- per-loop client -----------------------------------------------------------------------
    async def _state(self) -> _LoopState:
        """The client of the running loop, created on first use.

        An ``httpx.AsyncClient`` is bound to the loop that opened its connections, and every ``asyncio.run``
        makes a new loop, so one client per loop (forgotten with the loop) instead of one per policy.
        """
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            # A state refers to its loop (semaphore, lock), so dead loops are not collected on their own.
            for dead in [lp for lp in self._loops if lp.is_closed()]:
                del self._loops[dead]
            n_clients = -(-self.max_concurrency // _CONNECTIONS_PER_CLIENT)
            per_client = -(-self.max_concurrency // n_clients)
            if self._tls is None:
                # httpx builds (and loads the CA bundle into) a new SSL context for every client unless given
                # one: 40 ms each, 0.6 s for the 16 clients of 128 requests in flight (measured), paid
                # before the first request of every run. One context serves every client and loop.
                self._tls = httpx.create_ssl_context()
            clients = [
                httpx.AsyncClient(
                    verify=self._tls,
                    timeout=httpx.Timeout(self.timeout_s),
                    headers={"Authorization": f"Bearer {self.api_key}"},
                    limits=httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client,
                                        keepalive_expiry=_KEEPALIVE_EXPIRY_S),
                )
                for _ in range(n_clients)
            ]
            closer = _close_when_loop_shuts_down(clients)
            await closer.__anext__()
            state = _LoopState(clients, asyncio.Semaphore(self.max_concurrency), asyncio.Lock(), closer)
            self._loops[loop] = state
        return state

    async def aclose(self) -> None:
        """Close the HTTP client of the running loop (and forget clients of other loops)."""
        loop = asyncio.get_running_loop()
        state = self._loops.pop(loop, None)
        if state is not None:
            await state.closer.aclose()
        self.close()

    def close(self) -> None:
        """Close every HTTP client this policy opened, on whichever loop it belongs to."""
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        states = list(self._loops.items())
        self._loops.clear()
        for loop, state in states:
            if loop.is_closed():
                continue  # its async generators, and so the client, were finalised when it shut down
            if loop is current:
                task = loop.create_task(state.closer.aclose())
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(state.closer.aclose(), loop)
            else:
                loop.run_until_complete(state.closer.aclose())

    # ---- HTTP ----------------------------------------------------------------------------------
    async def _request(self, state: _LoopState, method: str, path: str, payload: Mapping[str, Any] | None = None) -> Any:
        """Send one request with retries; return the decoded JSON body."""
        url = self.base_url + path
        attempts = self.max_retries + 1
        last_error = ""
        last_status: int | None = None
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                async with state.semaphore:
                    response = await state.client().request(method, url, json=payload)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                last_error = f"{type(exc).__name__}: {exc or 'no detail'}"
                last_status = None
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise OpenAIServerError(
                            f"{method} {url} answered HTTP {response.status_code} with a body that is not JSON: "
                            f"{response.text[:200]!r}. Is base_url an OpenAI-compatible API root (ending in /v1)?",
                            response.status_code,
                        ) from exc
                message = _server_message(response)
                last_status = response.status_code
                if response.status_code != 429 and response.status_code < 500:
                    if _is_context_length_error(response, message):
                        raise OpenAIContextLengthError(
                            f"{method} {url} was refused for its length (HTTP {response.status_code}): {message}",
                            response.status_code,
                        )
                    hint = ""
                    if response.status_code == 404 and "model" not in message.lower():
                        hint = " Check that base_url ends with /v1 and the server implements this endpoint."
                    raise OpenAIServerError(
                        f"{method} {url} was rejected with HTTP {response.status_code}: {message}{hint}",
                        response.status_code,
                    )
                last_error = f"HTTP {response.status_code}: {message}"
                retry_after = _retry_after_s(response)
            if attempt + 1 >= attempts:
                break
            delay = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.5)
            if retry_after is not None:
                delay = max(delay, retry_after)
            logger.warning("%s %s failed (%s); retry %d/%d in %.2f s", method, url, last_error, attempt + 1,
                           self.max_retries, delay)
            await asyncio.sleep(delay)
        raise OpenAIServerError(
            f"{method} {url} failed after {attempts} attempt(s); last error: {last_error}. Check that the server is "
            f"running and reachable at {self.base_url}, or raise max_retries/timeout_s.",
            last_status,
        )

    async def _model_name(self, state: _LoopState) -> str:
        if self.model is not None:
            return self.model
        async with state.model_lock:
            if self.model is None:
                body = await self._request(state, "GET", "/models")
                data = body.get("data") if isinstance(body, Mapping) else None
                if not data or not isinstance(data[0], Mapping) or not data[0].get("id"):
                    raise OpenAIServerError(
                        f"GET {self.base_url}/models listed no model ({str(body)[:200]}); pass model=... explicitly."
                    )
                self.model = str(data[0]["id"])
                if len(data) > 1:
                    logger.info("Server lists %d models; using the first, %r.", len(data), self.model)
            return self.model

    # ---- payloads ------------------------------------------------------------------------------
    def _sampling_fields(self, sampling: SamplingParams) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        }
        if sampling.stop:
            fields["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            fields["seed"] = sampling.seed
        return fields

    async def _complete(self, state: _LoopState, model: str, request: GenerationRequest) -> Generation:
        payload: dict[str, Any] = {
            "model": model, "prompt": prompt_token_ids(request, self.tokenizer), **self._sampling_fields(request.sampling),
            "logprobs": max(1, request.sampling.top_logprobs), "return_token_ids": True, "return_tokens_as_token_ids": True,
        }
        if request.sampling.stop:
            payload["include_stop_str_in_output"] = True  # the Policy contract keeps the stop string
        payload.update(self.extra_body)
        body = await self._request(state, "POST", "/completions", payload)
        choice = self._first_choice(body, "/completions")
        text = choice.get("text") or ""
        logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), Mapping) else {}
        ids = choice.get("token_ids")
        if ids is None and logprobs.get("tokens"):
            ids = self._ids_from_tokens(logprobs["tokens"])
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise OpenAIServerError(
                f"{self.base_url}/completions returned no completion token ids. mode='completions' needs a server "
                "that supports vLLM's return_token_ids or return_tokens_as_token_ids (vLLM >= 0.10.2, "
                "agentgym serve); use mode='chat' for other servers."
            )
        lps = self._logprobs(logprobs.get("token_logprobs"), len(ids))
        k = request.sampling.top_logprobs
        top, top_ids = None, None
        if k:
            rows = logprobs.get("top_logprobs")
            alternatives = None
            if isinstance(rows, list):
                alternatives = [list(r.items()) if isinstance(r, Mapping) else None for r in rows]
            top, top_ids = self._alternatives(alternatives, logprobs.get("tokens"), lps, k, len(ids), "/completions")
        return Generation(text=text, token_ids=tuple(ids), logprobs=lps, top_logprobs=top, top_token_ids=top_ids,
                          finish_reason=_finish_reason(choice.get("finish_reason")))

    async def _chat(self, state: _LoopState, model: str, request: GenerationRequest) -> Generation:
        payload: dict[str, Any] = {
            "model": model, "messages": [_wire_message(m) for m in request.messages],
            **self._sampling_fields(request.sampling),
        }
        k = request.sampling.top_logprobs
        if self.tokenizer is not None:
            payload["logprobs"] = True
            payload["return_token_ids"] = True
        if k:
            payload["logprobs"] = True
            payload["top_logprobs"] = k
        payload.update(self.extra_body)
        body = await self._request(state, "POST", "/chat/completions", payload)
        choice = self._first_choice(body, "/chat/completions")
        message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
        text = message.get("content") or ""
        stop_reason = choice.get("stop_reason")
        if isinstance(stop_reason, str) and stop_reason in request.sampling.stop and not text.endswith(stop_reason):
            # OpenAI drops the matched stop string; the Policy contract keeps it (vLLM says which one matched).
            text += stop_reason
        ids = choice.get("token_ids")
        token_ids: tuple[int, ...] | None = None
        lps: tuple[float, ...] | None = None
        server_prompt = self._server_prompt_ids(body, choice) if self.tokenizer is not None else None
        if self.tokenizer is not None and isinstance(ids, list) and server_prompt is None:
            self.stats["prompt_unverified"] += 1
            self._warn_once("unverified", "%s/chat/completions reported no prompt_token_ids, so the token ids of its "
                            "replies cannot be checked against the agent's prompt and are not returned. Use "
                            "mode='completions' (the server then conditions on the agent's own ids) or a server "
                            "with return_token_ids (vLLM >= 0.10.2, agentgym serve).", self.base_url)
        elif self.tokenizer is not None and isinstance(ids, list) and all(isinstance(t, int) for t in ids):
            self._check_prompt(request, server_prompt)
            token_ids = tuple(ids)
            content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
            if isinstance(content, list):
                lps = self._logprobs([c.get("logprob") if isinstance(c, Mapping) else None for c in content], len(ids))
        elif self.tokenizer is not None:
            logger.warning("%s/chat/completions returned no token ids although a tokenizer is set; the agent needs "
                           "them (use mode='completions' or a server with return_token_ids).", self.base_url)
        top, top_ids = None, None
        if k:
            content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
            entries = [c if isinstance(c, Mapping) else {} for c in content] if isinstance(content, list) else []
            alternatives = [[(a.get("token"), a.get("logprob")) for a in e["top_logprobs"] if isinstance(a, Mapping)]
                            if isinstance(e.get("top_logprobs"), list) else None for e in entries] if entries else None
            sampled = self._logprobs([e.get("logprob") for e in entries], len(entries))
            top, top_ids = self._alternatives(alternatives, [e.get("token") for e in entries], sampled, k,
                                              len(entries), "/chat/completions")
        return Generation(text=text, token_ids=token_ids, logprobs=lps, top_logprobs=top, top_token_ids=top_ids,
                          finish_reason=_finish_reason(choice.get("finish_reason")),
                          prompt_token_ids=server_prompt if token_ids is not None else None)

    @staticmethod
    def _server_prompt_ids(body: Any, choice: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The prompt ids the chat server conditioned on (top level in vLLM and agentgym serve, per choice in
        some versions), or ``None`` when it did not report them."""
        for holder in (body, choice):
            ids = holder.get("prompt_token_ids") if isinstance(holder, Mapping) else None
            if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                return tuple(ids)
        return None

    def _check_prompt(self, request: GenerationRequest, server_prompt: tuple[int, ...]) -> None:
        """Count whether the server's rendering of the conversation is the agent's (the ids are trainable)."""
        expected = prompt_token_ids(request, self.tokenizer)
        self.stats["prompt_checked"] += 1
        if tuple(expected) == server_prompt:
            return
        self.stats["prompt_mismatches"] += 1
        self._warn_once("mismatch", "%s/chat/completions rendered the conversation differently from the agent "
                        "(%d server prompt ids vs %d); replies sampled from another prompt are kept as text but their "
                        "ids are not trainable (OpenAIPolicy.stats['prompt_mismatches'] counts them). Use "
                        "mode='completions' to send the agent's exact ids, or give the agent the server's "
                        "tokenizer and chat template.", self.base_url, len(server_prompt), len(expected))

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _alternatives(self, rows: list[list[tuple[Any, Any]] | None] | None, tokens: Any,
                      sampled: tuple[float, ...] | None, k: int, n: int,
                      path: str) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[int, ...], ...] | None]:
        """``Generation.top_logprobs`` (and ``top_token_ids`` when the tokens are ``token_id:N``) from a
        response's per-position alternatives: the k best, then the sampled token's when it is not among them."""
        if (rows is None or len(rows) != n or any(r is None for r in rows) or sampled is None
                or not isinstance(tokens, list) or len(tokens) != n):
            raise OpenAIServerError(
                f"{self.base_url}{path} returned no top-{k} log-probs for every generated token although they were "
                "asked for (entropy-guided branching, ARPO, measures them). Use a server that returns them "
                "(vLLM, agentgym serve) or set entropy_weight=0."
            )
        values_out: list[tuple[float, ...]] = []
        ids_out: list[tuple[int, ...]] | None = []
        for row, token, own in zip(rows, tokens, sampled):
            ranked = sorted(((str(t), float(v)) for t, v in row if isinstance(v, (int, float))),
                            key=lambda tv: tv[1], reverse=True)[:k]
            names = [t for t, _ in ranked]
            values = tuple(v for _, v in ranked)
            # the sampled token is among the k when one has its name *and* its log-prob (two ids can share a text)
            if not any(t == token and abs(v - own) <= 1e-5 * max(1.0, abs(own)) for t, v in ranked):
                names.append(str(token))
                values += (own,)
            values_out.append(values)
            ids = self._ids_from_tokens(names) if ids_out is not None else None
            if ids is None:
                ids_out = None  # tokens came as text: the values are known, the ids are not
            else:
                ids_out.append(tuple(ids))
        return tuple(values_out), (tuple(ids_out) if ids_out is not None else None)

    def _first_choice(self, body: Any, path: str) -> Mapping[str, Any]:
        choices = body.get("choices") if isinstance(body, Mapping) else None
        if not choices or not isinstance(choices[0], Mapping):
            raise OpenAIServerError(f"{self.base_url}{path} answered without choices: {str(body)[:300]}")
        return choices[0]

    @staticmethod
    def _ids_from_tokens(tokens: Sequence[Any]) -> list[int] | None:
        """Token ids from ``return_tokens_as_token_ids`` log-prob tokens (``"token_id:123"``)."""
        ids = []
        for token in tokens:
            match = _TOKEN_ID_RE.match(token) if isinstance(token, str) else None
            if match is None:
                return None
            ids.append(int(match.group(1)))
        return ids

    @staticmethod
    def _logprobs(values: Any, n: int) -> tuple[float, ...] | None:
        if not isinstance(values, list) or len(values) != n or any(not isinstance(v, (int, float)) for v in values):
            return None
        return tuple(float(v) for v in values)

    # ---- Policy --------------------------------------------------------------------------------
    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Send every request concurrently; the first failure cancels the rest and is raised."""
        if not requests:
            return []
        refuse_choices(self, requests)
        state = await self._state()
        model = await self._model_name(state)
        one = self._complete if self.mode == "completions" else self._chat
        tasks = [asyncio.ensure_future(one(state, model, r)) for r in requests]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
