"""The FastAPI app of the OpenAI-compatible server (:func:`create_app`): routes, error rendering, disconnects.

The app owns the batcher's lifetime (its lifespan starts and stops it), renders every error in OpenAI's format
(a refused request is the :class:`~agentgym.serving.openai_protocol.APIError` that says why; anything unexpected
is a 500 ``server_error`` with the exception named), and watches each waiting request's connection so that a
client that goes away cancels its work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError, DependencyNotInstalled
from agentgym.serving.auth import ApiKeyMiddleware, resolve_api_key
from agentgym.serving.batcher import Batcher
from agentgym.serving.limits import BodySizeLimitMiddleware, RequestLimits
from agentgym.serving.metrics import prometheus_text
from agentgym.serving.openai_defaults import DEFAULTS_PATH
from agentgym.serving.openai_endpoints import OpenAIEndpoints
from agentgym.serving.openai_protocol import APIError, error_response, json_body

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise DependencyNotInstalled("fastapi", "serve", "the OpenAI-compatible server") from exc

if TYPE_CHECKING:
    from agentgym.policies.hf import HFPolicy

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

#: How often a waiting request checks whether its client is still connected.
_DISCONNECT_POLL_S = 0.1


def create_app(
    policy: HFPolicy,
    *,
    model_name: str,
    max_batch_size: int = 32,
    batch_window_s: float = 0.005,
    max_queue_size: int = 4096,
    limits: RequestLimits | None = None,
    api_key: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    prefix_reuse: bool = True,
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
        limits: What one request may ask: body bytes, prompt characters, ``n`` and its token budget
            (:class:`~agentgym.serving.limits.RequestLimits`; its defaults when ``None``). A body over the limit is
            a 413 before it is read; the others are a 400 that names the limit and the flag that raises it.
        api_key: When given, every route but ``/health`` needs it (``Authorization: Bearer <key>`` or
            ``x-api-key``; :class:`~agentgym.serving.auth.ApiKeyMiddleware`); ``None`` serves openly. The
            environment is not read here: ``agentgym serve`` resolves ``--api-key`` / ``$AGENTGYM_API_KEY``.
        defaults: How the model was trained to be prompted (system prompt, max tokens, ...;
            :func:`~agentgym.serving.openai_defaults.served_defaults`), published as the ``agentgym`` field of the
            ``/v1/models`` model object and on ``GET /agentgym/defaults``; ``None`` or empty publishes nothing there.
        prefix_reuse: Keep each finished sequence's keys and values (least recently used evicted first) so that a
            request whose prompt extends an earlier one (the next turn of a chat) computes only its new tokens, as
            vLLM's prefix caching does; results equal recomputing up to float rounding.

    Returns:
        The app: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``), ``GET /v1/models``,
        ``POST /tokenize``, ``POST /detokenize``, ``GET /agentgym/defaults``, ``GET /health`` and ``GET /metrics``. ``app.state.stats``
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
    limits = limits if limits is not None else RequestLimits()
    if not isinstance(limits, RequestLimits):
        raise ConfigError(f"limits must be a RequestLimits, got {type(limits).__name__}.")
    key = resolve_api_key(api_key) if api_key is not None else None
    if api_key is not None and key is None:
        raise ConfigError("api_key is empty; pass None to serve without a key.")

    batcher = Batcher(policy, max_batch_size=max_batch_size, window_s=batch_window_s, max_queue_size=max_queue_size,
                      prefix_reuse=prefix_reuse)
    server = OpenAIEndpoints(policy, model_name, batcher, limits)
    if defaults is not None and not isinstance(defaults, Mapping):
        raise ConfigError(f"defaults must be a dict (the model's agentgym.json settings), got {type(defaults).__name__}.")
    server.defaults = dict(defaults or {})

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
    app.state.limits = limits

    def refused(path: str) -> None:
        # Only the API's own paths become labels: any path may be sent, and /metrics must not grow with them.
        if path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
            label = (path, 413)
            server.responses[label] = server.responses.get(label, 0) + 1

    # The last middleware added runs first: the key is checked before a byte of the body is read.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=limits.max_body_bytes, on_refused=refused)
    if key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=key)

    def counted(endpoint: str, response: Response) -> Response:
        key = (endpoint, response.status_code)
        server.responses[key] = server.responses.get(key, 0) + 1
        return response

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return counted(request.url.path, exc.response())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), code=str(exc.status_code))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("Unhandled error while serving a request")
        return counted(request.url.path, error_response(500, f"Internal server error: {type(exc).__name__}: {exc}",
                                                         type="server_error"))

    async def answer(request: Request, handler: Any) -> Response:
        """Run a generation endpoint; a stream goes out as SSE, anything else as JSON.

        A client that disconnects while its request waits cancels the handler, which stops its sequences (queued
        ones are skipped; running ones end at the next decoding step). Streams are cancelled by Starlette itself
        when the client goes away.
        """
        body = await json_body(request)
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

    @app.get("/v1/models/{model_id:path}")  # ids may hold a slash (org/name), as hub names do
    async def model(model_id: str) -> JSONResponse:
        return JSONResponse(server.model(model_id))  # an unknown id: APIError, a 404 in OpenAI's shape

    @app.get(DEFAULTS_PATH)
    async def published_defaults() -> JSONResponse:
        return JSONResponse({"model": model_name, "defaults": server.defaults})

    @app.get("/health")
    async def health() -> JSONResponse:
        batcher.refresh()
        return JSONResponse({"status": "ok", "model": model_name, **batcher.stats.as_dict()})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        batcher.refresh()
        return PlainTextResponse(prometheus_text(model_name, batcher.stats, server.finished, server.responses),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, server.completions)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, server.chat)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        return JSONResponse(await server.tokenize(await json_body(request)))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        return JSONResponse(await server.detokenize(await json_body(request)))

    return app
