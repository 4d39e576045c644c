"""Generation for the OpenAI-compatible server: a request's sequences through the batcher, and the
post-processing that turns a policy's :class:`~agentgym.policies.base.Generation` into an OpenAI choice.

The policy samples with temperature, top_p and vLLM's processing fields (top_k, min_p, the penalties, min_tokens,
logit_bias; :mod:`agentgym.policies.sampling_rules`) and stops at end-of-turn tokens, ``stop_token_ids`` and stop
strings. Its tokens reach :meth:`ServedModel.stream` one decode step at a time. The rest of what vLLM does to a
generation happens here, on the finished generation:

* ``stop_token_ids`` cut it after the first such token (which stays in ``token_ids``, as in vLLM; a policy without
  them in its sampler, such as a scripted stand-in, is cut here);
* ``ignore_eos`` continues a row that ended on an end-of-turn token with a new generation over prompt + output,
  until ``max_tokens``;
* ``skip_special_tokens`` and ``include_stop_str_in_output`` decide the text, and streams get one delta per token,
  decoded incrementally so a multi-byte character never splits;
* a seed makes a request reproducible whatever else shares its batch: each of the ``n`` choices gets a seed
  derived from the request's, and the policy samples each row from its own seeded stream.

Completion token ids include the EOS / end-of-turn token when the model ended with it (exactly what
:class:`~agentgym.policies.hf.HFPolicy` returns), so trajectories collected through the server have the same
token view as trajectories collected in-process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError, did_you_mean
from agentgym.policies.base import Generation, SamplingParams
from agentgym.policies.seeding import row_seeds
from agentgym.serving.batcher import Batcher
from agentgym.serving.limits import RequestLimits
from agentgym.serving.openai_protocol import APIError, Sampling

if TYPE_CHECKING:
    from agentgym.policies.hf import HFPolicy

__all__ = ["Output", "ServedModel"]


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
class Output:
    """One choice after the server's post-processing (stop token ids, stop strings, special tokens)."""

    ids: list[int]
    text: str
    finish_reason: str
    stop_reason: str | int | None
    gen: Generation
    #: The ids whose decoding gives ``text`` before stop strings cut it (for incremental stream deltas).
    text_ids: list[int] = field(default_factory=list)


