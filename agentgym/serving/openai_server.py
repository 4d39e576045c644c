"""An OpenAI-compatible HTTP server for a local Hugging Face model (``agentgym serve``).

Why a server of our own when ``vllm serve`` exists: vLLM needs CUDA, and the CPU machines this project
runs on still need to exercise the exact code path that talks to a remote model (``OpenAIPolicy``), to
serve the tiny model to several processes at once, and to let any OpenAI client talk to a trained
checkpoint. The server speaks the subset of the OpenAI API that agents use, plus the vLLM extensions that
token-level training needs (``return_token_ids``, ``return_tokens_as_token_ids``,
``include_stop_str_in_output``), so the same client code works against ``vllm serve`` on a GPU.

Requests are not run one by one: a bounded batcher runs up to ``max_batch_size`` of them in a single
:meth:`HFPolicy.generate` call (:mod:`agentgym.serving.batcher`), so throughput grows with concurrency while
memory and CPU use stay bounded. Completion token ids include the EOS / end-of-turn token when the model ended
with it, so trajectories collected through the server have the same token view as those collected in-process.

Beyond the core endpoints it speaks what agent frameworks send to ``vllm serve``: SSE streaming with
``stream_options.include_usage``, ``n > 1``, Hermes tool-call parsing into ``message.tool_calls`` (the
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` format of vLLM's ``hermes`` parser), the vLLM
sampling extras ``stop_token_ids``, ``ignore_eos`` and ``skip_special_tokens``, and ``/tokenize``,
``/detokenize`` and a Prometheus ``/metrics``. Sampling numbers are checked per request (NaN, infinity,
strings are a 400 for that request alone), a client that disconnects cancels its rows in the running batch
(:meth:`HFPolicy.generate`'s ``cancelled`` events), and chat templates and tokenisation run in a small thread
pool so that a huge body never stalls the event loop.

One request cannot take the server down or hold it: bodies over 8 MiB are refused (413) before they are read,
prompt text is capped in characters before it is tokenised and in tokens against the context after, and ``n`` and
the tokens a request makes the model process (``n * (prompt + max_tokens)``) have limits; each refusal names the
limit and the ``agentgym serve`` flag that raises it (:mod:`agentgym.serving.limits`). With ``--api-key`` (or
``$AGENTGYM_API_KEY``) every route but ``/health`` needs the key (:mod:`agentgym.serving.auth`).

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
* ``n`` is capped at 128 by default (vLLM: 16384, ``VLLM_MAX_N_SEQUENCES``) and request bodies at 8 MiB (vLLM sets
  no limit); both are flags (``--max-n``, ``--max-body-bytes``).
* ``/metrics`` uses the ``agentgym:`` prefix (see :func:`agentgym.serving.metrics.prometheus_text` for the names).

This module runs the server (:func:`run_server`, :class:`ServerThread`, :func:`serve_in_background`); its parts
live beside it in :mod:`agentgym.serving`:

* :mod:`~agentgym.serving.openai_protocol`: request fields, validation, and the error and SSE shapes;
* :mod:`~agentgym.serving.batcher` and :mod:`~agentgym.serving.metrics`: batching and its counters;
* :mod:`~agentgym.serving.openai_generation` and :mod:`~agentgym.serving.openai_endpoints`: generation and its
  post-processing, and the endpoints;
* :mod:`~agentgym.serving.openai_app`: the FastAPI app (:func:`create_app`);
* :mod:`~agentgym.serving.http`: the socket and lifecycle shared with the gateway and the env server.

The names those modules had here before the split are still importable from this module.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.serving.batcher import Batcher
from agentgym.serving.limits import RequestLimits
from agentgym.serving.http import BackgroundServer, bind_socket, check_port, import_uvicorn, serve
from agentgym.serving.metrics import BatchStats
from agentgym.serving.openai_app import create_app
from agentgym.serving.openai_defaults import format_banner, served_defaults
from agentgym.serving.openai_endpoints import OpenAIEndpoints
from agentgym.serving.openai_protocol import APIError, _message_text, json_body  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agentgym.policies.hf import HFPolicy

__all__ = ["BatchStats", "ServerThread", "create_app", "run_server", "serve_in_background"]

logger = logging.getLogger(__name__)

# The names the parts had when they lived in this module (tests and older code import them from here).
_Batcher = Batcher
_Server = OpenAIEndpoints
_json_body = json_body
_import_uvicorn = import_uvicorn


def __getattr__(name: str) -> object:
    # ``main``, the program behind ``python -m agentgym.serve``, is a command: it lives in the cli layer.
    from agentgym.utils.deprecation import moved_name

    return moved_name(__name__, name, "agentgym.cli.serve", ("main",))


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


def _record(app: Any, record_dir: str | Path | None, api_key: str | None = None) -> Any:
    """``app`` behind the recording gateway when ``record_dir`` is given.

    The gateway calls ``app`` in-process without the client's headers, so with an ``api_key`` the key is checked
    in front of the gateway (``app`` itself must then be built without one)."""
    if record_dir is None:
        return app
    from agentgym.serving.gateway import create_gateway_app

    gateway = create_gateway_app(app, record_dir)
    if api_key is not None:
        from agentgym.serving.auth import ApiKeyMiddleware

        gateway.add_middleware(ApiKeyMiddleware, api_key=api_key)
    return gateway


def run_server(
    model_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    max_batch_size: int = 32,
    record_dir: str | Path | None = None,
    limits: RequestLimits | None = None,
    api_key: str | None = None,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve a local HF model directory until interrupted (what ``agentgym serve`` runs).

    Args:
        model_dir: A directory written by ``save_pretrained`` (model and tokenizer).
        host: Interface to bind; the default stays on loopback so nothing is exposed by accident.
        port: TCP port.
        model_name: Id clients send as ``model``; defaults to the directory's name.
        max_batch_size: Most sequences per forward batch.
        record_dir: Put the recording gateway (:mod:`agentgym.serving.gateway`) in front and write sessions here.
        limits: What one request may ask (see :class:`~agentgym.serving.limits.RequestLimits`).
        api_key: Require this key on every route but ``/health`` (``None``: serve openly).
        announce: Called with each progress line while loading and with the banner once serving (what is served,
            where, the defaults published to clients, the limits); ``None`` logs them at INFO.
    """
    say = announce if announce is not None else (lambda line: logger.info("%s", line))
    path = _check_model_dir(model_dir)
    limits = limits if limits is not None else RequestLimits()
    check_port(port)
    import_uvicorn()  # a missing extra fails before the model loads
    name = model_name or _served_name(model_dir, path)
    inner_key = api_key if record_dir is None else None  # with a gateway, the key is checked in front of it
    # Loading takes from seconds (the tiny model) to minutes: say what is happening, so a silent terminal is
    # never mistaken for a server that is up (or hung).
    say(f"agentgym serve: loading {path} (importing torch and transformers, then the tokenizer and weights)...")
    started = time.perf_counter()
    policy = _load_policy(path)
    load_s = time.perf_counter() - started
    defaults = served_defaults(path, policy)
    say(f"agentgym serve: model loaded in {load_s:.1f} s; starting the HTTP server...")
    app = _record(create_app(policy, model_name=name, max_batch_size=max_batch_size, limits=limits,
                             api_key=inner_key, defaults=defaults), record_dir, api_key)
    sock = bind_socket(host, port)

    def ready(url: str) -> None:
        say(format_banner(model_dir=path, name=name, url=url, defaults=defaults, limits=limits,
                          api_key=api_key is not None, record_dir=record_dir, load_s=load_s))

    serve(app, sock, log_level="info", on_ready=ready)


