"""HTTP to an OpenAI-compatible server: one client pool per event loop, retries with backoff, clear errors.

:class:`~agentgym.policies.openai.OpenAIPolicy` builds on this. What belongs here is everything about talking to
a server and nothing about what is said: transient failures (connection errors, timeouts, 429, 5xx) are retried
with exponential backoff and jitter (honouring ``Retry-After``), while other 4xx errors fail at once with the
server's message, because retrying a bad request cannot help; a prompt refused for its length becomes
:class:`OpenAIContextLengthError`, which the rollout engine ends an episode on instead of failing the run.
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
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from agentgym.errors import AgentGymError, ConfigError, ContextLengthExceeded

__all__ = ["OpenAIContextLengthError", "OpenAIHTTPClient", "OpenAIServerError"]

logger = logging.getLogger(__name__)

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


class OpenAIHTTPClient:
    """Requests to one OpenAI-compatible API root, with retries, from whichever event loop is running.

    Args:
        base_url: The API root including ``/v1`` (``http://127.0.0.1:8000/v1``); a bare host gets ``/v1``.
        model: Model id to request; ``None`` asks ``GET /models`` on first use and takes the first one (a
            single-model server such as ``vllm serve`` or ``agentgym serve``).
        api_key: Bearer token; defaults to ``$OPENAI_API_KEY``, else ``"EMPTY"`` (what local servers accept).
        timeout_s: Per-request timeout; generation of long turns on a busy server can take a while.
        max_retries: Retries after the first attempt for connection errors, timeouts, 429 and 5xx.
        backoff_s: First retry delay; doubles each retry, with jitter so clients do not retry in lockstep.
        max_concurrency: Most HTTP requests in flight at once (the server batches them).

    Raises:
        ConfigError: If an argument is out of range or ``base_url`` is not an http(s) URL.
    """

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 timeout_s: float = 120.0, max_retries: int = 3, backoff_s: float = 0.5,
                 max_concurrency: int = 64) -> None:
        if model is not None and (not isinstance(model, str) or not model):
            raise ConfigError(f"OpenAIPolicy model must be a non-empty string or None (discover it), got {model!r}.")
        if not timeout_s > 0:
            raise ConfigError(f"OpenAIPolicy timeout_s must be > 0, got {timeout_s}.")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"OpenAIPolicy max_retries must be an integer >= 0, got {max_retries!r}.")
        if backoff_s < 0:
            raise ConfigError(f"OpenAIPolicy backoff_s must be >= 0, got {backoff_s}.")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ConfigError(f"OpenAIPolicy max_concurrency must be an integer >= 1, got {max_concurrency!r}.")
        self.base_url = _normalise_base_url(base_url)
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.max_concurrency = max_concurrency
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._tls: ssl.SSLContext | None = None  # built on first use, shared by every client (see _state)

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
        """Close every HTTP client opened here, on whichever loop it belongs to."""
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
        """The model to request: the one given, else the first the server lists (asked once, under a lock)."""
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