class ServedModel:
    """The model behind the endpoints: the policy, its tokenizer and the batcher, the checks every request gets
    (model name, context length, vocabulary) and what the server does to a generation before it is returned.

    Args:
        policy: Anything with ``tokenizer`` and ``generate(prompts, samplings)`` (an HFPolicy).
        model_name: The id clients send as ``model``.
        batcher: The batcher that runs the policy.
        limits: What one request may ask (n, prompt characters, tokens); defaults to :class:`RequestLimits`'s.
    """

    def __init__(self, policy: HFPolicy, model_name: str, batcher: Batcher,
                 limits: RequestLimits | None = None) -> None:
        self.policy = policy
        self.limits = limits if limits is not None else RequestLimits()
        self.tokenizer = policy.tokenizer
        if self.tokenizer is None:
            raise ConfigError("The policy has no tokenizer; the server needs one to encode prompts and decode tokens.")
        self.model_name = model_name
        self.batcher = batcher
        self.max_model_len = _max_model_len(policy)
        self.vocab_size = _vocab_size(policy)
        self.created = int(time.time())
        self._token_text_cache: dict[int, str] = {}
        # Chat templates and tokenisation of big bodies run here, off the event loop; small and separate from
        # the generation thread so they never wait behind a batch.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentgym-tokenize")
        #: Finished choices by finish reason, and HTTP responses by endpoint and status (for /metrics).
        self.finished: dict[str, int] = {}
        self.responses: dict[tuple[str, int], int] = {}

    def close(self) -> None:
        """Stop the tokenizer pool (the app's lifespan calls this at shutdown)."""
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

    def check_prompt_chars(self, chars: int, param: str) -> None:
        """Refuse prompt text longer than ``max_prompt_chars`` before it is tokenised (tokenising is the cost)."""
        limit = self.limits.max_prompt_chars
        if chars > limit:
            raise APIError(
                f"'{param}' holds {chars} characters of prompt text, more than this server accepts in one request "
                f"({limit}); no model context holds that much. Shorten the prompt, or raise the limit "
                f"({RequestLimits.flag('max_prompt_chars')}).", param=param, code="context_length_exceeded",
            )

    def check_prompt_ids(self, ids: list[int], param: str, *, context: bool = False) -> None:
        """Refuse an empty prompt, ids outside the vocabulary and (``context``) a prompt that fills the context."""
        if not ids:
            raise APIError(f"'{param}' is empty; send at least one token or character.", param=param)
        limit = self.max_model_len
        if context and limit is not None and len(ids) >= limit:  # before the per-token scan, which costs a pass
            raise APIError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {len(ids)} tokens. "
                "Shorten the prompt.", param=param, code="context_length_exceeded",
            )
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

    def check_max_n(self, n: int) -> None:
        """Refuse ``n`` over ``max_n`` at once, before the prompt is even parsed."""
        if n > self.limits.max_n:
            raise APIError(f"'n' = {n} is more choices than this server generates for one request (at most "
                           f"{self.limits.max_n}). Lower n, send several requests, or raise the limit "
                           f"({RequestLimits.flag('max_n')}).", param="n", code="request_too_large")

    def check_n(self, n: int, sequences: int) -> None:
        self.check_max_n(n)
        limit = self.batcher.max_queue_size
        if n * sequences > limit:
            raise APIError(f"This request asks for {n * sequences} sequences (n={n} per prompt), more than the server "
                           f"queues at once ({limit}); lower n or split the request.", param="n")

    def check_budget(self, n: int, prompt_lens: Sequence[int], max_tokens: Sequence[int]) -> None:
        """Refuse a request that would make the model process more than ``max_request_tokens`` tokens:
        ``n * (prompt + max_tokens)`` summed over its prompts (every choice runs its prompt and may run to
        ``max_tokens``), so no one request can hold the model for long."""
        need = n * (sum(prompt_lens) + sum(max_tokens))
        limit = self.limits.max_request_tokens
        if need > limit:
            raise APIError(
                f"This request may make the model process {need} tokens (n={n} x (prompt {sum(prompt_lens)} + "
                f"max_tokens {sum(max_tokens)})), more than this server's per-request budget of {limit} tokens. "
                f"Lower n or max_tokens (a chat request without max_tokens reserves the whole context), split the "
                f"request, or raise the budget ({RequestLimits.flag('max_request_tokens')}).",
                param="max_tokens", code="request_too_large",
            )

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
    def check_logit_bias(self, s: Sampling) -> None:
        """``logit_bias`` ids must be in the vocabulary (a 400 that names them, as vLLM's)."""
        if self.vocab_size is not None:
            bad = [t for t, _ in s.logit_bias if t >= self.vocab_size]
            if bad:
                raise APIError(f"'logit_bias' has token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}.",
                               param="logit_bias")

    async def _submit(self, prompts: list[list[int]], s: Sampling, max_tokens: list[int], top_logprobs: int,
                      seed: int | None, images: list[list[Any]] | None = None,
                      on_token: Callable[[int, int, float, Any], None] | None = None) -> list[Generation]:
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
                                     seed=seeds[i], top_logprobs=top_logprobs, top_k=s.top_k, min_p=s.min_p,
                                     repetition_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
                                     frequency_penalty=s.frequency_penalty, min_tokens=min(s.min_tokens, limit),
                                     stop_token_ids=s.stop_token_ids, logit_bias=s.logit_bias,
                                     constraint=s.constraint) for i in indices]
            hook = None
            if on_token is not None:
                def hook(j: int, token: int, logprob: float, top: Any, _indices: list[int] = indices) -> None:
                    on_token(_indices[j], token, logprob, top)
            calls.append((indices, self.batcher.submit([prompts[i] for i in indices], params,
                                                       [images[i] for i in indices] if images else None,
                                                       on_token=hook)))
        results = await asyncio.gather(*(c for _, c in calls))
        for (indices, _), gens in zip(calls, results):
            for i, gen in zip(indices, gens):
                out[i] = gen
        return [g for g in out if g is not None]

    async def generate(self, prompts: list[list[int]], s: Sampling, max_tokens: list[int],
                       top_logprobs: int = 0, images: list[list[Any]] | None = None,
                       on_token: Callable[[int, int, float, Any], None] | None = None) -> list[Output]:
        """``s.n`` independent samples per prompt (choice ``i * n + j`` is prompt i's sample j), post-processed.

        Each copy gets its own seed derived from the request's (independent samples), and the policy samples per
        row, so a seeded request reproduces all n whatever else runs in its batch. ``on_token(choice, token id,
        log-prob, top)`` is called on the event loop with each token as it is sampled (where the policy streams).
        """
        self.check_logit_bias(s)
        seqs = [p for p in prompts for _ in range(s.n)]
        limits = [m for m in max_tokens for _ in range(s.n)]
        seq_images = [i for i in images for _ in range(s.n)] if images else None
        gens = await self._submit(seqs, s, limits, top_logprobs, s.seed, seq_images, on_token)
        if s.ignore_eos:
            gens = await self._continue_past_eos(seqs, gens, s, limits, top_logprobs, seq_images, on_token)
        return [self.finish(g, s) for g in gens]

    async def stream(self, prompts: list[list[int]], s: Sampling, max_tokens: list[int], top_logprobs: int = 0,
                     images: list[list[Any]] | None = None) -> AsyncIterator[tuple[Any, ...]]:
        """:meth:`generate` as events: ``("token", choice, token id, log-prob, top)`` as each token is sampled, then
        ``("done", outputs)``. Closing the iterator early (the client left) cancels the generation, whose rows
        then leave the policy's batch at its next step."""
        queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        def on_token(choice: int, token: int, logprob: float, top: Any) -> None:
            queue.put_nowait(("token", choice, token, logprob, top))

        task = asyncio.ensure_future(self.generate(prompts, s, max_tokens, top_logprobs, images, on_token))
        task.add_done_callback(lambda _: queue.put_nowait(("end",)))
        try:
            while True:
                event = await queue.get()
                if event[0] == "end":
                    break
                yield event
            yield ("done", task.result())
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _ended_on_eos(self, gen: Generation, s: Sampling) -> bool:
        """Whether the row stopped on an end-of-turn token (not a stop string, stop token id or the length)."""
        ids = gen.token_ids or ()
        return (gen.finish_reason == "stop" and bool(ids) and self.apply_stop(gen.text, s.stop, True)[1] is None
                and not any(t in s.stop_token_ids for t in ids))

    async def _continue_past_eos(self, prompts: list[list[int]], gens: list[Generation], s: Sampling,
                                 limits: list[int], top_logprobs: int,
                                 images: list[list[Any]] | None = None,
                                 on_token: Callable[[int, int, float, Any], None] | None = None) -> list[Generation]:
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
            hook = None
            if on_token is not None:
                def hook(j: int, token: int, logprob: float, top: Any, _todo: list[int] = todo) -> None:
                    on_token(_todo[j], token, logprob, top)
            more = await self._submit([prompts[i] + m for i, m in zip(todo, made)],
                                      dataclasses.replace(s, min_tokens=0), [limits[i] - len(m) for i, m in zip(todo, made)],
                                      top_logprobs, seed, [images[i] for i in todo] if images else None, hook)
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

    def finish(self, gen: Generation, s: Sampling) -> Output:
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
        return Output(ids=ids, text=text, finish_reason=finish_reason, stop_reason=stop_reason, gen=gen,
                       text_ids=text_ids)

    def text_pieces(self, out: Output, skip_special: bool) -> list[str]:
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
    def usage(prompts: Sequence[Sequence[int]], outs: Sequence[Output]) -> dict[str, int]:
        """Prompt tokens count once per prompt (not per choice), as in OpenAI and vLLM."""
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(o.ids) for o in outs)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def completion_logprobs(self, out: Output, k: int, as_ids: bool) -> dict[str, list[Any]]:
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

    def chat_logprobs(self, out: Output, k: int | None, as_ids: bool) -> list[dict[str, Any]]:
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
