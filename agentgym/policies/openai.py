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

A model trained here was prompted in one way (its system prompt, often empty, and a per-turn token budget), and a
client that prompts it otherwise measures nothing: :meth:`OpenAIPolicy.fetch_server_defaults` reads what
``agentgym serve`` publishes about that and applies the system prompt; ``agentgym eval`` calls it and lets its own
flags win.

Requests of one :meth:`OpenAIPolicy.act` call are sent concurrently (the server batches them), bounded by
``max_concurrency``. How they travel (one client pool per event loop, retries with backoff for transient failures,
errors that carry the server's message) is :mod:`agentgym.policies.openai_http`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agentgym.errors import ConfigError, DependencyNotInstalled
from agentgym.policies.base import (
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    prompt_token_ids,
    refuse_choices,
)
from agentgym.policies.chat_messages import normalize_messages, wire_messages
from agentgym.policies.openai_http import (
    OpenAIContextLengthError,
    OpenAIHTTPClient,
    OpenAIServerError,
    _LoopState,
)
from agentgym.utils.images import ImageRef

__all__ = ["OpenAIContextLengthError", "OpenAIPolicy", "OpenAIServerError"]

logger = logging.getLogger(__name__)

_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")


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


def _wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as OpenAI's API takes it: image parts (:class:`~agentgym.utils.images.ImageRef`) become ``image_url``
    parts with a PNG data URI; text and plain-string content pass unchanged; tool-call arguments held as objects
    travel as JSON strings."""
    (message,) = wire_messages([message])
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


def _local_prompt_ids(request: GenerationRequest, tokenizer: Any) -> list[int]:
    """The request's prompt ids, or its messages rendered here as a vLLM-style server renders them (normalised
    first: tool-call argument strings as objects, ``developer`` where the template lacks it as ``system``), so the
    comparison with the server's ids and completions-mode prompts see the conversation the server sees."""
    if request.prompt_token_ids is not None:
        return prompt_token_ids(request, tokenizer)
    messages = tuple(normalize_messages(request.messages, getattr(tokenizer, "chat_template", None)))
    return prompt_token_ids(GenerationRequest(messages=messages, sampling=request.sampling), tokenizer)


def _finish_reason(value: Any) -> str:
    return "length" if value == "length" else "stop"


