"""The logits processing clients ask for beyond temperature and top-p, applied to a whole batch at once.

Why one module: the continuous sampler and the reference loop of :class:`~agentgym.policies.hf.HFPolicy` must
sample the same distribution for the same request, and an OpenAI-compatible client expects vLLM's meaning of each
field. The order and the formulas are vLLM's (its v1 sampler):

1. ``min_tokens``: while a row has sampled fewer tokens, its end-of-turn ids and ``stop_token_ids`` get -inf.
2. ``logit_bias``: added to the raw logits (``{token id: bias}``).
3. Penalties, on the raw logits: ``repetition_penalty`` (CTRL, Keskar et al. 2019, as vLLM does it) on every token
   of the prompt *and* the output: a positive logit is divided by it, a negative one multiplied;
   ``frequency_penalty`` subtracts ``penalty * count`` and ``presence_penalty`` subtracts ``penalty`` once for each
   token the *output* holds (OpenAI's definition; prompt tokens do not count).
4. Greedy rows take the argmax here (a penalty or bias changes a greedy reply, as in vLLM).
5. Temperature, then ``min_p`` (tokens whose probability is below ``min_p`` times the most likely one's are
   removed), then ``top_k`` (ties with the k-th value kept), then top-p (the sampler's own).

Everything is a few tensor ops over ``[rows, vocab]``; state that costs a ``[rows, vocab]`` tensor (token counts,
bias, extra stop ids) is allocated only once a row uses it.

The log-probs and entropies a policy *records* are not those of the processed distribution: they stay the model's
own distribution at the row's temperature, the one a trainer recomputes from the weights (it cannot know the
penalties a client asked for). vLLM's default (``logprobs_mode="raw_logprobs"``) likewise returns log-probs before
any processing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.policy import SamplingParams

__all__ = ["SamplingRules", "uses_rules"]


def uses_rules(p: SamplingParams) -> bool:
    """Whether ``p`` asks for any processing this module does (else the row costs nothing here)."""
    return bool(p.top_k > 0 or p.min_p > 0 or p.repetition_penalty != 1 or p.presence_penalty
                or p.frequency_penalty or p.min_tokens or p.stop_token_ids or p.logit_bias)


class SamplingRules:
    """Per-row processing state of a batch of ``rows`` rows (slots of the continuous sampler, or rows of one
    reference batch), indexed by row.

    Args:
        rows: How many rows the state holds.
        vocab: Width of the logits.
        end_ids: The policy's end-of-turn ids (masked under ``min_tokens`` like ``stop_token_ids``).
        device: Where the tensors live.
    """

    def __init__(self, rows: int, vocab: int, end_ids: Sequence[int], device: Any) -> None:
        import torch

        self.torch = torch
        self.rows, self.vocab, self.device = rows, vocab, device
        self.end_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        ends = [i for i in end_ids if 0 <= i < vocab]
        if ends:
            self.end_mask[torch.tensor(ends, dtype=torch.long, device=device)] = True
        self.top_k = torch.zeros(rows, dtype=torch.long, device=device)
        self.min_p = torch.zeros(rows, dtype=torch.float32, device=device)
        self.repetition = torch.ones(rows, dtype=torch.float32, device=device)
        self.presence = torch.zeros(rows, dtype=torch.float32, device=device)
        self.frequency = torch.zeros(rows, dtype=torch.float32, device=device)
        self.min_tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.counts: Any = None  # [rows, vocab] float: how often each token was sampled (output only)
        self.seen: Any = None  # [rows, vocab] bool: token in the prompt or the output (repetition penalty)
        self.bias: Any = None  # [rows, vocab] float: logit_bias
        self.stops: Any = None  # [rows, vocab] bool: the row's stop_token_ids
        self.active: set[int] = set()  # rows with any rule (none: the step skips this module entirely)

    def _lazy(self, name: str, dtype: Any) -> Any:
        if getattr(self, name) is None:
            setattr(self, name, self.torch.zeros((self.rows, self.vocab), dtype=dtype, device=self.device))
        return getattr(self, name)

    def set_rows(self, rows: Sequence[int], params: Sequence[SamplingParams], prompts: Sequence[Sequence[int]]) -> None:
        """Start these rows with their requests' rules (clears what the rows held before)."""
        torch = self.torch
        for row, p, prompt in zip(rows, params, prompts):
            if not uses_rules(p):
                self.clear(row)
                continue
            self.active.add(row)
            self.top_k[row] = max(p.top_k, 0)
            self.min_p[row] = p.min_p
            self.repetition[row] = p.repetition_penalty
            self.presence[row] = p.presence_penalty
            self.frequency[row] = p.frequency_penalty
            self.min_tokens[row] = p.min_tokens
            if p.presence_penalty or p.frequency_penalty or self.counts is not None:
                self._lazy("counts", torch.float32)[row] = 0
            if p.repetition_penalty != 1 or self.seen is not None:
                seen = self._lazy("seen", torch.bool)
                seen[row] = False
                if p.repetition_penalty != 1:
                    ids = [t for t in prompt if 0 <= t < self.vocab]
                    if ids:
                        seen[row, torch.tensor(ids, dtype=torch.long, device=self.device)] = True
            if p.logit_bias or self.bias is not None:
                bias = self._lazy("bias", torch.float32)
                bias[row] = 0
                for token, value in p.logit_bias:
                    if 0 <= token < self.vocab:
                        bias[row, token] = value
            if p.stop_token_ids or self.stops is not None:
                stops = self._lazy("stops", torch.bool)
                stops[row] = False
                ids = [t for t in p.stop_token_ids if 0 <= t < self.vocab]
                if ids:
                    stops[row, torch.tensor(ids, dtype=torch.long, device=self.device)] = True

    def clear(self, row: int) -> None:
        """The row no longer uses any rule (its state is reset when a request with rules takes it)."""
        if row in self.active:
            self.active.discard(row)
            self.top_k[row], self.min_p[row], self.repetition[row] = 0, 0.0, 1.0
            self.presence[row], self.frequency[row], self.min_tokens[row] = 0.0, 0.0, 0
            for name in ("counts", "seen", "bias", "stops"):
                table = getattr(self, name)
                if table is not None:
                    table[row] = 0

    def any(self, rows: Sequence[int] | None = None) -> bool:
        return bool(self.active) if rows is None else any(r in self.active for r in rows)

    def process(self, rows: Any, logits: Any, steps: Any) -> Any:
        """Steps 1-3 (min_tokens, logit_bias, penalties) on the rows' raw logits; ``steps``: tokens each row
        sampled so far. Returns new logits (the input is not changed)."""
        torch = self.torch
        logits = logits.clone()
        under = steps < self.min_tokens[rows]
        if bool(under.any()):
            ends = self.end_mask[None, :]
            if self.stops is not None:
                ends = ends | self.stops[rows]
            logits.masked_fill_(under[:, None] & ends, float("-inf"))
        if self.bias is not None:
            logits += self.bias[rows]
        if self.seen is not None:
            penalty = torch.where(self.seen[rows], self.repetition[rows][:, None], torch.ones_like(logits))
            logits = torch.where(logits > 0, logits / penalty, logits * penalty)
        if self.counts is not None:
            counts = self.counts[rows]
            logits -= self.frequency[rows][:, None] * counts + self.presence[rows][:, None] * (counts > 0)
        return logits

    def truncate(self, rows: Any, scaled: Any) -> Any:
        """Step 5 before top-p: ``min_p`` then ``top_k`` on temperature-scaled logits (removed tokens get -inf)."""
        torch = self.torch
        min_p = self.min_p[rows]
        if bool((min_p > 0).any()):
            probs = torch.softmax(scaled, dim=-1)
            floor = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            scaled = scaled.masked_fill(probs < floor, float("-inf"))
        top_k = self.top_k[rows].clamp(max=scaled.shape[-1])
        if bool((top_k > 0).any()):
            kmax = int(top_k.max())
            values = scaled.topk(kmax, dim=-1).values
            kth = values.gather(-1, (top_k.clamp(min=1) - 1)[:, None])
            scaled = scaled.masked_fill((scaled < kth) & (top_k > 0)[:, None], float("-inf"))
        return scaled

    def stopped(self, rows: Any, token: Any) -> Any:
        """Rows whose new token is one of their ``stop_token_ids`` (``None`` when no row has any)."""
        if self.stops is None:
            return None
        return self.stops[rows].gather(-1, token[:, None]).squeeze(-1)

    def may_stop(self, rows: Any, steps: Any) -> Any:
        """Rows that have sampled at least ``min_tokens`` (``steps`` counts the newest token): before that no stop
        string ends a row either, as in vLLM."""
        return steps >= self.min_tokens[rows]

    def record(self, rows: Any, token: Any) -> None:
        """Count the rows' new tokens (frequency, presence and repetition penalties of the next steps)."""
        if self.counts is not None:
            self.counts[rows, token] += 1
        if self.seen is not None:
            self.seen[rows, token] = True
