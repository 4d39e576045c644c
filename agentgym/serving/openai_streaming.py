"""Live SSE streams of the OpenAI-compatible server: one chunk per token, sent as the policy samples it.

Why here and not at the end of the generation: a client that streams (a chat UI, an agent harness showing
progress, a time-to-first-token measurement) must see tokens while they are generated. Tokens arrive from
:meth:`~agentgym.serving.openai_generation.ServedModel.stream`; a token's chunk is sent when the next one arrives
(or at the end), so that the finished reply's rules decide what its own last token shows (an end-of-turn token is
not text). Text deltas are decoded from all ids so far and released only when they cannot change any more: never
half a character, never the start of a possible stop string (held back by the longest stop string's length
minus one), and with tools, nothing from ``<tool_call>`` on (the calls are sent whole once the reply is complete,
in one delta, as the non-streamed reply parses them). The finished reply then supplies whatever is left, so the
deltas always join to exactly the non-streamed text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentgym.serving.openai_protocol import SSE_DONE, APIError, Sampling, sse

if TYPE_CHECKING:
    from agentgym.serving.openai_generation import Output, ServedModel

__all__ = ["ChoiceText", "stream_chat", "stream_completions"]

_TOOL_OPEN = "<tool_call>"


#: Ids decoded before the new ones, so that the new ones decode as they do inside the whole reply (a sentencepiece
#: token's leading space, a character whose bytes span tokens).
_CONTEXT_IDS = 4


class ChoiceText:
    """The text of one choice so far, released in deltas that the final text is sure to start with."""

    def __init__(self, model: ServedModel, s: Sampling, tools: bool) -> None:
        self.model, self.s, self.tools = model, s, tools
        self.ids: list[int] = []
        self.emitted = ""
        self.hold = max((len(x) for x in s.stop), default=1) - 1
        #: ``ids[:_read]`` decoded; extended from a few ids of context per token (see :meth:`_decoded`).
        self._text = ""
        self._read = 0
        #: Tokenizer ``decode`` calls and the ids they were given (the cost per token stays bounded).
        self.decoded_ids = 0

    def _decode(self, ids: list[int]) -> str:
        self.decoded_ids += len(ids)
        return self.model.tokenizer.decode(ids, skip_special_tokens=self.s.skip_special_tokens)

    def _decoded(self, upto: int) -> str:
        """The text of ``ids[:upto]``, decoding only the new ids and a few before them.

        Why: decoding every id so far at each token costs O(length) per token, O(length^2) per reply, all of it on
        the event loop that every stream shares (2000-token replies: over 1 ms a token). As vLLM's incremental
        detokenizer does, the new ids are decoded after ``_CONTEXT_IDS`` ids of context, and the text they add is
        what that decoding has beyond the context's own. An unfinished character (U+FFFD at the end) waits for the
        next id; where the context's text is not a prefix of the longer one (a tokenizer whose decoding of earlier
        ids depends on later ones), everything is decoded again, so the text always equals the whole decoding.
        """
        if upto <= self._read:
            return self._text
        start = max(0, self._read - _CONTEXT_IDS)
        before = self._decode(self.ids[start:self._read]) if start < self._read else ""
        after = self._decode(self.ids[start:upto])
        if after.endswith("\ufffd"):
            return self._text + after[len(before):] if after.startswith(before) else self._decode(self.ids[:upto])
        if after.startswith(before):
            self._text += after[len(before):]
        else:
            self._text = self._decode(self.ids[:upto])
        self._read = upto
        return self._text

    def push(self, token: int) -> str:
        """Add a token; the delta its predecessors make safe to send (the newest token is not decoded yet)."""
        self.ids.append(token)
        text = self._decoded(len(self.ids) - 1)
        text, stop = self.model.apply_stop(text, self.s.stop, self.s.include_stop)
        if stop is None and self.hold:
            text = text[:max(0, len(text) - self.hold)]
        text = text.rstrip("\ufffd")
        if self.tools:
            cut = text.find(_TOOL_OPEN)
            text = text[:cut] if cut >= 0 else text[:max(0, len(text) - len(_TOOL_OPEN) + 1)]
            text = text.rstrip()
        if len(text) <= len(self.emitted) or not text.startswith(self.emitted):
            return ""
        delta, self.emitted = text[len(self.emitted):], text
        return delta

    def rest(self, final: str) -> str:
        """What the finished reply's text adds to what was sent (nothing when it does not extend it)."""
        return final[len(self.emitted):] if final.startswith(self.emitted) else ""


