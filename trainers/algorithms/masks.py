"""Trajectory-level masks and group filters: SimpleTIR void turns, Mini-o3 over-turns, dynamic sampling.

SimpleTIR (Xue et al., 2025, arXiv 2509.02479) masks void turns, Mini-o3 (Lai et al., 2025, arXiv 2509.07969)
over-turn trajectories, and DAPO-style dynamic sampling drops uninformative groups. Void and over-turn
trajectories are removed from the *loss* (their sample mask is 0) but stay in the group statistics, as in both
reference implementations, so a masked failure still lowers its siblings' baseline, unless the caller passes a ``stats_mask`` to ``group_advantages``. All masks here are
``bool`` tensors where ``True`` means "this trajectory trains" (0 = masked).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Hashable, Sequence

import torch
from torch import Tensor

from agentgym.errors import ConfigError, did_you_mean
from agentgym.trajectory import BUDGET_END_REASONS, END_REASONS, TURN_KINDS

from ._common import check_finite, check_vector, group_index, group_moments

__all__ = [
    "SIMPLETIR_ANSWER_MARKER",
    "SIMPLETIR_CODE_RE",
    "apply_sample_mask",
    "group_filter",
    "is_void_turn_simpletir",
    "over_turn_mask",
    "simpletir_turn_flags",
    "void_trajectory_mask",
]

#: SimpleTIR's code detector [CODE]: a newline right after the opening fence and right before the
#: closing fence are both required; the optional tag is case-sensitive ``py``/``python``.
SIMPLETIR_CODE_RE = re.compile(r"```(?:py|python)?\n(.*?)\n```", re.DOTALL)
#: SimpleTIR's final-answer detector: the literal substring ``\boxed{`` (correctness is not checked).
SIMPLETIR_ANSWER_MARKER = "\\boxed{"


def simpletir_turn_flags(text: str) -> tuple[bool, bool, bool]:
    """Classify one assistant turn exactly as SimpleTIR's code does (Xue et al., 2025, arXiv 2509.02479).

    A turn that is neither runnable code nor a final answer is "void": such turns follow
    out-of-distribution interpreter output and carry the destabilising gradients SimpleTIR removes.

    Args:
        text: The turn's raw text.

    Returns:
        ``(has_code, has_answer, is_void)`` with ``is_void = not has_code and not has_answer``. An
        unclosed fence or an empty block (one newline only) is not code; a turn with both code and
        ``\\boxed{`` is an answer whose code still runs.

    Raises:
        ConfigError: if ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise ConfigError(f"text must be a str (the turn's raw text), got {type(text).__name__}.")
    has_code = SIMPLETIR_CODE_RE.search(text) is not None
    has_answer = SIMPLETIR_ANSWER_MARKER in text
    return has_code, has_answer, not has_code and not has_answer


def is_void_turn_simpletir(text: str) -> bool:
    """``True`` when SimpleTIR would call this turn void (no code block and no ``\\boxed{``)."""
    return simpletir_turn_flags(text)[2]


def _check_kinds(name: str, kinds: Collection[str], allowed: Collection[str]) -> None:
    for kind in kinds:
        if kind not in allowed:
            raise ConfigError(
                f"{name} contains {kind!r}, which is not one of {list(allowed)}.{did_you_mean(str(kind), allowed)}"
            )


def void_trajectory_mask(
    turn_kinds: Sequence[Sequence[str]], *, void_kinds: Collection[str] = ("void",)
) -> Tensor:
    """SimpleTIR's trajectory mask: 0 for any trajectory that contains a void turn.

    One bad turn masks the whole trajectory, because every later token was generated after it.

    Args:
        turn_kinds: ``N`` trajectories, each a sequence of turn kinds (``info["turn"]["kind"]``:
            ``"tool_call" | "answer" | "void" | "invalid"``).
        void_kinds: Which kinds count as void. Default ``("void",)``: a turn with no tool call and no
            answer. Add ``"invalid"`` to also mask turns whose tool call could not be parsed (closer
            to SimpleTIR, where an unclosed code fence makes the turn void).

    Returns:
        ``bool[N]``, ``False`` where the trajectory has a void turn.

    Raises:
        ConfigError: on an unknown turn kind, or a bare string instead of a list of kinds.
    """
    _check_kinds("void_kinds", void_kinds, TURN_KINDS)
    void = set(void_kinds)
    keep: list[bool] = []
    for j, kinds in enumerate(turn_kinds):
        if isinstance(kinds, str):
            raise ConfigError(f"turn_kinds[{j}] is a string; pass a list of turn kinds per trajectory.")
        _check_kinds(f"turn_kinds[{j}]", kinds, TURN_KINDS)
        keep.append(not any(kind in void for kind in kinds))
    return torch.tensor(keep, dtype=torch.bool)


def over_turn_mask(
    end_reasons: Sequence[str],
    *,
    last_turn_kinds: Sequence[str | None],
    over_turn_reasons: Collection[str] = BUDGET_END_REASONS,
    tool_call_kinds: Collection[str] = ("tool_call",),
) -> Tensor:
    """Mini-o3's over-turn mask: 0 for trajectories that ran out of budget while still calling tools.

    Punishing such trajectories teaches "answer early", which stops turn counts from growing at test
    time; masking makes running out of budget neither rewarded nor punished (Lai et al., 2025, arXiv 2509.07969). A
    trajectory that answered (even wrongly) on its last turn, or stopped without a tool call, is not
    over-turn.

    Args:
        end_reasons: ``N`` episode end reasons (``info["outcome"]["end_reason"]``).
        last_turn_kinds: ``N`` kinds of each trajectory's last turn (``None`` for a trajectory without
            turns, which is never over-turn).
        over_turn_reasons: End reasons that mean "the budget ran out" (turns, context or tokens: the termination
            table's budget reasons, :data:`agentgym.trajectory.TERMINATION`).
        tool_call_kinds: Last-turn kinds that mean "still calling tools".

    Returns:
        ``bool[N]``, ``False`` where the trajectory is over-turn.

    Raises:
        ConfigError: on unknown end reasons or turn kinds, or mismatched lengths.
    """
    if isinstance(end_reasons, str) or isinstance(last_turn_kinds, str):
        raise ConfigError("end_reasons and last_turn_kinds must be sequences with one entry per trajectory.")
    reasons, kinds = list(end_reasons), list(last_turn_kinds)
    if len(reasons) != len(kinds):
        raise ConfigError(
            f"end_reasons has {len(reasons)} entries but last_turn_kinds has {len(kinds)}; pass one per trajectory."
        )
    _check_kinds("over_turn_reasons", over_turn_reasons, END_REASONS)
    _check_kinds("tool_call_kinds", tool_call_kinds, TURN_KINDS)
    _check_kinds("end_reasons", reasons, END_REASONS)
    _check_kinds("last_turn_kinds", [k for k in kinds if k is not None], TURN_KINDS)
    over = set(over_turn_reasons)
    calls = set(tool_call_kinds)
    keep = [not (r in over and k in calls) for r, k in zip(reasons, kinds, strict=True)]
    return torch.tensor(keep, dtype=torch.bool)


def apply_sample_mask(loss_mask: Tensor, sample_mask: Tensor) -> Tensor:
    """Zero every token of the trajectories whose sample mask is 0.

    ``loss_mask = policy_token_mask * sample_weight_mask``, as SimpleTIR and Mini-o3 mask. Idempotent: applying the
    same sample mask twice equals applying it once, and masks compose by logical AND.

    Args:
        loss_mask: ``[N, L]`` bool/0-1 token mask.
        sample_mask: ``[N]`` bool/0-1 per-trajectory mask; any non-zero value keeps the trajectory.

    Returns:
        ``[N, L]`` mask in ``loss_mask``'s dtype and device.

    Raises:
        ConfigError: on mismatched shapes.
    """
    if not isinstance(loss_mask, Tensor) or loss_mask.dim() != 2:
        raise ConfigError("loss_mask must be a 2-D [N, L] tensor.")
    check_vector("sample_mask", sample_mask, loss_mask.shape[0])
    keep = (sample_mask != 0).to(loss_mask.device)[:, None]
    if loss_mask.dtype == torch.bool:
        return loss_mask & keep
    return loss_mask * keep.to(loss_mask.dtype)


def group_filter(
    scores: Tensor,
    group_ids: Sequence[Hashable] | Tensor,
    *,
    std_threshold: float,
    member_mask: Tensor | None = None,
    sample_mask: Tensor | None = None,
    acc_range: tuple[float, float] | None = None,
    min_members: int = 2,
) -> Tensor:
    """Dynamic sampling: keep only groups that carry a group-relative learning signal (DAPO, Yu et al., 2025).

    A group whose scores are all equal gives every member advantage 0 and only wastes compute. The
    statistics are taken over the counted members (``member_mask``): Mini-o3 counts only
    non-over-turn members, SimpleTIR counts all members (or only non-overlong ones, with
    ``min_members=4``).

    A group is dropped when any of these holds:

    * fewer than ``min_members`` counted members (this includes a group with no
      counted member, whose std the reference code computes as NaN and then *keeps*);
    * the unbiased std of the counted scores is ``< std_threshold`` (SimpleTIR 1e-3, Mini-o3 1e-4);
    * ``acc_range=(low, high)`` is given and the counted mean is outside ``[low, high]``
      (SimpleTIR ``--acc_filter 0.1_0.9``);
    * ``sample_mask`` is given and every member is masked out of the loss (nothing would train).

    Args:
        scores: ``[N]`` scalar scores (rewards).
        group_ids: ``[N]`` group ids.
        std_threshold: Minimum std to keep a group (``>= 0``; 0 disables the std test).
        member_mask: ``[N]`` bool/0-1, members counted in the filter statistics (default: all).
        sample_mask: ``[N]`` bool/0-1, members that contribute to the loss.
        acc_range: Optional inclusive ``(low, high)`` bounds on the counted mean.
        min_members: Minimum number of counted members (``>= 2``, since a std needs two).

    Returns:
        ``bool[N]``: ``True`` for members of kept groups (constant within a group).

    Raises:
        ConfigError: on wrong shapes or invalid thresholds.
    """
    check_vector("scores", scores)
    n = scores.shape[0]
    check_finite("scores", scores)
    if not (isinstance(std_threshold, (int, float)) and math.isfinite(std_threshold) and std_threshold >= 0):
        raise ConfigError(
            f"std_threshold must be a finite number >= 0 (SimpleTIR 1e-3, Mini-o3 1e-4), got {std_threshold!r}."
        )
    if not (isinstance(min_members, int) and min_members >= 2):
        raise ConfigError(f"min_members must be an int >= 2 (a std needs two members), got {min_members!r}.")
    if acc_range is not None and not (
        len(acc_range) == 2 and all(isinstance(v, (int, float)) for v in acc_range) and acc_range[0] <= acc_range[1]
    ):
        raise ConfigError(f"acc_range must be (low, high) with low <= high, e.g. (0.1, 0.9); got {acc_range!r}.")
    inverse, num_groups = group_index(group_ids, n)
    inverse = inverse.to(scores.device)
    counted = torch.ones(n, dtype=torch.bool, device=scores.device)
    if member_mask is not None:
        check_vector("member_mask", member_mask, n)
        counted = (member_mask != 0).to(scores.device)
    if n == 0:
        return torch.zeros(0, dtype=torch.bool, device=scores.device)

    count, mean, std = group_moments(scores.detach().to(torch.float64), inverse, num_groups, counted)
    keep = (count >= min_members) & (std >= std_threshold)  # NaN std (count < 2) compares False
    if acc_range is not None:
        keep &= (mean >= acc_range[0]) & (mean <= acc_range[1])
    if sample_mask is not None:
        check_vector("sample_mask", sample_mask, n)
        trains = (sample_mask != 0).to(device=scores.device, dtype=torch.float64)
        keep &= torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, inverse, trains) > 0
    return keep[inverse]
