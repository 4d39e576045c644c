"""Shared input checks and group bookkeeping for the algorithm functions.

Every public function validates its inputs here, so that a wrong shape or a misspelled option fails
early with a message that says how to fix it, instead of broadcasting silently into a wrong loss.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence

import torch
from torch import Tensor

from agentgym.errors import ConfigError, did_you_mean

__all__ = [
    "check_choice",
    "check_finite",
    "check_mask",
    "check_vector",
    "group_index",
    "group_moments",
]


def check_choice(name: str, value: str, choices: Collection[str]) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ConfigError(
            f"{name}={value!r} is not supported; use one of {sorted(choices)}.{did_you_mean(str(value), choices)}"
        )


def check_vector(name: str, x: Tensor, n: int | None = None) -> None:
    """Require a 1-D tensor (of length ``n`` when given)."""
    if not isinstance(x, Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {type(x).__name__}; wrap it with torch.as_tensor(...).")
    if x.dim() != 1:
        raise ConfigError(f"{name} must be 1-D with one entry per trajectory, got shape {tuple(x.shape)}.")
    if n is not None and x.shape[0] != n:
        raise ConfigError(f"{name} has {x.shape[0]} entries but there are {n} trajectories; pass one per trajectory.")


def check_mask(name: str, mask: Tensor, shape: torch.Size | tuple[int, ...]) -> None:
    """Require a mask tensor of exactly ``shape`` (bool or numeric, 0 = masked)."""
    if not isinstance(mask, Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {type(mask).__name__}.")
    if tuple(mask.shape) != tuple(shape):
        raise ConfigError(
            f"{name} has shape {tuple(mask.shape)} but {tuple(shape)} was expected; "
            "build the mask with the same [N, L] layout as the per-token tensors."
        )


def check_finite(name: str, x: Tensor) -> None:
    """Refuse NaN or infinite values, which would poison every member of a group."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ConfigError(f"{name} contains NaN or infinite values; fix the reward/score computation upstream.")


def group_index(group_ids: Sequence[Hashable] | Tensor, n: int) -> tuple[Tensor, int]:
    """Map arbitrary group ids to dense indices.

    Args:
        group_ids: ``[N]`` ids (any hashable values, or a 1-D tensor). Members of a group need not be
            contiguous, so batches that were shuffled or filtered still group correctly.
        n: The number of trajectories ``N`` the ids must cover.

    Returns:
        ``(inverse, num_groups)``: ``inverse`` is a ``LongTensor[N]`` with values in ``[0, num_groups)``.

    Raises:
        ConfigError: wrong length, a bare string, or unhashable ids.
    """
    if isinstance(group_ids, Tensor):
        check_vector("group_ids", group_ids, n)
        uniques, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(torch.long), int(uniques.numel())
    if isinstance(group_ids, (str, bytes)):
        raise ConfigError("group_ids must be a sequence with one id per trajectory, not a single string.")
    ids = list(group_ids)
    if len(ids) != n:
        raise ConfigError(
            f"group_ids has {len(ids)} entries but there are {n} trajectories; pass one id per trajectory."
        )
    table: dict[Hashable, int] = {}
    try:
        codes = [table.setdefault(g, len(table)) for g in ids]
    except TypeError as exc:
        raise ConfigError(f"group_ids must be hashable (str, int, tuple): {exc}") from exc
    return torch.tensor(codes, dtype=torch.long), len(table)


def group_moments(
    scores: Tensor, inverse: Tensor, num_groups: int, counted: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group count, mean and unbiased std over the counted members, in float64.

    Args:
        scores: ``[N]`` float64 scores.
        inverse: ``[N]`` dense group index from :func:`group_index`.
        num_groups: ``G``.
        counted: ``[N]`` bool, members that enter the statistics.

    Returns:
        ``(count[G], mean[G], std[G])``. ``mean`` is 0 where ``count == 0``; ``std`` is NaN where
        ``count < 2`` (undefined), so callers must handle small groups explicitly.
    """
    inverse = inverse.to(scores.device)
    w = counted.to(device=scores.device, dtype=torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, inverse, w)
    total = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, inverse, scores * w)
    mean = total / count.clamp_min(1.0)
    dev = (scores - mean[inverse]) * w
    sq = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, inverse, dev * dev)
    var = sq / (count - 1.0).clamp_min(1.0)
    std = torch.where(count >= 2, var.sqrt(), torch.full_like(var, float("nan")))
    return count, mean, std
