"""Loss aggregation: reduce an ``[N, L]`` per-token loss to the scalar that is back-propagated.

How the per-token losses are averaged changes the effective weight of long and short replies, and is the
detail implementations most often get subtly wrong. Two rules:

* **Exact global denominators.** With micro-batching, compute the denominators of the whole
  mini-batch once (:func:`loss_denominators`) and pass them to every micro-batch call; the sum of the
  micro-batch losses then equals the full mini-batch loss exactly (verl's per-micro-batch rescaling is
  only approximate).
* **Never NaN.** A fully masked sequence (SimpleTIR void, Mini-o3 over-turn) contributes nothing to
  the numerator and, by default, is not counted as a sequence either. An all-masked batch gives 0
  with a defined (zero) gradient. Masked positions may even hold NaN/inf losses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_choice, check_mask

__all__ = ["AGGREGATION_MODES", "advantage_drift", "aggregate_loss", "loss_denominators"]

AggregationMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
NormalizeBy = Literal["unmasked", "all"]
AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _check_2d(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ConfigError(f"{name} must be a 2-D [N, L] tensor (one row per sequence).")


def _check_count(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0 (compute it with loss_denominators), got {value!r}.")


def loss_denominators(loss_mask: Tensor, *, normalize_by: NormalizeBy = "unmasked") -> tuple[float, float]:
    """The exact denominators of a whole mini-batch, to pass to every micro-batch's ``aggregate_loss``.

    Args:
        loss_mask: ``[N, L]`` bool/0-1 mask of the **whole** mini-batch (after sample masks).
        normalize_by: ``"unmasked"`` counts only sequences with at least one trainable token (the
            default); ``"all"`` counts every row, masked ones included, which reproduces Mini-o3's released code
            (Lai et al., 2025, arXiv 2509.07969: over-turn responses are masked but still count in the per-sample
            normaliser). Do not add padding rows when using ``"all"``.

    Returns:
        ``(global_token_count, global_seq_count)`` as Python floats.

    Raises:
        ConfigError: on a non-2-D mask or an unknown ``normalize_by``.
    """
    _check_2d("loss_mask", loss_mask)
    check_choice("normalize_by", normalize_by, ("unmasked", "all"))
    weights = torch.where(loss_mask != 0, loss_mask.to(torch.float64), torch.zeros((), dtype=torch.float64))
    tokens = float(weights.sum())
    seqs = float(loss_mask.shape[0]) if normalize_by == "all" else float((loss_mask != 0).any(-1).sum())
    return tokens, seqs


def aggregate_loss(
    per_token_loss: Tensor,
    loss_mask: Tensor,
    *,
    mode: AggregationMode,
    global_token_count: float | None = None,
    global_seq_count: float | None = None,
    max_len_norm: int | None = None,
    normalize_by: NormalizeBy = "unmasked",
) -> Tensor:
    """Reduce a masked per-token loss to a scalar.

    With ``m`` the mask, ``l`` the loss, ``S`` the sequence count and ``T`` the token count:

    * ``"token-mean"`` (DAPO; default of ARPO, SimpleTIR, Mini-o3, GiGPO): ``sum m*l / T``. Long
      sequences weigh more, every token counts equally.
    * ``"seq-mean-token-mean"`` (original GRPO, LOOP): ``sum_j (sum_i m*l / sum_i m) / S``. Every
      sequence weighs the same regardless of length.
    * ``"seq-mean-token-sum"``: ``sum m*l / S``. REINFORCE over an utterance (ArCHer, DigiRL).
    * ``"seq-mean-token-sum-norm"`` (Dr.GRPO): ``sum m*l / (S * max_len_norm)``: a constant length
      normaliser, so length gives no per-token bias. (verl's variant divides by the padded width only:
      ``max_len_norm=L, global_seq_count=1``.)

    Denominators: ``T`` is ``global_token_count`` when given, else the local mask sum. ``S`` is
    ``global_seq_count`` when given, else the local number of sequences with any trainable token
    (``normalize_by="unmasked"``), or all rows (``normalize_by="all"``: Mini-o3's code, where masked
    trajectories still count; with LOOP's constant mini-batch size pass ``global_seq_count=32``).
    Denominators that a mode does not use are ignored, so callers can always pass both counts from
    :func:`loss_denominators`.

    Worked example (hand-computed from Mini-o3's over-turn masking, Lai et al., 2025): per-sample losses
    ``[-1.5, 0.5, masked, 0.5]`` give ``-0.166667`` with ``normalize_by="unmasked"`` and ``-0.125`` with
    ``normalize_by="all"``.

    Args:
        per_token_loss: ``[N, L]`` loss per token (from ``clipped_policy_loss``, ``kl_penalty``, ...).
        loss_mask: ``[N, L]`` bool/0-1 (non-binary values act as weights), 1 on trainable tokens.
        mode: One of :data:`AGGREGATION_MODES`.
        global_token_count: Token count of the whole mini-batch (for micro-batching).
        global_seq_count: Sequence count of the whole mini-batch (for micro-batching).
        max_len_norm: The constant length for ``"seq-mean-token-sum-norm"`` (required there).
        normalize_by: How the local sequence count is taken when ``global_seq_count`` is None; only
            meaningful for the ``seq-mean-*`` modes.

    Returns:
        A 0-dim tensor in ``per_token_loss``' dtype; finite whenever the unmasked losses are finite,
        and 0 (still attached to the graph) when everything is masked.

    Raises:
        ConfigError: on mismatched shapes, unknown options, a missing ``max_len_norm``, negative
            counts, a zero global count while this micro-batch has trainable tokens, or
            ``normalize_by="all"`` with ``"token-mean"`` (it would have no effect there).
    """
    _check_2d("per_token_loss", per_token_loss)
    check_mask("loss_mask", loss_mask, per_token_loss.shape)
    check_choice("mode", mode, AGGREGATION_MODES)
    check_choice("normalize_by", normalize_by, ("unmasked", "all"))
    _check_count("global_token_count", global_token_count)
    _check_count("global_seq_count", global_seq_count)
    if mode == "seq-mean-token-sum-norm" and not (isinstance(max_len_norm, int) and max_len_norm > 0):
        raise ConfigError(
            f"mode='seq-mean-token-sum-norm' needs max_len_norm, a positive int (the constant generation "
            f"budget, e.g. max_response_length), got {max_len_norm!r}."
        )
    if mode == "token-mean" and normalize_by == "all":
        raise ConfigError(
            "normalize_by='all' has no effect under mode='token-mean' (masked sequences have no tokens). "
            "For Mini-o3's per-sample normalisation use mode='seq-mean-token-mean', normalize_by='all'."
        )

    loss = per_token_loss
    keep = loss_mask.to(loss.device) != 0
    weights = torch.where(keep, loss_mask.to(device=loss.device, dtype=loss.dtype), torch.zeros_like(loss))
    zero = torch.zeros_like(loss)
    weighted = torch.where(keep, loss * weights, zero)  # where, not *, so NaN/inf padding stays out
    nonempty = keep.any(dim=-1)

    if mode == "token-mean":
        numerator = weighted.sum()
        denominator = _denominator(global_token_count, weights.sum(), keep)
    else:
        if mode == "seq-mean-token-mean":
            tokens = weights.sum(dim=-1)
            safe = torch.where(nonempty, tokens, torch.ones_like(tokens))
            per_seq = torch.where(nonempty, weighted.sum(dim=-1) / safe, torch.zeros_like(tokens))
            numerator = per_seq.sum()
        else:
            numerator = weighted.sum()
        if normalize_by == "all":
            local_seqs = torch.tensor(float(loss.shape[0]), dtype=loss.dtype, device=loss.device)
        else:
            local_seqs = nonempty.sum().to(loss.dtype)
        denominator = _denominator(global_seq_count, local_seqs, keep)
        if mode == "seq-mean-token-sum-norm":
            denominator = denominator * float(max_len_norm)  # type: ignore[arg-type]
    return numerator / denominator


def _denominator(global_count: float | None, local: Tensor, keep: Tensor) -> Tensor:
    """The divisor, never 0: an empty selection has a 0 numerator, so dividing it by 1 gives 0."""
    if global_count is not None:
        if global_count == 0:
            if bool(keep.any()):
                raise ConfigError(
                    "a global count of 0 was passed but this micro-batch has trainable tokens; compute the "
                    "counts with loss_denominators() over the whole mini-batch."
                )
            return torch.ones((), dtype=local.dtype, device=local.device)
        return torch.tensor(float(global_count), dtype=local.dtype, device=local.device)
    return torch.where(local > 0, local, torch.ones_like(local))


def advantage_drift(step_advantages: Sequence[Tensor], tokens: Sequence[Sequence[int]], *,
                    mode: AggregationMode) -> float | None:
    """The advantage the loss gives its average sampled token: ``sum_t w_t A_t / sum_t w_t``, with ``w_t`` the
    weight ``mode`` gives token ``t``.

    Why it matters: group-relative advantages are zero-mean over a group's *trajectories*, but the loss weighs
    *tokens*. Where failed episodes run on to a turn or context limit, they hold more tokens than solved ones, and
    under ``token-mean`` the batch's tokens carry a net negative advantage: besides what the signal says, every
    update lowers the log-probability of everything the policy sampled, first of the tokens all its actions share
    (the call syntax, an action's format), which no group's credit asked for. ``seq-mean-token-mean`` weighs each
    trajectory once, so its drift is the trajectories' mean advantage (0 for full groups). The other modes weigh
    every token alike, as ``token-mean`` does (up to a constant factor), and drift as it does.

    Args:
        step_advantages: Per trajectory, its advantage per step (an episode-level method repeats one value).
        tokens: Per trajectory, per step, how many sampled tokens the step trains (each gets its step's value).
        mode: One of :data:`AGGREGATION_MODES`.

    Returns:
        The drift, or ``None`` when no trajectory has a sampled token. Compare it with the mean ``|A|`` of the same
        weighting: a drift of a third of it moves the policy a third as far as the credit does.

    Raises:
        ConfigError: an unknown mode, mismatched lengths, or a negative token count.
    """
    check_choice("mode", mode, AGGREGATION_MODES)
    if len(step_advantages) != len(tokens):
        raise ConfigError(f"step_advantages ({len(step_advantages)}) and tokens ({len(tokens)}) must have one entry "
                          "per trajectory, in the same order.")
    numerator = denominator = 0.0
    for i, (advantages, counts) in enumerate(zip(step_advantages, tokens)):
        if advantages.shape[0] != len(counts):
            raise ConfigError(f"trajectory {i}: {advantages.shape[0]} step advantages but {len(counts)} token counts; "
                              "one per step.")
        if any(c < 0 for c in counts):
            raise ConfigError(f"trajectory {i}: token counts must be >= 0, got {list(counts)}.")
        n = float(sum(counts))
        if n == 0:
            continue  # a fully masked trajectory: no mode trains any of its tokens
        weighted = float((advantages.double() * torch.tensor([float(c) for c in counts], dtype=torch.float64)).sum())
        if mode == "seq-mean-token-mean":
            numerator, denominator = numerator + weighted / n, denominator + 1.0
        else:
            numerator, denominator = numerator + weighted, denominator + n
    return numerator / denominator if denominator else None