class OpenAIPolicy(OpenAIHTTPClient, Policy):
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
        if mode == "completions" and tokenizer is None:
            raise ConfigError(
                "OpenAIPolicy(mode='completions') needs tokenizer=... (the model's tokenizer object or local "
                "directory): the agent sends exact prompt token ids. Pass tokenizer, or use mode='chat'."
            )
        super().__init__(base_url, model, api_key=api_key, timeout_s=timeout_s, max_retries=max_retries,
                         backoff_s=backoff_s, max_concurrency=max_concurrency)
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ConfigError(f"OpenAIPolicy extra_body must be a dict of JSON fields, got {type(extra_body).__name__}.")
        self.mode = mode
        self.tokenizer = _load_tokenizer(tokenizer)
        self.extra_body = dict(extra_body or {})
        self._name = name
        if not isinstance(images, bool):
            raise ConfigError(f"OpenAIPolicy images must be True or False, got {images!r}.")
        self.accepts_images = images and mode == "chat" and self.tokenizer is None
        # The server batches on its own, so the rollout engine may keep max_concurrency act() calls in flight; the
        # client's per-loop semaphore is what actually bounds the HTTP requests.
        # The server batches on its own: the engine sends each request as its own call, so every episode
        # continues as soon as *its* reply arrives instead of waiting for a whole batch.
        self.max_batch_size = 1
        # Chat mode with a tokenizer: how many replies had their prompt checked against the server's
        # rendering, how many differed (their ids are not trainable) and how many could not be checked.
        self.stats: dict[str, int] = {"prompt_checked": 0, "prompt_mismatches": 0, "prompt_unverified": 0}
        self._warned: set[str] = set()
        #: What the server says the model was trained with (``agentgym serve`` publishes its ``agentgym.json``:
        #: ``system_prompt``, ``max_tokens``, ...); filled by :meth:`fetch_server_defaults`, empty until then.
        self.server_defaults: dict[str, Any] = {}

    @property
    def name(self) -> str:  # type: ignore[override]
        """``openai:MODEL`` unless given; follows the model found by discovery."""
        return self._name or f"openai:{self.model or self.base_url}"

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    # ---- the server's defaults ------------------------------------------------------------------
    def fetch_server_defaults(self) -> dict[str, Any]:
        """Ask the server how its model was trained to be prompted, and prompt it so unless told otherwise.

        ``agentgym serve`` adds an ``agentgym`` field to its model object on ``GET /models`` holding the model
        directory's ``agentgym.json`` (system prompt, max tokens, ...); other servers (vLLM, hosted APIs) add
        none, which gives ``{}``. A published ``system_prompt`` becomes :attr:`default_system_prompt` (what the
        rollout engine uses when ``RolloutConfig.system_prompt`` is ``None``, i.e. when the caller did not set
        one); ``max_tokens`` is returned for the caller to use when it set none (sampling is the caller's). With
        no ``model`` given, the first listed model is taken, as on first use.

        Returns:
            The published defaults (also kept in :attr:`server_defaults`).

        Raises:
            OpenAIServerError: The server cannot be reached (after the retries) or refuses the request (a wrong
                key); a server that has no ``/models`` route gives ``{}``.
        """
        try:
            body = self._get_sync("/models")
        except OpenAIServerError as exc:
            if exc.status_code not in (404, 405, 501):
                raise
            # A server without GET /models (some proxies) publishes nothing; requests may still work.
            self._warn_once("no-models", "%s/models is not served (%s); no published settings to apply.",
                            self.base_url, exc)
            return {}
        data = body.get("data") if isinstance(body, Mapping) else None
        cards = [c for c in data if isinstance(c, Mapping)] if isinstance(data, list) else []
        if self.model is None and cards and cards[0].get("id"):
            self.model = str(cards[0]["id"])
        card = next((c for c in cards if c.get("id") == self.model), None)
        published = card.get("agentgym") if card is not None else None
        self.server_defaults = dict(published) if isinstance(published, Mapping) else {}
        prompt = self.server_defaults.get("system_prompt", ...)
        if (prompt is None or isinstance(prompt, str)) and self.default_system_prompt is None:
            self.default_system_prompt = prompt
        if self.server_defaults:
            logger.info("%s publishes the settings %r was trained with: %s", self.base_url, self.model,
                        {k: v for k, v in self.server_defaults.items() if k in ("system_prompt", "max_tokens")})
        return dict(self.server_defaults)

    def _get_sync(self, path: str) -> Any:
        """``GET path`` outside any event loop (set-up time), with the same retries as every other request."""
        async def get() -> Any:
            try:
                return await self._request(await self._state(), "GET", path)
            finally:
                await self.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(get())
        raise ConfigError("OpenAIPolicy.fetch_server_defaults() blocks: call it before the event loop runs, or await "
                          "the policy's requests from a thread.")

    # ---- payloads ------------------------------------------------------------------------------
    def _sampling_fields(self, sampling: SamplingParams) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        }
        if sampling.stop:
            fields["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            fields["seed"] = sampling.seed
        schema = getattr(sampling.constraint, "json_schema", None)
        if isinstance(schema, Mapping):  # a JSON-schema constraint: the server decodes under it (structured output)
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "reply", "schema": dict(schema), "strict": True}}
        return fields

    async def _complete(self, state: _LoopState, model: str, request: GenerationRequest) -> Generation:
        payload: dict[str, Any] = {
            "model": model, "prompt": _local_prompt_ids(request, self.tokenizer),
            **self._sampling_fields(request.sampling),
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
        expected = _local_prompt_ids(request, self.tokenizer)
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
