"""The endpoints of the OpenAI-compatible server: ``/v1/completions``, ``/v1/chat/completions`` (both with SSE
streaming), ``/tokenize``, ``/detokenize`` and the model card of ``/v1/models`` (and ``/v1/models/{id}``).

Structured output (``response_format`` ``json_object`` / ``json_schema``, vLLM's ``guided_json``, what the ``openai``
SDK's ``.parse()`` sends) is constrained decoding: the sampler only offers tokens that keep the reply a prefix of a
document valid under the schema, and ends it only when the document is complete
(:mod:`agentgym.policies.json_constraint`); a schema keyword outside the supported subset is a 400 that names it.

Each endpoint validates the whole request before anything is generated (see :mod:`agentgym.serving.openai_protocol`),
so a stream never starts for a request that would fail. Beyond OpenAI's fields they speak the vLLM extensions that
token-level training needs (``return_token_ids``, ``return_tokens_as_token_ids``, ``include_stop_str_in_output``)
and Hermes tool-call parsing into ``message.tool_calls`` (the ``<tool_call>{"name": ..., "arguments": ...}
</tool_call>`` format of vLLM's ``hermes`` parser), so the same client code works against ``vllm serve``.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from agentgym.parsers import HermesParser
from agentgym.policies.json_constraint import JsonConstraint, TokenVocabulary, UnsupportedSchema
from agentgym.serving.batcher import Batcher
from agentgym.serving.limits import RequestLimits
from agentgym.serving.openai_generation import ServedModel
from agentgym.serving.openai_protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    DETOKENIZE_FIELDS,
    ANY_JSON_OBJECT,
    MAX_LOGPROBS,
    TOKENIZE_FIELDS,
    APIError,
    Sampling,
    check_fields,
    get_bool,
    get_int,
    parse_json_format,
    parse_messages,
    parse_sampling,
    parse_tool_choice,
    parse_tools,
    reject_unsupported,
)
from agentgym.serving.openai_streaming import stream_chat, stream_completions

if TYPE_CHECKING:
    from agentgym.policies.hf import HFPolicy

__all__ = ["OpenAIEndpoints"]

#: Schemas whose constraints (and their cached token scans) are kept, least recently used dropped first.
_JSON_SCHEMAS_KEPT = 64


class OpenAIEndpoints(ServedModel):
    """Request handling of each endpoint: a request body in, a response body (or an SSE stream) out.

    Args:
        policy: Anything with ``tokenizer`` and ``generate(prompts, samplings)`` (an HFPolicy).
        model_name: The id clients send as ``model``.
        batcher: The batcher that runs the policy.
        limits: What one request may ask (n, prompt characters, tokens); defaults to :class:`RequestLimits`'s.
    """

    def __init__(self, policy: HFPolicy, model_name: str, batcher: Batcher,
                 limits: RequestLimits | None = None) -> None:
        super().__init__(policy, model_name, batcher, limits)
        self._tool_parser = HermesParser(native=False)
        #: How the model was trained to be prompted (see :func:`agentgym.serving.openai_defaults.served_defaults`);
        #: published on ``/v1/models`` and ``/agentgym/defaults`` so that clients can prompt it the same way.
        self.defaults: dict[str, Any] = {}
        self._json_lock = threading.Lock()
        self._json_vocabulary: TokenVocabulary | None = None
        self._json_constraints: dict[str, JsonConstraint] = {}

    # -- /v1/completions --
    def parse_prompts(self, body: Mapping[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt")
        add_special = get_bool(body, "add_special_tokens", True)

        def encode(text: str, param: str) -> list[int]:
            if not text:
                raise APIError(f"'{param}' is empty; send a non-empty string or a list of token ids.", param=param)
            return list(self.tokenizer.encode(text, add_special_tokens=add_special))

        def is_ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        # Every prompt string together is capped before any of it is tokenised: tokenising is the cost.
        if isinstance(prompt, str):
            self.check_prompt_chars(len(prompt), "prompt")
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            self.check_prompt_chars(sum(len(p) for p in prompt), "prompt")
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
            self.check_prompt_ids(ids, "prompt" if len(prompts) == 1 else f"prompt[{i}]", context=True)
        return prompts

    async def completions(self, body: Mapping[str, Any]) -> dict[str, Any] | AsyncIterator[str]:
        """The reply as a dict, or (``stream: true``) an async iterator of SSE lines; validation errors raise
        before anything is sent."""
        check_fields(body, COMPLETION_FIELDS, "/v1/completions")
        self.check_model(body)
        reject_unsupported(body)
        if get_bool(body, "echo", False):
            raise APIError("'echo' is not supported by this server; omit it.", param="echo", code="unsupported")
        if body.get("suffix") is not None:
            raise APIError("'suffix' (insertion) is not supported by this server; omit it.", param="suffix",
                           code="unsupported")
        logprobs = get_int(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
        s = parse_sampling(body, default_max_tokens=16)
        best_of = get_int(body, "best_of", None, minimum=1)
        if best_of is not None and best_of != s.n:
            raise APIError(f"'best_of' = {best_of} is not supported by this server (it returns every sample); omit "
                           f"it or set it to n ({s.n}).", param="best_of", code="unsupported")
        self.check_max_n(s.n)
        prompts = await self.off_loop(self.parse_prompts, body)
        self.check_n(s.n, len(prompts))
        max_tokens = [self.resolve_max_tokens(s.max_tokens, len(p), "prompt") for p in prompts]
        self.check_budget(s.n, [len(p) for p in prompts], max_tokens)
        s = await self.structured(body, s, max_tokens)
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

    def _stream_completions(self, prompts: list[list[int]], s: Sampling, max_tokens: list[int],
                            logprobs: int | None, rid: str, created: int) -> AsyncIterator[str]:
        return stream_completions(self, prompts, s, max_tokens, logprobs, rid, created)

    # -- structured output --
    async def structured(self, body: Mapping[str, Any], s: Sampling, max_tokens: list[int]) -> Sampling:
        """``s`` with the token constraint of the request's ``response_format`` / ``guided_json`` (none for free
        text): every reply is then one JSON document valid under the schema (see
        :mod:`agentgym.policies.json_constraint`)."""
        schema = parse_json_format(body)
        if schema is None:
            return s
        param = "guided_json" if body.get("guided_json") is not None else "response_format"
        if s.ignore_eos:
            raise APIError("'ignore_eos' would write past the end of the JSON document; drop it with "
                           f"'{param}'.", param="ignore_eos")
        constraint = await self.off_loop(self._json_constraint, schema, param)
        if min(max_tokens) < constraint.min_tokens:
            raise APIError(f"The shortest JSON document valid under this schema takes up to {constraint.min_tokens} "
                           f"tokens with the end token, but max_tokens is {min(max_tokens)}; raise max_tokens.",
                           param="max_tokens")
        return dataclasses.replace(s, constraint=constraint)

    def _json_constraint(self, schema: Mapping[str, Any] | str, param: str) -> JsonConstraint:
        """The constraint of a schema, built once per schema (its per-state token scans are cached inside it)."""
        key = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        with self._json_lock:
            constraint = self._json_constraints.pop(key, None)
            if constraint is None:
                if self._json_vocabulary is None:
                    self._json_vocabulary = TokenVocabulary(self.tokenizer)
                try:
                    constraint = JsonConstraint(None if schema == ANY_JSON_OBJECT else schema, self._json_vocabulary)
                except UnsupportedSchema as exc:
                    raise APIError(f"'{param}': {exc}", param=param, code="unsupported_schema") from exc
            self._json_constraints[key] = constraint  # most recently used last
            while len(self._json_constraints) > _JSON_SCHEMAS_KEPT:
                self._json_constraints.pop(next(iter(self._json_constraints)))
        return constraint

    # -- /v1/chat/completions --
    def render_chat(self, body: Mapping[str, Any]) -> tuple[list[int], list[Any]]:
        """The prompt ids of a chat request and the images whose tokens they hold (a vision model's processor
        expands each image's placeholder exactly as the ChatAgent does)."""
        from agentgym.utils.images import image_parts

        processor = getattr(self.policy, "processor", None)
        template = getattr(processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        messages = parse_messages(body, vision=processor is not None, chat_template=template)
        images = [image for m in messages for image in image_parts(m.get("content"))]
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError("This model's tokenizer has no chat template; use /v1/completions with a raw prompt.",
                           param="messages", code="no_chat_template")
        tools = parse_tools(body)
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, Mapping):
            raise APIError("'chat_template_kwargs' must be an object.", param="chat_template_kwargs")
        add_generation_prompt = get_bool(body, "add_generation_prompt", True)
        if getattr(processor, "chat_template", None):  # the template that renders image parts
            template_kwargs = {"chat_template": processor.chat_template, **dict(template_kwargs)}
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                **dict(template_kwargs),
            )
        except Exception as exc:
            raise APIError(f"The chat template rejected the messages: {exc}", param="messages") from exc
        self.check_prompt_chars(len(text), "messages")
        # The template already holds any BOS; encoding it again must not add another (what ChatAgent does too).
        add_special = get_bool(body, "add_special_tokens", False)
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
        check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
        self.check_model(body)
        reject_unsupported(body)
        want_logprobs = get_bool(body, "logprobs", False)
        top_logprobs = get_int(body, "top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
        if top_logprobs is not None and not want_logprobs:
            raise APIError("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
        if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
            raise APIError("Send either 'max_tokens' or 'max_completion_tokens', not both.", param="max_tokens")
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        s = parse_sampling(body, max_tokens_key=key, default_max_tokens=None)
        with_tools = parse_tool_choice(body, parse_tools(body)) != "none"
        self.check_n(s.n, 1)
        prompt_ids, images = await self.off_loop(self.render_chat, body)
        max_tokens = self.resolve_max_tokens(s.max_tokens, len(prompt_ids), "messages")
        self.check_budget(s.n, [len(prompt_ids)], [max_tokens])
        s = await self.structured(body, s, [max_tokens])
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        k = top_logprobs if want_logprobs else None
        if s.stream:
            return self._stream_chat(prompt_ids, s, max_tokens, k, want_logprobs, with_tools, rid, created, images)
        outs = await self.generate([prompt_ids], s, [max_tokens], top_logprobs=top_logprobs or 0,
                                   images=[images] if images else None)
        choices = []
        for i, out in enumerate(outs):
            message: dict[str, Any] = {"role": "assistant", "content": out.text}
            finish_reason = out.finish_reason
            if with_tools:
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

    def _stream_chat(self, prompt_ids: list[int], s: Sampling, max_tokens: int, top_logprobs: int | None,
                     want_logprobs: bool, with_tools: bool, rid: str, created: int,
                     images: list[Any] | None = None) -> AsyncIterator[str]:
        return stream_chat(self, prompt_ids, s, max_tokens, top_logprobs, want_logprobs, with_tools, rid, created,
                           images)

    def _tokenize(self, body: Mapping[str, Any]) -> list[int]:
        if "messages" in body:
            return self.render_chat(body)[0]
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise APIError(f"'prompt' must be a string, got {type(prompt).__name__}.", param="prompt")
        self.check_prompt_chars(len(prompt), "prompt")
        return list(self.tokenizer.encode(prompt, add_special_tokens=get_bool(body, "add_special_tokens", True)))

    async def tokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        check_fields(body, TOKENIZE_FIELDS, "/tokenize")
        self.check_model(body)
        if ("messages" in body) == ("prompt" in body):
            raise APIError("Send exactly one of 'prompt' (a string) or 'messages' (a chat).", param="prompt")
        ids = await self.off_loop(self._tokenize, body)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if get_bool(body, "return_token_strs", False) else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        check_fields(body, DETOKENIZE_FIELDS, "/detokenize")
        self.check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise APIError(f"'tokens' must be a list of token ids, got {tokens!r}.", param="tokens")
        if tokens:
            self.check_prompt_ids(tokens, "tokens")
        return {"prompt": await self.off_loop(self.tokenizer.decode, tokens)}

    def model(self, model_id: str) -> dict[str, Any]:
        """``GET /v1/models/{id}`` (``client.models.retrieve``): the model object, or a 404 in OpenAI's error shape
        (``code: model_not_found``) for an id this server does not serve."""
        self.check_model({"model": model_id})
        return self._card()

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._card()]}

    def _card(self) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.model_name, "object": "model", "created": self.created,
                                "owned_by": "agentgym", "root": self.model_name, "parent": None}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        if self.defaults:
            # An extra field on the model object, as vLLM adds max_model_len: OpenAI clients ignore it.
            card["agentgym"] = dict(self.defaults)
        return card
