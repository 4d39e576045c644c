"""Pure torch functions behind every trainer: advantages, policy losses, KL, aggregation, masks, G-RA.

No state, no I/O: each function takes tensors (shapes in its docstring) and returns tensors, and is
tested against worked examples computed by hand from each paper's equations (``tests/trainers/algorithms``).
Invalid inputs raise
:class:`agentgym.errors.ConfigError`, a ``ValueError`` whose message says how to fix the call.

Advantages (``advantages``)
    ``group_advantages``: GRPO / Dr.GRPO (``mean_norm``) / RLOO group-relative advantages, with
    singleton handling and a ``stats_mask`` for members excluded from the group statistics.
    ``broadcast_to_tokens``: per-trajectory advantage -> per-token ``[N, L]``.
    ``discounted_returns``: returns-to-go for step-level rewards.
    ``shuffle_advantages``: the shuffled-advantage control (the values permuted among trained units).
Policy losses (``losses``)
    ``clipped_policy_loss``: PPO/DAPO clip (asymmetric, dual clip, LOOP clip) with clip metrics.
    ``reinforce_loss``: ``-A log pi`` per token.
KL (``kl``)
    ``kl_penalty``: k1 or k3 (verl ``low_var_kl``, clamped to [-10, 10]).
Aggregation (``aggregation``)
    ``aggregate_loss``: token-mean, seq-mean-token-mean, seq-mean-token-sum(-norm) with exact global
    denominators for micro-batching and no NaN on fully masked sequences.
    ``loss_denominators``: the global token and sequence counts of a mini-batch.
    ``advantage_drift``: the net advantage a mode's weighting puts on the batch's tokens (length bias).
Masks and filters (``masks``)
    ``simpletir_turn_flags`` / ``is_void_turn_simpletir``: SimpleTIR's void-turn test.
    ``void_trajectory_mask``: trajectories with a void turn leave the loss.
    ``over_turn_mask``: Mini-o3 trajectories that ran out of budget mid-tool-use leave the loss.
    ``apply_sample_mask``: combine a per-trajectory mask with the token mask.
    ``group_filter``: DAPO/SimpleTIR/Mini-o3 dynamic sampling (std, accuracy range, min members).
GiGPO (``gigpo``)
    ``gigpo_advantages``: episode advantage per task group + omega * step advantage per anchor-state group,
    with the invalid-action penalty, optional similarity grouping and anchor-group statistics for logging.
    ``broadcast_steps_to_tokens``: per-step advantages -> per-token ``[N, L]`` via each token's step index.
ARPO (``arpo``)
    ``segment_entropy``: top-k truncated entropy of a segment's first K tokens over ln|V|.
    ``branch_probability``: ``clip(alpha + beta * dH, 0, 1)``.
    ``arpo_token_advantages``: soft / hard (optionally deduplicated) attribution over shared prefixes.
Rewards (``rewards``)
    ``gated_reward_accumulation`` (+ ``_batch``): G-RA prioritised gated channels.
    ``direct_reward_accumulation``: D-RA, the ungated control.
"""

from __future__ import annotations

from .arpo import arpo_token_advantages, branch_probability, segment_entropy, shared_prefix_lengths
from .advantages import broadcast_to_tokens, discounted_returns, group_advantages, shuffle_advantages
from .aggregation import AGGREGATION_MODES, advantage_drift, aggregate_loss, loss_denominators
from .gigpo import GigpoAdvantages, anchor_groups, broadcast_steps_to_tokens, gigpo_advantages
from .kl import kl_penalty
from .losses import behaviour_weights, clipped_policy_loss, reinforce_loss
from .masks import (
    apply_sample_mask,
    group_filter,
    is_void_turn_simpletir,
    over_turn_mask,
    simpletir_turn_flags,
    void_trajectory_mask,
)
from .rewards import direct_reward_accumulation, gated_reward_accumulation, gated_reward_accumulation_batch

__all__ = [
    "AGGREGATION_MODES",
    "GigpoAdvantages",
    "advantage_drift",
    "aggregate_loss",
    "anchor_groups",
    "apply_sample_mask",
    "arpo_token_advantages",
    "branch_probability",
    "broadcast_steps_to_tokens",
    "broadcast_to_tokens",
    "behaviour_weights",
    "clipped_policy_loss",
    "direct_reward_accumulation",
    "discounted_returns",
    "gated_reward_accumulation",
    "gated_reward_accumulation_batch",
    "gigpo_advantages",
    "group_advantages",
    "group_filter",
    "is_void_turn_simpletir",
    "kl_penalty",
    "loss_denominators",
    "over_turn_mask",
    "reinforce_loss",
    "segment_entropy",
    "shared_prefix_lengths",
    "shuffle_advantages",
    "simpletir_turn_flags",
    "void_trajectory_mask",
]
