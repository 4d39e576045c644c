"""G-RA (gated reward accumulation) and its ungated control D-RA (Sun et al., 2025, arXiv 2508.10548).

Dense step rewards are easy to farm; G-RA counts a lower-priority channel only when every
higher-priority channel meets its threshold, so step rewards refine behaviour among trajectories that
already achieve the real objective and can never pay for failing it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_choice, check_finite

__all__ = ["direct_reward_accumulation", "gated_reward_accumulation", "gated_reward_accumulation_batch"]

GateComparison = Literal[">=", ">"]


def _meets(value: float | Tensor, threshold: float, cmp: str) -> bool | Tensor:
    return value >= threshold if cmp == ">=" else value > threshold


def _check_thresholds(thresholds: Sequence[float] | None, num_channels: int, cmp: str) -> list[float]:
    check_choice("cmp", cmp, (">=", ">"))
    if num_channels == 0:
        raise ConfigError("pass at least one reward channel (the outcome reward first).")
    if thresholds is None:
        return [-math.inf] * max(num_channels - 1, 0)
    values = list(thresholds)
    if len(values) not in (num_channels - 1, num_channels):
        raise ConfigError(
            f"{num_channels} channels need {num_channels - 1} thresholds (one per channel that gates the ones "
            f"below it; the last channel gates nothing), got {len(values)}."
        )
    for v in values:
        if not isinstance(v, (int, float)) or math.isnan(v):
            raise ConfigError(f"thresholds must be numbers, got {v!r}.")
    return [float(v) for v in values[: num_channels - 1]]


def _accumulate_one(
    channels: Sequence[Tensor | float], thresholds: Sequence[float] | None, cmp: str, num_steps: int | None
) -> tuple[float, Tensor]:
    gates = _check_thresholds(thresholds, len(channels), cmp)
    lengths = set()
    dtype = torch.get_default_dtype()
    for k, ch in enumerate(channels):
        if isinstance(ch, Tensor):
            if ch.dim() > 1:
                raise ConfigError(f"channel {k} has shape {tuple(ch.shape)}; pass [T] per-step values or a scalar.")
            check_finite(f"channel {k}", ch)
            if ch.dim() == 1:
                lengths.add(ch.shape[0])
                dtype = ch.dtype if ch.is_floating_point() else dtype
        elif isinstance(ch, (int, float)):
            if not math.isfinite(ch):
                raise ConfigError(f"channel {k} is {ch!r}; rewards must be finite.")
        else:
            raise ConfigError(f"channel {k} must be a [T] tensor or a number, got {type(ch).__name__}.")
    if num_steps is not None:
        lengths.add(num_steps)
    if len(lengths) > 1:
        raise ConfigError(f"per-step channels (and num_steps) disagree on the number of turns: {sorted(lengths)}.")
    steps = lengths.pop() if lengths else 1
    if steps < 1:
        raise ConfigError("a trajectory needs at least one turn to place rewards on; got 0 turns.")

    total = 0.0
    per_step = torch.zeros(steps, dtype=dtype)
    gate_open = True
    for k, ch in enumerate(channels):
        if isinstance(ch, Tensor) and ch.dim() == 1:
            values = ch.detach().to(dtype=dtype, device=per_step.device)
            channel_total = float(ch.detach().double().sum())
        else:  # a terminal scalar sits on the last turn
            channel_total = float(ch)
            values = torch.zeros(steps, dtype=dtype)
            values[-1] = channel_total
        if gate_open:
            total += channel_total
            per_step = per_step + values
        if k < len(channels) - 1:
            gate_open = gate_open and bool(_meets(channel_total, gates[k], cmp))
    return total, per_step


def gated_reward_accumulation(
    channels: Sequence[Tensor | float],
    thresholds: Sequence[float],
    *,
    cmp: GateComparison = ">=",
    num_steps: int | None = None,
) -> tuple[float, Tensor]:
    """G-RA return of one trajectory: ``R = sum_k gate_k * R_k`` with ``gate_k = prod_{j<k} [R_j cmp Delta_j]``.

    Follows G-RA (Sun et al., 2025, arXiv 2508.10548): channels are ordered by priority (index 0 highest, usually the
    outcome reward); a channel's trajectory value ``R_k`` is the sum of its per-step values; channel
    ``k`` counts only if every higher channel met its threshold. The last channel never gates.

    Example (hand-computed from G-RA's gate, ``Delta = 0.5``): ``channels=[0.5, tensor([0.05, -0.05, 0.05])]``,
    ``thresholds=[0.5]`` gives ``total = 0.55`` and ``per_step = [0.05, -0.05, 0.55]`` (returns-to-go
    with ``gamma = 1``: ``[0.55, 0.50, 0.55]``); with outcome 0.0 the step rewards are dropped.

    Args:
        channels: ``K`` channels, highest priority first. Each is a ``[T]`` tensor of per-step values
            or a number (a terminal reward, placed on the last step).
        thresholds: ``K - 1`` thresholds (``thresholds[k]`` is channel ``k``'s gate for the channels
            after it). ``K`` values are accepted too; the last one is unused.
        cmp: ``">="`` (the paper's "meets the threshold", default) or ``">"``.
        num_steps: ``T`` when every channel is a scalar (default 1); must agree with tensor channels.

    Returns:
        ``(total, per_step)``: the scalar score for outcome-level trainers (GRPO, RLOO) and the ``[T]``
        gated per-step rewards for step-level trainers (feed them to ``discounted_returns``).
        ``total == per_step.sum()`` up to float rounding. Computed at episode end, since the gate
        depends on the outcome.

    Raises:
        ConfigError: on a wrong number of thresholds, mismatched lengths, non-finite rewards or an
            unknown ``cmp``.
    """
    return _accumulate_one(channels, thresholds, cmp, num_steps)


def direct_reward_accumulation(
    channels: Sequence[Tensor | float], *, num_steps: int | None = None
) -> tuple[float, Tensor]:
    """D-RA, the ungated control: every channel always counts (``R = r_high + sum_t r_low_t``).

    Kept for comparison runs; it is the baseline that collapses by farming step rewards (Sun et al., 2025).
    Same arguments and returns as :func:`gated_reward_accumulation`, without thresholds.
    """
    return _accumulate_one(channels, None, ">=", num_steps)


def gated_reward_accumulation_batch(
    channels: Sequence[Tensor],
    thresholds: Sequence[float],
    *,
    cmp: GateComparison = ">=",
    step_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """G-RA for ``N`` trajectories at once (vectorised :func:`gated_reward_accumulation`).

    For D-RA over a batch pass ``thresholds=[float("-inf")] * (K - 1)``.

    Args:
        channels: ``K`` channels, highest priority first. Each is ``[N]`` (terminal values, placed on
            each trajectory's last valid step) or ``[N, T]`` (per-step values, right-padded).
        thresholds: ``K - 1`` (or ``K``) thresholds, as in :func:`gated_reward_accumulation`.
        cmp: ``">="`` or ``">"``.
        step_mask: ``[N, T]`` bool/0-1, 1 on real turns (right padding 0). Padded values are ignored.
            Default: every step is real (``T = 1`` when all channels are ``[N]``).

    Returns:
        ``(totals [N], per_step [N, T])``; padded steps hold 0.

    Raises:
        ConfigError: on mismatched shapes, a trajectory with no valid step, non-finite rewards, or a
            wrong number of thresholds.
    """
    gates = _check_thresholds(thresholds, len(channels), cmp)
    if not isinstance(channels[0], Tensor) or channels[0].dim() not in (1, 2):
        raise ConfigError("channel 0 must be an [N] or [N, T] tensor.")
    n = int(channels[0].shape[0])
    steps: int | None = None if step_mask is None else int(step_mask.shape[-1])
    dtype = torch.get_default_dtype()
    for k, ch in enumerate(channels):
        if not isinstance(ch, Tensor) or ch.dim() not in (1, 2):
            raise ConfigError(f"channel {k} must be an [N] or [N, T] tensor.")
        check_finite(f"channel {k}", ch)
        if ch.shape[0] != n:
            raise ConfigError(f"channel {k} has {ch.shape[0]} trajectories, channel 0 has {n}.")
        if ch.dim() == 2:
            if steps is not None and ch.shape[1] != steps:
                raise ConfigError(f"channel {k} has {ch.shape[1]} steps, expected {steps} (step_mask/other channels).")
            steps = ch.shape[1]
        if ch.is_floating_point():
            dtype = ch.dtype
    steps = 1 if steps is None else steps
    device = channels[0].device
    if step_mask is None:
        valid = torch.ones(n, steps, dtype=torch.bool, device=device)
    else:
        if not isinstance(step_mask, Tensor) or tuple(step_mask.shape) != (n, steps):
            raise ConfigError(f"step_mask must have shape {(n, steps)}.")
        valid = step_mask.to(device) != 0
    if steps == 0 or not bool(valid.any(dim=-1).all()):
        raise ConfigError("every trajectory needs at least one valid step to place its rewards on.")
    positions = torch.arange(steps, device=device).expand(n, steps)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=-1).values
    last_onehot = positions == last[:, None]

    totals = torch.zeros(n, dtype=dtype, device=device)
    per_step = torch.zeros(n, steps, dtype=dtype, device=device)
    gate_open = torch.ones(n, dtype=torch.bool, device=device)
    for k, ch in enumerate(channels):
        ch = ch.detach().to(device=device, dtype=dtype)
        if ch.dim() == 1:
            values = torch.where(last_onehot, ch[:, None], torch.zeros_like(per_step))
        else:
            values = torch.where(valid, ch, torch.zeros_like(ch))
        channel_total = values.sum(dim=-1)
        totals = totals + torch.where(gate_open, channel_total, torch.zeros_like(channel_total))
        per_step = per_step + torch.where(gate_open[:, None], values, torch.zeros_like(values))
        if k < len(channels) - 1:
            gate_open = gate_open & _meets(channel_total, gates[k], cmp)
    return totals, per_step