def _top_row(model: ServedModel, top: Any, as_ids: bool) -> dict[str, float]:
    row: dict[str, float] = {}
    if top is not None:
        for value, token in zip(*top):
            row.setdefault(model.token_text(token, as_ids), float(value))
    return row


def _chat_entry(model: ServedModel, token: int, logprob: float, top: Any, k: int | None, as_ids: bool) -> dict[str, Any]:
    text = model.token_text(token, as_ids)
    alts = [{"token": alt, "logprob": v, "bytes": list(alt.encode("utf-8"))}
            for alt, v in list(_top_row(model, top, as_ids).items())[:k or 0]]
    return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8")), "top_logprobs": alts}


def _error(exc: APIError) -> str:
    return sse({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})


async def _live_lines(events: AsyncIterator[Any], texts: list[Any], held: list[list[tuple[int, float, Any]]],
                      counts: list[int], outs: list[Output],
                      to_line: Callable[[int, str, int, float, Any], str | None]) -> AsyncIterator[str]:
    """The SSE lines of the tokens as they are sampled, each choice's newest token held back (it leaves with the
    choice's finish reason once the generation is done); the finished outputs are appended to ``outs``."""
    async for event in events:
        if event[0] == "done":
            outs.extend(event[1])
            return
        _, c, token, lp, top = event
        delta = texts[c].push(token)
        held[c].append((token, lp, top))
        if len(held[c]) > 1:
            line = to_line(c, delta, *held[c].pop(0))
            counts[c] += 1
            if line:
                yield line


