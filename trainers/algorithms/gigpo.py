"""GiGPO's advantages (Feng et al., 2025, arXiv 2505.10978): an episode part per task group plus a step part per anchor-state group.

GRPO gives every step of an episode the same advantage. GiGPO adds a critic-free, step-level comparison: visits
to the *same environment state* (an "anchor", e.g. ``state_key()`` of the env, never the history) by different
trajectories of one task group form an anchor group, and each visit's discounted return-to-go is compared with the
group's mean. The final per-step advantage is ``A^E(tau_i) + omega * A^S(i, t)``.

Both comparisons reuse :func:`~agentgym.trainers.algorithms.advantages.group_advantages` (``"mean_norm"`` is
Dr.GRPO's ``s - mean``; ``"mean_std_norm"`` is GRPO's ``(s - mean) / (std + eps)``, unbiased std) and
:func:`~agentgym.trainers.algorithms.advantages.discounted_returns`. Everything here is pure: lists of per-step
values in, per-trajectory tensors out; the trainer broadcasts them to tokens with :func:`broadcast_steps_to_tokens`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_choice
from .advantages import discounted_returns, group_advantages

__all__ = ["GigpoAdvantages", "advantage_agreement", "anchor_groups", "broadcast_steps_to_tokens", "gigpo_advantages"]

GigpoMode = Literal["mean_norm", "mean_std_norm"]
EpisodeStats = Literal["trajectories", "all_steps"]
Singleton = Literal["zero", "raw"]


@dataclass(frozen=True)
class GigpoAdvantages:
    """What :func:`gigpo_advantages` returns; every list has one ``[T_i]`` float32 tensor per trajectory.

    Attributes:
        advantages: ``A^E + omega * A^S``, the value to put on every response token of step ``(i, t)``.
        episode: ``A^E`` per step (constant along a trajectory unless the invalid-action penalty hit a step).
        step: ``A^S`` per step (0 for a step whose anchor group is a singleton).
        step_returns: ``R_t`` after the invalid-action penalty.
        episode_scores: The episode return per step after the penalty (what ``A^E`` compares).
        anchor_ids: Per step, the index of its anchor group (unique across task groups).
        anchor_group_sizes: Size of each anchor group, indexed by ``anchor_ids``.
        stats: Scalars for logging, see :func:`gigpo_advantages`.
    """

    advantages: list[Tensor]
    episode: list[Tensor]
    step: list[Tensor]
    step_returns: list[Tensor]
    episode_scores: list[Tensor]
    anchor_ids: list[list[int]]
    anchor_group_sizes: list[int]
    stats: dict[str, float] = field(default_factory=dict)


def anchor_groups(keys: Sequence[Hashable], *, similarity_thresh: float | None = None) -> list[int]:
    """Cluster the anchor keys of one task group; returns a dense cluster index per key.

    Exact mode (``similarity_thresh=None``) groups equal keys. Similarity mode (verl-agent's search agent) puts a
    text key into the first existing cluster whose representative (its first member) has
    ``difflib.SequenceMatcher(rep, key).ratio() >= similarity_thresh``, else opens a new cluster. It is greedy and
    order-dependent, so callers pass keys in a fixed order (trajectory order, then step order).
    """
    ids: list[int] = []
    exact: dict[Hashable, int] = {}
    reps: list[str] = []
    for key in keys:
        try:
            hit = exact.get(key)
        except TypeError as exc:
            raise ConfigError(f"anchor keys must be hashable (use the env's state_key() string): {exc}") from exc
        if hit is None and similarity_thresh is not None:
            if not isinstance(key, str):
                raise ConfigError(
                    f"similarity grouping compares text; anchor key {key!r} is a {type(key).__name__}. "
                    "Pass str keys or set similarity_thresh=None for exact matching."
                )
            for index, rep in enumerate(reps):
                if difflib.SequenceMatcher(None, rep, key).ratio() >= similarity_thresh:
                    hit = index
                    break
        if hit is None:
            hit = len(reps)
            reps.append(key if isinstance(key, str) else "")
        exact[key] = hit
        ids.append(hit)
    return ids


def gigpo_advantages(
    group_ids: Sequence[Hashable],
    anchors: Sequence[Sequence[Hashable]],
    rewards: Sequence[Sequence[float]],
    valid: Sequence[Sequence[bool]] | None = None,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: GigpoMode = "mean_norm",
    episode_stats: EpisodeStats = "trajectories",
    invalid_penalty: float = 0.1,
    similarity_thresh: float | None = None,
    singleton: Singleton = "zero",
    eps: float = 1e-6,
) -> GigpoAdvantages:
    """Per-step GiGPO advantages for a batch of trajectories (Feng et al., 2025, arXiv 2505.10978).

    * Episode return ``R(tau_i) = sum_t r_t``; step return ``R_t = sum_{k>=t} gamma^(k-t) r_k``.
    * Invalid-action penalty, applied after discounting: a step whose action was invalid loses
      ``invalid_penalty`` from its own episode score and its own ``R_t`` (not from earlier steps).
    * ``A^E``: the episode scores compared within the task group. ``episode_stats="trajectories"`` (the paper,
      and the default) takes the mean/std over one score per trajectory (its first step's); ``"all_steps"`` (the
      reference code's ``compute_mean_std_cross_steps``) over every step sample, so long episodes weigh more.
    * ``A^S``: step returns compared within each anchor group of a task group (never across task groups). A
      singleton anchor group gets 0. Visits of one trajectory to the same state twice are two members.
    * ``mode``: ``"mean_norm"`` subtracts the mean; ``"mean_std_norm"`` also divides by ``std + eps``.
    * ``singleton``: a task group with one counted score gets ``A^E = 0`` (the default: a lone score has
      nothing to be compared with) or the raw score (``"raw"``, verl's mean 0, std 1). It does not affect
      ``A^S``, which is 0 for singletons either way.

    Args:
        group_ids: One task-group id per trajectory.
        anchors: Per trajectory, one anchor key per step (the env state without history).
        rewards: Per trajectory, one env reward per step.
        valid: Per trajectory, per step, whether the action parsed (default: all valid).
        gamma: Discount in ``[0, 1]`` (0.95 in the reference scripts).
        omega: Weight of the step part (``step_advantage_w``, 1.0).
        mode: ``"mean_norm"`` (reference default) or ``"mean_std_norm"`` (ALFWorld, search).
        episode_stats: ``"trajectories"`` or ``"all_steps"``, see above.
        invalid_penalty: Subtracted per invalid step (0.1; 0 disables it); must be >= 0.
        similarity_thresh: ``None`` for exact anchor matching, or a ratio in ``(0, 1]`` for text similarity.
        singleton: See above.
        eps: Added to the std in ``"mean_std_norm"``.

    Returns:
        :class:`GigpoAdvantages`. ``stats`` holds ``gigpo/anchor_groups`` (count), ``gigpo/anchor_group_size_mean``,
        ``gigpo/anchor_group_size_max``, ``gigpo/anchor_groups_nonsingleton``, ``gigpo/steps_in_shared_anchor``
        (fraction of steps whose anchor group has >= 2 members; 0 means GiGPO reduced to GRPO, usually because the
        anchor key holds history), ``gigpo/steps`` and ``gigpo/invalid_steps``.

    Raises:
        ConfigError: (a ``ValueError``) on mismatched lengths, bad options or non-finite rewards.
    """
    check_choice("mode", mode, ("mean_norm", "mean_std_norm"))
    check_choice("episode_stats", episode_stats, ("trajectories", "all_steps"))
    check_choice("singleton", singleton, ("zero", "raw"))
    if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
        raise ConfigError(f"gamma must be a number in [0, 1] (the reference scripts use 0.95), got {gamma!r}.")
    for name, value in (("omega", omega), ("invalid_penalty", invalid_penalty), ("eps", eps)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ConfigError(f"{name} must be a finite number, got {value!r}.")
    if invalid_penalty < 0 or eps < 0:
        raise ConfigError("invalid_penalty and eps must be >= 0 (a penalty is subtracted, so give it positive).")
    if similarity_thresh is not None and not (0.0 < similarity_thresh <= 1.0):
        raise ConfigError(f"similarity_thresh must be in (0, 1] or None for exact matching, got {similarity_thresh!r}.")
    if isinstance(group_ids, (str, bytes)):
        raise ConfigError("group_ids must be a sequence with one id per trajectory, not a single string.")
    gids, n = list(group_ids), len(anchors)
    if len(gids) != n or len(rewards) != n or (valid is not None and len(valid) != n):
        raise ConfigError(
            f"group_ids ({len(gids)}), anchors ({n}), rewards ({len(rewards)})"
            + (f" and valid ({len(valid)})" if valid is not None else "")
            + " must have one entry per trajectory."
        )
    lengths = [len(a) for a in anchors]
    for i in range(n):
        if len(rewards[i]) != lengths[i] or (valid is not None and len(valid[i]) != lengths[i]):
            raise ConfigError(
                f"trajectory {i} has {lengths[i]} anchor keys, {len(rewards[i])} rewards"
                + (f" and {len(valid[i])} validity flags" if valid is not None else "")
                + "; pass one of each per step."
            )

    # Per-trajectory returns and penalties (float64 throughout, float32 out).
    step_returns: list[Tensor] = []
    ep_scores: list[Tensor] = []
    invalid: list[Tensor] = []
    for i in range(n):
        r = torch.tensor([float(x) for x in rewards[i]], dtype=torch.float64)
        if not torch.isfinite(r).all():
            raise ConfigError(f"trajectory {i} has a non-finite reward {r.tolist()}; rewards must be finite.")
        bad = torch.tensor([not bool(v) for v in valid[i]] if valid is not None else [False] * lengths[i],
                           dtype=torch.bool)
        penalty = bad.to(torch.float64) * float(invalid_penalty)
        step_returns.append(discounted_returns(r, float(gamma)) - penalty)
        ep_scores.append(r.sum() - penalty)
        invalid.append(bad)

    # Flatten to one sample per (trajectory, step), in trajectory then step order.
    owner = [i for i in range(n) for _ in range(lengths[i])]
    flat_group = [gids[i] for i in owner]
    flat_score = torch.cat(ep_scores) if owner else torch.zeros(0, dtype=torch.float64)
    flat_return = torch.cat(step_returns) if owner else torch.zeros(0, dtype=torch.float64)
    first = torch.tensor([t == 0 for i in range(n) for t in range(lengths[i])], dtype=torch.bool)
    estimator = "grpo" if mode == "mean_std_norm" else "mean_norm"
    stats_mask = first if episode_stats == "trajectories" else None
    episode_adv = group_advantages(flat_score, flat_group, mode=estimator, eps=eps, singleton=singleton,
                                   stats_mask=stats_mask)

    # Anchor groups: clustered inside each task group, numbered globally.
    anchor_of = [0] * len(owner)
    sizes: list[int] = []
    positions_by_group: dict[Hashable, list[int]] = {}
    try:
        for pos, g in enumerate(flat_group):
            positions_by_group.setdefault(g, []).append(pos)
    except TypeError as exc:
        raise ConfigError(f"group_ids must be hashable (str, int, tuple): {exc}") from exc
    flat_keys = [key for i in range(n) for key in anchors[i]]
    for positions in positions_by_group.values():
        local = anchor_groups([flat_keys[p] for p in positions], similarity_thresh=similarity_thresh)
        offset = len(sizes)
        sizes.extend([0] * (max(local) + 1))
        for p, c in zip(positions, local):
            anchor_of[p] = offset + c
            sizes[offset + c] += 1
    step_adv = group_advantages(flat_return, anchor_of, mode=estimator, eps=eps, singleton="zero")

    total = episode_adv + float(omega) * step_adv
    splits = lengths

    def per_traj(x: Tensor) -> list[Tensor]:
        return [part.to(torch.float32) for part in torch.split(x, splits)] if n else []

    anchor_ids: list[list[int]] = []
    start = 0
    for length in lengths:
        anchor_ids.append(anchor_of[start:start + length])
        start += length
    steps = len(owner)
    shared = sum(s for s in sizes if s >= 2)
    stats = {
        "gigpo/steps": float(steps),
        "gigpo/invalid_steps": float(sum(int(b.sum()) for b in invalid)),
        "gigpo/anchor_groups": float(len(sizes)),
        "gigpo/anchor_groups_nonsingleton": float(sum(1 for s in sizes if s >= 2)),
        "gigpo/anchor_group_size_mean": float(steps / len(sizes)) if sizes else 0.0,
        "gigpo/anchor_group_size_max": float(max(sizes, default=0)),
        "gigpo/steps_in_shared_anchor": float(shared / steps) if steps else 0.0,
    }
    return GigpoAdvantages(
        advantages=per_traj(total), episode=per_traj(episode_adv), step=per_traj(step_adv),
        step_returns=per_traj(flat_return), episode_scores=per_traj(flat_score), anchor_ids=anchor_ids,
        anchor_group_sizes=sizes, stats=stats,
    )


def broadcast_steps_to_tokens(step_advantages: Sequence[Tensor], turn_index: Tensor) -> Tensor:
    """Per-token ``[N, L]`` advantages from per-step ones: token ``(i, l)`` gets step ``turn_index[i, l]``'s value.

    A multi-turn training row holds several steps (Layout A); each sampled token belongs to one of them.
    ``turn_index`` is ``-1`` on tokens that belong to no step (prompt, tool output, padding); they get 0.

    Raises:
        ConfigError: ``turn_index`` not ``[N, L]`` integer, or a step index past a trajectory's last step.
    """
    if not isinstance(turn_index, Tensor) or turn_index.dim() != 2 or turn_index.is_floating_point():
        raise ConfigError("turn_index must be an integer [N, L] tensor (step of each token, -1 for none).")
    if turn_index.shape[0] != len(step_advantages):
        raise ConfigError(
            f"turn_index has {turn_index.shape[0]} rows for {len(step_advantages)} trajectories; one row each."
        )
    out = torch.zeros(turn_index.shape, dtype=torch.float32)
    for i, adv in enumerate(step_advantages):
        idx = turn_index[i].long().cpu()
        used = idx >= 0
        if used.any():
            if int(idx.max()) >= adv.shape[0]:
                raise ConfigError(f"row {i} refers to step {int(idx.max())} but trajectory {i} has {adv.shape[0]}.")
            out[i, used] = adv.to(torch.float32)[idx[used]]
    return out


def _weighted_correlation(x: Tensor, y: Tensor, w: Tensor) -> float | None:
    """Pearson correlation of ``x`` and ``y`` with sample weights ``w``; ``None`` when either side is constant."""
    total = w.sum()
    if float(total) <= 0:
        return None
    mx, my = (w * x).sum() / total, (w * y).sum() / total
    cov = (w * (x - mx) * (y - my)).sum()
    vx, vy = (w * (x - mx) ** 2).sum(), (w * (y - my) ** 2).sum()
    if float(vx) <= 1e-18 or float(vy) <= 1e-18:
        return None
    return float(cov / torch.sqrt(vx * vy))


ZERO_CREDIT = 1e-9
"""Advantages smaller than this in magnitude count as zero in :func:`advantage_agreement` (normalised advantages
that carry credit are orders of magnitude larger)."""


def advantage_agreement(episode_level: Sequence[Tensor], gigpo: GigpoAdvantages,
                        tokens: Sequence[Sequence[int]]) -> dict[str, float | None]:
    """How far GiGPO's credit differs from an episode-level method's (GRPO's) on the same trajectories.

    Step credit can only separate the methods where it says something the episode credit does not: a detour
    inside a solved episode, a good move inside a failed one. When the two methods' per-token advantages
    correlate near 1 and their signs almost never differ, no training budget can tell them apart on that task,
    so a study that compares them should show these numbers before it trains.

    Args:
        episode_level: Per trajectory, the episode-level method's advantage per step (GRPO: one value repeated).
        gigpo: GiGPO's advantages of the same trajectories, in the same order.
        tokens: Per trajectory, per step, how many sampled tokens the step has (each token gets its step's value).

    Returns:
        ``token_correlation`` (token-weighted Pearson correlation of the two advantages),
        ``sign_disagreement`` (share of tokens whose advantages have opposite nonzero signs),
        ``zero_disagreement`` (share of tokens where exactly one of the two is 0: credit only one method gives),
        ``step_episode_correlation`` (token-weighted correlation of GiGPO's step part with its episode part),
        ``mean_abs_episode_level`` and ``mean_abs_gigpo`` (token-weighted mean ``|A|``: their scales), and
        ``tokens``. A correlation is ``None`` when one side is constant on the batch.

    Raises:
        ConfigError: the three inputs do not have one entry per trajectory and step.
    """
    n = len(gigpo.advantages)
    if len(episode_level) != n or len(tokens) != n:
        raise ConfigError(f"episode_level ({len(episode_level)}), gigpo ({n}) and tokens ({len(tokens)}) must have "
                          "one entry per trajectory, in the same order.")
    for i in range(n):
        steps = gigpo.advantages[i].shape[0]
        if episode_level[i].shape[0] != steps or len(tokens[i]) != steps:
            raise ConfigError(f"trajectory {i}: GiGPO has {steps} steps, the episode-level advantages "
                              f"{episode_level[i].shape[0]} and the token counts {len(tokens[i])}; one per step.")
    if n == 0 or sum(len(t) for t in tokens) == 0:
        return {"token_correlation": None, "sign_disagreement": None, "zero_disagreement": None,
                "step_episode_correlation": None, "mean_abs_episode_level": None, "mean_abs_gigpo": None,
                "tokens": 0.0}
    a = torch.cat([e.double() for e in episode_level])
    b = torch.cat([g.double() for g in gigpo.advantages])
    w = torch.tensor([float(c) for t in tokens for c in t], dtype=torch.float64)
    if bool((w < 0).any()):
        raise ConfigError("token counts must be >= 0.")
    total = float(w.sum())
    if total == 0:
        return advantage_agreement([], GigpoAdvantages([], [], [], [], [], [], []), [])
    # below ZERO_CREDIT an advantage is float rounding, not credit: a group's mean subtracted from equal values can
    # leave 1e-17, which would count as a sign and as credit that only one method gives
    sa = torch.where(a.abs() < ZERO_CREDIT, 0.0, torch.sign(a))
    sb = torch.where(b.abs() < ZERO_CREDIT, 0.0, torch.sign(b))
    return {
        "token_correlation": _weighted_correlation(a, b, w),
        "sign_disagreement": float(w[(sa * sb) < 0].sum()) / total,
        "zero_disagreement": float(w[(sa == 0) != (sb == 0)].sum()) / total,
        "step_episode_correlation": _weighted_correlation(torch.cat([s.double() for s in gigpo.step]),
                                                          torch.cat([e.double() for e in gigpo.episode]), w),
        "mean_abs_episode_level": float((w * a.abs()).sum()) / total,
        "mean_abs_gigpo": float((w * b.abs()).sum()) / total,
        "tokens": total,
    }
