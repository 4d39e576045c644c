"""Advantage estimators: group-relative scores (GRPO, Dr.GRPO, RLOO) and discounted returns.

GRPO (Shao et al., 2024), Dr.GRPO (Liu et al., 2025) and RLOO (Ahmadian et al., 2024); returns for step-level
trainers. Choices where implementations differ: a singleton group gets advantage 0 (verl gives it the raw
score, but one sample says nothing about how it compares with its peers); void and over-turn members stay in
the group statistics unless ``exclude_from_group_stats`` is set, which callers express through ``stats_mask``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_choice, check_finite, check_mask, check_vector, group_index, group_moments

__all__ = ["broadcast_to_tokens", "discounted_returns", "group_advantages", "match_mean_abs", "shuffle_advantages"]

AdvantageMode = Literal["grpo", "mean_norm", "rloo"]
SingletonPolicy = Literal["zero", "raw"]


def group_advantages(
    scores: Tensor,
    group_ids: Sequence[Hashable] | Tensor,
    *,
    mode: AdvantageMode = "grpo",
    eps: float = 1e-6,
    singleton: SingletonPolicy = "zero",
    stats_mask: Tensor | None = None,
) -> Tensor:
    """Turn one scalar score per trajectory into a group-relative advantage.

    Comparing a trajectory only with its siblings (same prompt) removes the prompt's difficulty from
    the signal, which is what lets GRPO-style methods work without a value network.

    * ``"grpo"``: ``(s - mean) / (std + eps)`` with the **unbiased** std (``n - 1``), as in verl.
    * ``"mean_norm"`` (Dr.GRPO): ``s - mean``; no division, so low-variance groups are not amplified.
    * ``"rloo"`` (LOOP): ``s_j - mean(others)`` = ``n/(n-1) * (s_j - mean)``.

    Group statistics use only the members where ``stats_mask`` is true. Members left out of the
    statistics (e.g. SimpleTIR void or Mini-o3 over-turn trajectories under
    ``exclude_from_group_stats=True``) still get an advantage, measured against the counted members'
    mean/std; for ``"rloo"`` their baseline is the mean of all counted members, since all of them are
    "others". The default (``stats_mask=None``) counts everyone, which is what the reference code does.

    A group with fewer than 2 counted members has no usable statistics. With ``singleton="zero"``
    (the default) all its members get 0: one sample says nothing about what is better than
    average. ``singleton="raw"`` reproduces verl (mean 0, std 1): ``s / (1 + eps)`` for ``"grpo"``
    and ``s`` for the other modes. A group with *no* counted member always gets 0 (it is dropped by
    :func:`~agentgym.trainers.algorithms.masks.group_filter` anyway).

    Args:
        scores: ``[N]`` one scalar per trajectory (outcome reward or a G-RA total).
        group_ids: ``[N]`` hashable ids or a 1-D tensor; members need not be contiguous.
        mode: The estimator, see above.
        eps: Added to the std for ``"grpo"`` (1e-6 in every reference repo); must be >= 0.
        singleton: What groups with < 2 counted members get.
        stats_mask: ``[N]`` bool/0-1, which members count in their group's mean and std.

    Returns:
        ``[N]`` advantages in ``scores``' dtype (float32 for integer scores), detached: advantages
        are constants in the policy gradient. Statistics are computed in float64.

    Raises:
        ConfigError: (a ``ValueError``) on wrong shapes, unknown options, negative ``eps`` or
            non-finite scores.
    """
    check_vector("scores", scores)
    n = scores.shape[0]
    check_choice("mode", mode, ("grpo", "mean_norm", "rloo"))
    check_choice("singleton", singleton, ("zero", "raw"))
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ConfigError(f"eps must be a finite number >= 0 (verl uses 1e-6), got {eps!r}.")
    check_finite("scores", scores)
    inverse, num_groups = group_index(group_ids, n)
    if stats_mask is None:
        counted = torch.ones(n, dtype=torch.bool, device=scores.device)
    else:
        check_vector("stats_mask", stats_mask, n)
        counted = (stats_mask != 0).to(scores.device)
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    if n == 0:
        return torch.zeros(0, dtype=out_dtype, device=scores.device)

    s = scores.detach().to(torch.float64)
    inverse = inverse.to(scores.device)
    count, mean, std = group_moments(s, inverse, num_groups, counted)
    c, m = count[inverse], mean[inverse]
    if mode == "grpo":
        adv = (s - m) / (std[inverse] + eps)
    elif mode == "mean_norm":
        adv = s - m
    else:  # rloo: counted members leave themselves out of the baseline, excluded ones are not in it
        factor = torch.where(counted, c / (c - 1.0).clamp_min(1.0), torch.ones_like(c))
        adv = factor * (s - m)

    if singleton == "zero":
        fallback = torch.zeros_like(s)
    else:
        fallback = s / (1.0 + eps) if mode == "grpo" else s.clone()
        fallback = torch.where(c >= 1, fallback, torch.zeros_like(s))
    adv = torch.where(c >= 2, adv, fallback)
    return adv.to(out_dtype)


def broadcast_to_tokens(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Give every trainable token its trajectory's advantage, and 0 elsewhere.

    Outcome-level methods give every token of a trajectory that trajectory's advantage (GRPO, Shao et al.,
    2024); zeroing non-trainable positions keeps tool output and padding out of any later sum even before
    masking.

    Args:
        advantages: ``[N]`` per-trajectory advantages.
        loss_mask: ``[N, L]`` bool/0-1, 1 on tokens the policy sampled.

    Returns:
        ``[N, L]`` tensor in ``advantages``' dtype: ``advantages[:, None] * loss_mask``.

    Raises:
        ConfigError: when ``loss_mask`` is not ``[N, L]`` for the ``N`` advantages.
    """
    check_vector("advantages", advantages)
    if not isinstance(loss_mask, Tensor) or loss_mask.dim() != 2:
        raise ConfigError("loss_mask must be a 2-D [N, L] tensor (one row of token flags per trajectory).")
    check_mask("loss_mask", loss_mask, (advantages.shape[0], loss_mask.shape[1]))
    dtype = advantages.dtype if advantages.is_floating_point() else torch.get_default_dtype()
    return advantages.to(dtype)[:, None] * loss_mask.to(device=advantages.device, dtype=dtype)