async def stream_completions(model: ServedModel, prompts: list[list[int]], s: Sampling, max_tokens: list[int],
                             logprobs: int | None, rid: str, created: int) -> AsyncIterator[str]:
    """``/v1/completions`` with ``stream: true``: one chunk per token (its log-prob, its ids), the finish reason on
    each choice's last one, then usage when asked."""
    head = {"id": rid, "object": "text_completion", "created": created, "model": model.model_name}
    choices = len(prompts) * s.n
    texts = [ChoiceText(model, s, tools=False) for _ in range(choices)]
    held: list[list[tuple[int, float, Any]]] = [[] for _ in range(choices)]
    offsets = [0] * choices
    sent = 0
    prompt_tokens = sum(len(p) for p in prompts)

    def chunk(c: int, text: str, token: int | None, logprob: float | None, top: Any, index: int,
              out: Output | None = None) -> str | None:
        nonlocal sent
        choice: dict[str, Any] = {"index": c, "text": text, "logprobs": None,
                                  "finish_reason": out.finish_reason if out else None,
                                  "stop_reason": out.stop_reason if out else None}
        if logprobs is not None and token is not None:
            tok = model.token_text(token, s.tokens_as_ids)
            choice["logprobs"] = {"tokens": [tok], "token_logprobs": [logprob],
                                  "top_logprobs": [_top_row(model, top, s.tokens_as_ids)] if logprobs else None,
                                  "text_offset": [offsets[c]]}
            offsets[c] += 0 if s.tokens_as_ids else len(tok)
        if s.return_token_ids and token is not None:
            choice["token_ids"] = [token]
            if index == 0:
                choice["prompt_token_ids"] = list(prompts[c // s.n])
        sent += token is not None
        if not text and out is None and choice["logprobs"] is None and not s.return_token_ids:
            return None
        body: dict[str, Any] = {**head, "choices": [choice]}
        if s.include_usage and s.continuous_usage:
            body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                             "total_tokens": prompt_tokens + sent}
        return sse(body)

    counts = [0] * choices
    outs: list[Output] = []
    try:
        events = model.stream(prompts, s, max_tokens, top_logprobs=logprobs or 0)
        async for line in _live_lines(events, texts, held, counts, outs,
                                      lambda c, delta, token, lp, top: chunk(c, delta, token, lp, top, counts[c])):
            yield line
    except APIError as exc:
        yield _error(exc)
        yield SSE_DONE
        return
    for c, out in enumerate(outs):
        lp = out.gen.logprobs
        tops = out.gen.top_logprobs
        top_ids = out.gen.top_token_ids
        start = counts[c]
        if start == 0:  # nothing streamed (a policy without live tokens): per-token pieces of the final text
            pieces = model.text_pieces(out, s.skip_special_tokens) or [out.text]
        else:
            pieces = [texts[c].rest(out.text)] + [""] * max(0, len(out.ids) - start - 1)
        rest = out.ids[start:] or [None]
        for j, token in enumerate(rest):
            i = start + j
            top = None if tops is None or top_ids is None or token is None else (tops[i], top_ids[i])
            line = chunk(c, pieces[j] if j < len(pieces) else "", token,
                         None if lp is None or token is None else float(lp[i]), top, i,
                         out if j == len(rest) - 1 else None)
            if line:
                yield line
    if s.include_usage:
        yield sse({**head, "choices": [], "usage": model.usage(prompts, outs)})
    yield SSE_DONE


async def stream_chat(model: Any, prompt_ids: list[int], s: Sampling, max_tokens: int, top_logprobs: int | None,
                      want_logprobs: bool, with_tools: bool, rid: str, created: int,
                      images: Sequence[Any] | None = None) -> AsyncIterator[str]:
    """``/v1/chat/completions`` with ``stream: true``: the role first, a content delta per token as it is sampled,
    tool calls (whole, one delta) once the reply is complete, the finish reason, then usage when asked.
    ``model`` is the endpoints object (it parses tool calls)."""
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model.model_name}
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
        return sse(body)

    # The role comes first, at once, as with vLLM (the client sees the request accepted).
    for c in range(s.n):
        if c == 0 and s.return_token_ids:
            yield sse({**head, "prompt_token_ids": prompt_ids, "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}]})
        else:
            yield chunk(c, {"role": "assistant", "content": ""})
    texts = [ChoiceText(model, s, tools=with_tools) for _ in range(s.n)]
    held: list[list[tuple[int, float, Any]]] = [[] for _ in range(s.n)]
    counts = [0] * s.n
    outs: list[Output] = []

    def token_chunk(c: int, text: str, token: int, lp: float, top: Any) -> str | None:
        nonlocal sent
        sent += 1
        entries = [_chat_entry(model, token, lp, top, top_logprobs, s.tokens_as_ids)] if want_logprobs else None
        if not text and entries is None and not s.return_token_ids:
            return None
        return chunk(c, {"content": text}, logprobs={"content": entries} if entries is not None else None,
                     token_ids=[token] if s.return_token_ids else None)

    try:
        events = model.stream([prompt_ids], s, [max_tokens], top_logprobs=top_logprobs or 0,
                              images=[list(images)] if images else None)
        async for line in _live_lines(events, texts, held, counts, outs, token_chunk):
            yield line
    except APIError as exc:
        yield _error(exc)
        yield SSE_DONE
        return
    for c, out in enumerate(outs):
        content, calls = model.tool_calls(out.text) if with_tools else (out.text, [])
        start = counts[c]
        lps = out.gen.logprobs
        tops, top_ids = out.gen.top_logprobs, out.gen.top_token_ids

        def top_at(i: int) -> Any:
            return None if tops is None or top_ids is None else (tops[i], top_ids[i])

        rest_ids = out.ids[start:]
        if calls:
            # The calls are known only once the text is complete: what is left of the content outside them in one
            # delta, the parsed calls in the next (what OpenAI's stream accumulators expect).
            sent += len(rest_ids)
            entries = [_chat_entry(model, t, float(lps[start + j]) if lps is not None else 0.0, top_at(start + j),
                                   top_logprobs, s.tokens_as_ids) for j, t in enumerate(rest_ids)] \
                if want_logprobs else None
            token_ids = rest_ids if s.return_token_ids else None
            left = texts[c].rest(content or "")
            if left:
                yield chunk(c, {"content": left}, token_ids=token_ids,
                            logprobs={"content": entries} if entries is not None else None)
                entries, token_ids = None, None
            deltas = [{"index": j, "id": call["id"], "type": "function", "function": call["function"]}
                      for j, call in enumerate(calls)]
            yield chunk(c, {"tool_calls": deltas}, token_ids=token_ids,
                        logprobs={"content": entries} if entries is not None else None)
            yield chunk(c, {}, finish="tool_calls", stop_reason=out.stop_reason)
            continue
        if start == 0:
            pieces = model.text_pieces(out, s.skip_special_tokens)
        else:
            pieces = [texts[c].rest(out.text)] + [""] * max(0, len(rest_ids) - 1)
        for j, token in enumerate(rest_ids):
            i = start + j
            line = token_chunk(c, pieces[j] if j < len(pieces) else "", token,
                               float(lps[i]) if lps is not None else 0.0, top_at(i))
            if line:
                yield line
        if not rest_ids and texts[c].rest(out.text):
            yield chunk(c, {"content": texts[c].rest(out.text)})
        yield chunk(c, {}, finish=out.finish_reason, stop_reason=out.stop_reason)
    if s.include_usage:
        yield sse({**head, "choices": [], "usage": model.usage([prompt_ids], outs)})
    yield SSE_DONE
