"""ARPO's math (Dong et al., 2025, arXiv 2507.19849): segment entropy, the branch rule and advantage attribution.

The sampler that uses these lives in :mod:`agentgym.rollout.branching`; the trainer in :mod:`agentgym.trainers.arpo`.
The sampler's two functions (entropy, branch rule) are defined in the core module :mod:`agentgym.rollout.branch_rule`, so
the core does not depend on a trainer, and re-exported here beside the attribution they belong with.

* :func:`segment_entropy`: the reference code's entropy of a generated segment, a **sum** over its first
  ``window`` positions of the top-k truncated entropy, divided by ``ln |V|`` (it can exceed 1).
* :func:`branch_probability`: ``clip(alpha + beta * (H_now - H_init), 0, 1)``; the code's rule
  ``clip(u - beta * dH, 0, 1) <= tau`` with ``u ~ U(0, 1)`` has exactly this probability (``alpha = tau``).
* :func:`arpo_token_advantages`: "soft" attribution keeps each trajectory's own group advantage on all of
  its tokens (plain GRPO over the branched group, the default); "hard" gives a token shared by ``d``
  trajectories (identical token prefix up to and including it) the mean advantage of those ``d``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from agentgym.rollout.branch_rule import branch_probability, segment_entropy
from agentgym.errors import ConfigError

from ._common import check_choice, check_vector, group_index

__all__ = ["arpo_token_advantages", "branch_probability", "segment_entropy", "shared_prefix_lengths"]

Attribution = Literal["soft", "hard"]


def shared_prefix_lengths(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """``[n, n]`` lengths of the common token prefix of every pair (the diagonal is each length)."""
    arrays = [np.asarray(s, dtype=np.int64) for s in sequences]
    n = len(arrays)
    out = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        out[i, i] = len(arrays[i])
        for j in range(i + 1, n):
            m = min(len(arrays[i]), len(arrays[j]))
            diff = np.flatnonzero(arrays[i][:m] != arrays[j][:m])
            out[i, j] = out[j, i] = int(diff[0]) if len(diff) else m
    return out


def arpo_token_advantages(
    sequences: Sequence[Sequence[int]],
    advantages: Tensor,
    group_ids: Sequence[Hashable] | Tensor,
    *,
    mode: Attribution = "soft",
    dedupe: bool = False,
    width: int | None = None,
    counted: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token advantages ``[N, L]`` and per-token loss weights ``[N, L]`` for a branched batch.

    ``"soft"``: every token of trajectory ``j`` gets ``A_j`` (weights 1). Shared prefixes are then trained
    once per copy, which sums to ``d * mean(A)`` on a token shared by ``d`` copies at ratio 1.
    ``"hard"``: a token at position ``i`` of ``j`` gets the mean of ``A_k`` over the members ``k`` of ``j``'s
    group whose sequence equals ``j``'s up to and including position ``i`` (``j`` itself included), so a
    token only ``j`` has keeps ``A_j``. With ``dedupe`` each of those ``d`` copies gets weight ``1/d``: the
    shared token is trained once, not ``d`` times (soft mode's ``d``-fold weight gives early tokens a larger
    effective learning rate).

    Only **counted** members (``counted``, default: all) enter a shared token's mean and its ``d``: a sibling
    that crashed or was masked out of the loss carries an advantage measured against the healthy members, and
    letting it vote would move the healthy parent's prefix (a shared token's +0.707 would become 0.0). Members
    that are not counted leave the loss: their rows get advantage 0 and weight 0 in hard mode.

    Sharing is read from the token ids themselves, so it needs no tree bookkeeping and also covers
    independent samples that happened to produce identical tokens (same context, same token: the same
    gradient term).

    Args:
        sequences: Token ids of each trajectory's training sequence (prompt included).
        advantages: ``[N]`` group-normalised advantages (e.g. from ``group_advantages``), or ``[N, L]`` per-token
            ones (e.g. GiGPO's steps); hard mode averages the members' values at each shared position.
        group_ids: ``[N]`` group of each trajectory; sharing is only counted inside a group.
        mode: ``"soft"`` (default, the reference code) or ``"hard"``.
        dedupe: Hard mode only: weight shared tokens ``1/d`` per copy.
        width: Pad the outputs to this length (default: the longest sequence).
        counted: ``[N]`` bool/0-1, hard mode only: the members whose advantage may set shared tokens, normally
            the trainer's sample mask (healthy, not void, not over-turn). Ignored in soft mode, where each row
            keeps its own advantage and the trainer's loss mask already drops excluded rows.

    Returns:
        ``(token_advantages, token_weights)``, both float32 ``[N, width]``; zero past each sequence's end.

    Raises:
        ConfigError: Mismatched lengths, unknown mode, ``dedupe`` with soft mode.
    """
    if not isinstance(advantages, Tensor) or advantages.dim() not in (1, 2):
        raise ConfigError("advantages must be a [N] (per trajectory) or [N, L] (per token) torch.Tensor, got "
                          f"{type(advantages).__name__} {tuple(getattr(advantages, 'shape', ()))}.")
    check_choice("mode", mode, ("soft", "hard"))
    n = len(sequences)
    if advantages.shape[0] != n:
        raise ConfigError(f"advantages has {advantages.shape[0]} entries for {n} sequences; pass one per sequence.")
    if dedupe and mode == "soft":
        raise ConfigError("dedupe applies to hard attribution only; set mode='hard' or dedupe=False.")
    if counted is None:
        counts = np.ones(n, dtype=bool)
    else:
        check_vector("counted", counted, n)
        counts = (counted.detach().cpu() != 0).numpy()
    lengths = [len(s) for s in sequences]
    longest = max(lengths, default=0)
    width = longest if width is None else width
    if width < longest:
        raise ConfigError(f"width {width} is shorter than the longest sequence ({longest}).")
    token_adv = torch.zeros((n, width), dtype=torch.float32)
    weights = torch.zeros((n, width), dtype=torch.float32)
    adv = advantages.detach().double().cpu()
    adv = adv[:, None].expand(n, width) if adv.dim() == 1 else adv  # per token from here on
    if adv.shape[1] < longest:
        raise ConfigError(f"advantages has {adv.shape[1]} columns but the longest sequence has {longest} tokens.")
    if mode == "soft":
        for j, length in enumerate(lengths):
            token_adv[j, :length] = adv[j, :length].float()
            weights[j, :length] = 1.0
        return token_adv, weights
    inverse, num_groups = group_index(group_ids, n)
    for g in range(num_groups):
        members = [j for j in range(n) if int(inverse[j]) == g]
        lcp = shared_prefix_lengths([sequences[j] for j in members])
        a = adv[members].numpy()
        for row, j in enumerate(members):
            if not counts[j]:
                continue  # out of the loss: advantage 0, weight 0
            length = lengths[j]
            num = np.zeros(length, dtype=np.float64)
            den = np.zeros(length, dtype=np.float64)
            for col, k in enumerate(members):
                if not counts[k]:
                    continue
                shared = int(lcp[row, col])
                num[:shared] += a[col, :shared]
                den[:shared] += 1.0
            token_adv[j, :length] = torch.from_numpy(num / den)
            weights[j, :length] = torch.from_numpy(1.0 / den) if dedupe else 1.0
    return token_adv, weights