def discounted_returns(rewards: Tensor, gamma: float, mask: Tensor | None = None) -> Tensor:
    """Returns-to-go ``G_t = sum_{k >= t} gamma^(k - t) r_k`` along the last axis.

    Step-level trainers (GiGPO step returns, the G-RA step variant, DigiRL Monte-Carlo returns)
    credit each turn with everything that follows it, discounted so that nearer rewards weigh more.

    Args:
        rewards: ``[T]`` for one trajectory or ``[N, T]`` for a right-padded batch, one reward per turn
            (a G-RA trajectory's ``per_step`` output, for example).
        gamma: Discount in ``[0, 1]``.
        mask: Same shape as ``rewards``, bool/0-1, 1 on real steps. Padding must sit at the end (or the
            start) of a row: rewards there are ignored and their returns are 0.

    Returns:
        Tensor of ``rewards``' shape and (floating) dtype; differentiable in ``rewards``.

    Raises:
        ConfigError: on a bad ``gamma`` or mismatched shapes.
    """
    if not isinstance(rewards, Tensor) or rewards.dim() not in (1, 2):
        raise ConfigError("rewards must be a [T] or [N, T] tensor of per-turn rewards.")
    if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
        raise ConfigError(f"gamma must be a number in [0, 1], got {gamma!r}.")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.to(dtype)
    m = None
    if mask is not None:
        check_mask("mask", mask, rewards.shape)
        m = mask.to(device=r.device, dtype=dtype)
        r = torch.where(m != 0, r * m, torch.zeros_like(r))
    steps = r.shape[-1]
    out: list[Tensor] = []
    running = torch.zeros_like(r[..., 0]) if steps else None
    for t in range(steps - 1, -1, -1):
        running = r[..., t] + gamma * running
        out.append(running)
    if not out:
        return r.clone()
    returns = torch.stack(out[::-1], dim=-1)
    if m is not None:
        returns = returns * (m != 0)
    return returns


def match_mean_abs(advantages: Tensor, reference: Tensor, mask: Tensor) -> tuple[Tensor, float]:
    """``advantages`` rescaled so that its mean ``|A|`` over the ``mask``-ed tokens equals ``reference``'s.

    Adam moves each weight by about the learning rate whatever the gradient's size, but the clipped policy loss
    and the balance between the advantage and the KL term see the advantage's scale: two methods compared at
    one learning rate with advantages of different size are compared at different effective step sizes. One
    scalar per batch keeps every sign and every ratio between tokens, so the method's credit is unchanged.

    Args:
        advantages: ``[N, L]`` per-token advantages to rescale.
        reference: ``[N, L]`` per-token advantages whose scale to match (e.g. GRPO's on the same batch).
        mask: ``[N, L]`` tokens that train (nonzero = counted).

    Returns:
        ``(rescaled, factor)``; ``factor`` is 1.0 (nothing rescaled) when either side has no signal on the mask.

    Raises:
        ConfigError: shapes differ.
    """
    if advantages.shape != reference.shape or advantages.shape != mask.shape:
        raise ConfigError(f"advantages {tuple(advantages.shape)}, reference {tuple(reference.shape)} and mask "
                          f"{tuple(mask.shape)} must have one shape ([N, L]: one value per token of the batch).")
    counted = mask.to(torch.bool)
    if not bool(counted.any()):
        return advantages, 1.0
    ours = float(advantages[counted].abs().double().mean())
    theirs = float(reference[counted].abs().double().mean())
    if ours == 0.0 or theirs == 0.0 or not (math.isfinite(ours) and math.isfinite(theirs)):
        return advantages, 1.0
    factor = theirs / ours
    return advantages * factor, factor


def shuffle_advantages(values: Tensor, trained: Tensor, generator: torch.Generator) -> Tensor:
    """The shuffled-advantage control: the ``trained`` units' advantages dealt out again in a random order.

    A method "learns" only if it beats an update of the same size and noise that carries no information about
    what worked. Permuting the advantages among the batch's units keeps every value, so the update's magnitude,
    spread and Adam's effective step are the method's own; only the pairing of each value with the episode (or
    step) that earned it is lost. Units that do not train (masked, errored) keep their value and lend none, so
    the control's trained tokens carry exactly the trained tokens' advantages.

    Args:
        values: ``[K]`` one advantage per unit (an episode for GRPO/ARPO, a step for GiGPO).
        trained: ``[K]`` bool/0-1, nonzero on units with at least one trained token.
        generator: the run's seeded generator, so a control run is reproducible.

    Returns:
        A new ``[K]`` tensor: a permutation of ``values`` among the trained units, the rest unchanged.

    Raises:
        ConfigError: ``values`` not 1-D or ``trained`` not of its shape.
    """
    check_vector("values", values)
    check_mask("trained", trained, tuple(values.shape))
    out = values.clone()
    units = torch.nonzero(trained.to(torch.bool).cpu(), as_tuple=False).flatten()
    order = torch.randperm(len(units), generator=generator)
    out[units] = values[units[order]]
    return out