class ServerThread(BackgroundServer):
    """Runs the server in a background thread on a free port (for tests, notebooks and benchmarks).

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
        limits: What one request may ask (see :class:`~agentgym.serving.limits.RequestLimits`).
        api_key: Require this key on every route but ``/health`` (``None``: serve openly).
        defaults: The settings to publish to clients (:func:`~agentgym.serving.openai_defaults.served_defaults`);
            ``None``: those of the model directory's ``agentgym.json`` (none for a policy object).

    Attributes:
        app: The FastAPI app (``app.state.stats`` counts batches).
        base_url: ``http://HOST:PORT/v1`` once started (what :class:`OpenAIPolicy` takes).
    """

    def __init__(
        self,
        model_dir_or_policy: str | Path | HFPolicy | FastAPI,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
        max_batch_size: int = 32,
        batch_window_s: float = 0.005,
        startup_timeout_s: float = 60.0,
        record_dir: str | Path | None = None,
        limits: RequestLimits | None = None,
        api_key: str | None = None,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        from fastapi import FastAPI

        if isinstance(model_dir_or_policy, FastAPI):
            app = model_dir_or_policy
            self.policy, name = getattr(app.state, "policy", None), model_name or "model"
        else:
            if isinstance(model_dir_or_policy, (str, Path)):
                path = _check_model_dir(model_dir_or_policy)
                self.policy = _load_policy(path)
                name = model_name or _served_name(model_dir_or_policy, path)
                if defaults is None:
                    defaults = served_defaults(path, self.policy)
            else:
                self.policy = model_dir_or_policy
                name = model_name or getattr(model_dir_or_policy, "name", None) or "model"
            app = create_app(self.policy, model_name=name, max_batch_size=max_batch_size,
                             batch_window_s=batch_window_s, limits=limits,
                             api_key=api_key if record_dir is None else None, defaults=defaults)
        self.model_name = name
        # /health needs no API key, so a server that requires one is still seen to be up.
        ready = "/health" if hasattr(app.state, "limits") else "/v1/models"
        super().__init__(_record(app, record_dir, api_key), host=host, port=port, ready_path=ready,
                         startup_timeout_s=startup_timeout_s)
        self.base_url = ""

    def start(self) -> str:
        """Start serving and return the base URL (``http://HOST:PORT/v1``) once ``/v1/models`` answers."""
        self.base_url = super().start() + "/v1"
        return self.base_url

    def __enter__(self) -> ServerThread:
        self.start()
        return self


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
