"""ARPO's branch rule (Dong et al., 2025): how uncertain a generated segment was, and the chance to branch after it.

Pure functions the branching sampler (:mod:`agentgym.rollout.branching`) calls on every turn after a tool result. They
live in the core, not among the trainers' algorithms, because sampling must not depend on a trainer;
:mod:`agentgym.trainers.algorithms.arpo` re-exports them beside ARPO's advantage attribution.

* :func:`segment_entropy`: the reference code's entropy of a generated segment, a **sum** over its first
  ``window`` positions of the top-k truncated entropy, divided by ``ln |V|`` (it can exceed 1).
* :func:`branch_probability`: ``clip(alpha + beta * (H_now - H_init), 0, 1)``; the code's rule
  ``clip(u - beta * dH, 0, 1) <= tau`` with ``u ~ U(0, 1)`` has exactly this probability (``alpha = tau``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agentgym.errors import ConfigError

__all__ = ["branch_probability", "segment_entropy"]


def segment_entropy(top_logprobs: Sequence[Sequence[float]], *, window: int = 20, vocab_size: int) -> float:
    """Normalised entropy of a segment from its per-position candidate log-probs.

    ``H = -sum_{p < K} sum_c exp(l_pc) * l_pc`` over the candidates each position returned (the top k, plus
    the sampled token when it is not among them), with ``K = min(window, len(segment))``, then
    ``H / ln(vocab_size)``. Worked by hand: probabilities ``(.5, .25, .25)`` and ``(1.0)`` with ``|V| = 8`` give 0.5.

    Args:
        top_logprobs: One sequence of candidate log-probs per generated position.
        window: ``K``, how many leading positions count (20 in the reference code).
        vocab_size: ``|V|``, the tokenizer's vocabulary size (>= 2).

    Raises:
        ConfigError: ``window < 1``, ``vocab_size < 2`` or a log-prob that is NaN or positive.
    """
    if window < 1:
        raise ConfigError(f"window must be >= 1 (the reference code uses 20), got {window}.")
    if vocab_size < 2:
        raise ConfigError(f"vocab_size must be >= 2 to normalise by ln|V|, got {vocab_size}.")
    total = 0.0
    for position in list(top_logprobs)[:window]:
        for lp in position:
            lp = float(lp)
            if math.isnan(lp) or lp > 1e-6:
                raise ConfigError(f"log-probs must be <= 0 and not NaN, got {lp}.")
            if lp > -math.inf:
                total -= math.exp(lp) * lp
    return total / math.log(vocab_size)


def branch_probability(h_now: float, h_init: float, *, alpha: float, beta: float) -> float:
    """``clip(alpha + beta * (h_now - h_init), 0, 1)``: the chance of one branch attempt succeeding.

    Worked by hand: ``h_init = 0.3, h_now = 0.5, alpha = 0.5, beta = 0.2`` gives 0.54. Callers branch when a
    uniform draw ``u`` satisfies ``u < p``, so ``p = 0`` never branches and ``p = 1`` always does.
    """
    for name, value in (("h_now", h_now), ("h_init", h_init), ("alpha", alpha), ("beta", beta)):
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be finite, got {value}.")
    return min(1.0, max(0.0, alpha + beta * (h_now - h_init)))
