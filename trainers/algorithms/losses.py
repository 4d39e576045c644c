"""Per-token policy losses: PPO/DAPO clipped surrogate (with dual clip and LOOP's clip) and REINFORCE.

The clip-higher surrogate is DAPO's (Yu et al., 2025); the dual clip is verl's; LOOP's clip (Chen et al., 2025)
bounds the ratio to ``[1/(1+eps), 1+eps]``. The functions return per-token losses of shape ``[N, L]`` and leave
the reduction to :func:`~agentgym.trainers.algorithms.aggregation.aggregate_loss`, because the reduction
(token-mean, seq-mean, global denominators) is a separate, error-prone choice.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_choice, check_mask

__all__ = ["LOG_RATIO_CLAMP", "behaviour_weights", "clipped_policy_loss", "reinforce_loss"]

RatioClip = Literal["ppo", "loop"]

#: ``log pi_theta - log pi_old`` is clamped to this range before ``exp`` (verl does the same), so the
#: ratio never overflows to ``inf``; an ``inf`` ratio gives NaN gradients even when clipping discards it.
LOG_RATIO_CLAMP = 20.0


def _token_advantages(advantages: Tensor, shape: torch.Size) -> Tensor:
    if not isinstance(advantages, Tensor):
        raise ConfigError(f"advantages must be a torch.Tensor, got {type(advantages).__name__}.")
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        return advantages[:, None]
    if tuple(advantages.shape) == tuple(shape):
        return advantages
    raise ConfigError(
        f"advantages has shape {tuple(advantages.shape)}; pass [N] (one per trajectory) or [N, L] "
        f"(per token) matching logp's shape {tuple(shape)}."
    )


def _check_logps(logp: Tensor, other: Tensor, other_name: str) -> None:
    if not isinstance(logp, Tensor) or logp.dim() != 2:
        raise ConfigError("logp must be a 2-D [N, L] tensor of per-token log-probabilities.")
    if not isinstance(other, Tensor) or other.shape != logp.shape:
        got = tuple(other.shape) if isinstance(other, Tensor) else type(other).__name__
        raise ConfigError(f"{other_name} must have logp's shape {tuple(logp.shape)}, got {got}.")


def _masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    x = x.to(torch.float32)
    if mask is None:
        return x.mean() if x.numel() else x.sum()
    m = mask.to(torch.float32)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def _masked_max(x: Tensor, mask: Tensor | None) -> Tensor:
    kept = x if mask is None else x[mask]
    return kept.max().float() if kept.numel() else x.new_zeros((), dtype=torch.float32)


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
    ratio_clip: RatioClip = "ppo",
    loss_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped policy-gradient loss ``-min(rho A, clip(rho) A)`` (PPO, DAPO, LOOP).

    Clipping stops one update from moving a token's probability too far from the policy that sampled
    it; the asymmetric form (DAPO clip-higher, ``eps_high > eps_low``) leaves room for unlikely tokens
    to grow. With ``dual_clip_c = c`` (verl, applied only where ``A < 0``) the loss is additionally
    capped at ``-c A``, so a huge ratio on a bad token cannot produce an unbounded step.

    Clip ranges:

    * ``ratio_clip="ppo"``: ``rho`` in ``[1 - eps_low, 1 + eps_high]``.
    * ``ratio_clip="loop"`` (apple/ml-loop): ``rho`` in ``[1 / (1 + eps_low), 1 + eps_high]``; LOOP
      uses ``eps_low = eps_high = 0.1``, i.e. ``[0.909091, 1.1]``, and no dual clip.

    ``old_logp`` and ``advantages`` are detached: they are constants of the surrogate.
    The log-ratio is clamped to ``[-20, 20]`` before ``exp`` (:data:`LOG_RATIO_CLAMP`, as in verl).

    Args:
        logp: ``[N, L]`` log-probs of the sampled tokens under the current policy (requires grad).
        old_logp: ``[N, L]`` log-probs under the sampling (or snapshot) policy.
        advantages: ``[N]`` per trajectory or ``[N, L]`` per token.
        eps_low: Lower clip width (``>= 0``; ``< 1`` for ``"ppo"``).
        eps_high: Upper clip width (``>= 0``).
        dual_clip_c: Dual-clip constant ``c > 1`` (verl default 3.0), or ``None`` for plain clipping.
        ratio_clip: ``"ppo"`` or ``"loop"``, see above.
        loss_mask: Optional ``[N, L]`` bool/0-1. When given, masked positions use ratio 1 (so padding
            with ``-inf``/NaN log-probs cannot leak NaN into gradients) and the metrics are averaged over
            unmasked tokens only. It does **not** reduce the loss: pass the same mask to
            ``aggregate_loss``.

    Returns:
        ``(per_token_loss [N, L], metrics)``. ``metrics`` holds detached float32 scalars, averaged over
        (unmasked) tokens: ``clip_frac`` (the clipped term was chosen), ``clip_frac_high``
        (``rho > upper`` with ``A > 0``), ``clip_frac_low`` (``rho < lower`` with ``A < 0``),
        ``dual_clip_frac`` (the ``-c A`` cap was chosen), ``ratio_mean``, ``ratio_max`` and
        ``approx_kl`` (mean of ``old_logp - logp``).

    Raises:
        ConfigError: on mismatched shapes or invalid clip settings.
    """
    _check_logps(logp, old_logp, "old_logp")
    adv = _token_advantages(advantages, logp.shape).detach().to(device=logp.device, dtype=logp.dtype)
    check_choice("ratio_clip", ratio_clip, ("ppo", "loop"))
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}.")
    if ratio_clip == "ppo" and eps_low >= 1:
        raise ConfigError(f"eps_low={eps_low} makes the lower clip bound 1 - eps_low <= 0; use eps_low < 1.")
    if dual_clip_c is not None and not (isinstance(dual_clip_c, (int, float)) and dual_clip_c > 1):
        raise ConfigError(f"dual_clip_c must be > 1 (verl uses 3.0) or None to disable it, got {dual_clip_c!r}.")
    mask = None
    if loss_mask is not None:
        check_mask("loss_mask", loss_mask, logp.shape)
        mask = loss_mask.to(logp.device) != 0

    lower = 1.0 - eps_low if ratio_clip == "ppo" else 1.0 / (1.0 + eps_low)
    upper = 1.0 + eps_high
    log_ratio = logp - old_logp.detach().to(logp.dtype)
    if mask is not None:
        log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(lower, upper)
    loss = torch.maximum(pg_unclipped, pg_clipped)
    dual_active = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip_c is not None:
        cap = -adv * dual_clip_c
        dual_active = (adv < 0) & (cap < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)

    with torch.no_grad():
        clipped = pg_clipped > pg_unclipped
        metrics = {
            "clip_frac": _masked_mean(clipped, mask),
            "clip_frac_high": _masked_mean(clipped & (adv > 0) & (ratio > upper), mask),
            "clip_frac_low": _masked_mean(clipped & (adv < 0) & (ratio < lower), mask),
            "dual_clip_frac": _masked_mean(dual_active, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": _masked_max(ratio, mask),
            "approx_kl": _masked_mean(-log_ratio, mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def reinforce_loss(logp: Tensor, advantages: Tensor) -> Tensor:
    """Per-token REINFORCE loss ``-A * log pi_theta`` (no ratio, no clipping).

    Used by actors that train on their own fresh samples or on filtered demonstrations (ArCHer,
    DigiRL, filtered BC), where an importance ratio is either 1 or meaningless. ArCHer's
    "sum over the utterance, mean over the batch" is ``aggregate_loss(..., mode="seq-mean-token-sum")``.

    Args:
        logp: ``[N, L]`` log-probs of the sampled tokens (requires grad).
        advantages: ``[N]`` or ``[N, L]``; detached.

    Returns:
        ``[N, L]`` per-token loss.

    Raises:
        ConfigError: on mismatched shapes.
    """
    if not isinstance(logp, Tensor) or logp.dim() != 2:
        raise ConfigError("logp must be a 2-D [N, L] tensor of per-token log-probabilities.")
    adv = _token_advantages(advantages, logp.shape).detach().to(device=logp.device, dtype=logp.dtype)
    return -adv * logp


def behaviour_weights(proximal_logp: Tensor, behaviour_logp: Tensor, *, cap: float = 2.0,
                      mode: Literal["truncate", "mask"] = "truncate") -> Tensor:
    """Importance weights ``pi_prox / pi_behav`` per token, for samples drawn by older weights, bounded by ``cap``.

    Decoupled PPO (the asynchronous trainers' correction): the clipped ratio is taken against the *proximal*
    policy (the weights before this update, recomputed), and each token's loss is weighted by how much more
    likely the proximal policy makes the token than the behaviour policy that actually sampled it (the log-prob
    recorded at sampling). Multiplying a token's advantage by its (detached, non-negative) weight scales its
    clipped loss term by the same factor. ``cap`` keeps one stale token from dominating, in one of two ways:

    * ``truncate``: ``min(w, cap)`` (truncated importance sampling): every token still counts, at most ``cap``;
    * ``mask``: ``w`` where ``w <= cap``, else 0: a token the behaviour policy made far less likely than the
      proximal one leaves the loss (it still counts in the token denominator), the others keep their exact weight
      (AReaL's decoupled loss with its behaviour-weight cap).

    Raises:
        ConfigError: mismatched shapes, ``cap < 1`` or an unknown ``mode``.
    """
    _check_logps(proximal_logp, behaviour_logp, "behaviour_logp")
    if not cap >= 1:
        raise ConfigError(f"cap must be >= 1 (typical 2.0), got {cap}.")
    check_choice("mode", mode, ("truncate", "mask"))
    log_ratio = (proximal_logp.detach() - behaviour_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weights = torch.exp(log_ratio)
    if mode == "truncate":
        return weights.clamp(max=cap)
    return torch.where(weights <= cap, weights, torch.zeros_like(weights))
