"""Hypothesis properties of trainers.algorithms: masking, group sums, micro-batching, padding, no NaN."""

from __future__ import annotations

import itertools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.trainers.algorithms import (
    AGGREGATION_MODES,
    aggregate_loss,
    apply_sample_mask,
    clipped_policy_loss,
    group_advantages,
    group_filter,
    kl_penalty,
    loss_denominators,
    over_turn_mask,
    void_trajectory_mask,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def token_batch(draw: st.DrawFn, max_n: int = 5, max_l: int = 7) -> dict[str, torch.Tensor]:
    """A float64 [N, L] batch: log-probs, old log-probs, advantages and an arbitrary 0/1 mask."""
    n = draw(st.integers(1, max_n))
    length = draw(st.integers(1, max_l))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    mask_kind = draw(st.sampled_from(["random", "zeros", "ones", "one_row_empty"]))
    if mask_kind == "zeros":
        mask = torch.zeros(n, length, dtype=torch.bool)
    elif mask_kind == "ones":
        mask = torch.ones(n, length, dtype=torch.bool)
    else:
        mask = torch.rand(n, length, generator=gen) < draw(st.floats(0.1, 0.9))
        if mask_kind == "one_row_empty":
            mask[0] = False
    return {
        "logp": -3 * torch.rand(n, length, generator=gen, dtype=torch.float64),
        "old_logp": -3 * torch.rand(n, length, generator=gen, dtype=torch.float64),
        "adv": torch.randn(n, generator=gen, dtype=torch.float64) * 2,
        "mask": mask,
    }


modes = st.sampled_from(AGGREGATION_MODES)
clip_settings = st.fixed_dictionaries(
    {
        "eps_low": st.sampled_from([0.1, 0.2]),
        "eps_high": st.sampled_from([0.2, 0.28]),
        "dual_clip_c": st.sampled_from([None, 3.0]),
        "ratio_clip": st.sampled_from(["ppo", "loop"]),
    }
)


def _loss(batch: dict[str, torch.Tensor], mode: str, clip: dict, **agg: object) -> tuple[torch.Tensor, torch.Tensor]:
    logp = batch["logp"].clone().requires_grad_(True)
    per_token, _ = clipped_policy_loss(logp, batch["old_logp"], batch["adv"], loss_mask=batch["mask"], **clip)
    per_token = per_token + 0.01 * kl_penalty(logp, batch["old_logp"] - 0.3)
    max_len = {"max_len_norm": 8} if mode == "seq-mean-token-sum-norm" else {}
    return aggregate_loss(per_token, batch["mask"], mode=mode, **max_len, **agg), logp  # type: ignore[arg-type]


@FAST
@given(batch=token_batch(), mode=modes, clip=clip_settings)
def test_masked_tokens_get_exactly_zero_gradient(batch: dict, mode: str, clip: dict) -> None:
    loss, logp = _loss(batch, mode, clip)
    loss.backward()
    assert logp.grad is not None
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[~batch["mask"]] == 0).all()


@FAST
@given(batch=token_batch(), mode=modes, clip=clip_settings, normalize_by=st.sampled_from(["unmasked", "all"]))
def test_loss_is_never_nan_for_any_mask(batch: dict, mode: str, clip: dict, normalize_by: str) -> None:
    if mode == "token-mean":
        normalize_by = "unmasked"
    loss, logp = _loss(batch, mode, clip, normalize_by=normalize_by)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    if not batch["mask"].any():
        assert loss.item() == 0.0


@FAST
@given(batch=token_batch(max_n=8), mode=modes, data=st.data(), normalize_by=st.sampled_from(["unmasked", "all"]))
def test_micro_batches_with_global_denominators_sum_to_the_full_loss(
    batch: dict, mode: str, data: st.DataObject, normalize_by: str
) -> None:
    if mode == "token-mean":
        normalize_by = "unmasked"
    n = batch["mask"].shape[0]
    per_token = torch.randn(batch["mask"].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    extra = {"max_len_norm": 5} if mode == "seq-mean-token-sum-norm" else {}
    full = aggregate_loss(
        per_token, batch["mask"], mode=mode, normalize_by=normalize_by, **extra  # type: ignore[arg-type]
    )
    tokens, seqs = loss_denominators(batch["mask"], normalize_by=normalize_by)  # type: ignore[arg-type]
    cuts = sorted({*data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=3)), 0, n})
    parts = [
        aggregate_loss(
            per_token[a:b], batch["mask"][a:b], mode=mode,  # type: ignore[arg-type]
            global_token_count=tokens, global_seq_count=seqs, **extra,
        )
        for a, b in itertools.pairwise(cuts)
        if b > a
    ]
    assert abs(float(sum(parts)) - float(full)) < 1e-6


@FAST
@given(
    batch=token_batch(),
    mode=modes,
    pad=st.integers(1, 4),
    junk=st.sampled_from([0.0, 1e6, float("nan"), float("inf")]),
)
def test_padding_columns_do_not_change_the_loss(batch: dict, mode: str, pad: int, junk: float) -> None:
    n, length = batch["mask"].shape
    per_token = torch.randn(n, length, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    extra = {"max_len_norm": 16} if mode == "seq-mean-token-sum-norm" else {}
    base = aggregate_loss(per_token, batch["mask"], mode=mode, **extra)  # type: ignore[arg-type]
    padded_loss = torch.cat([per_token, torch.full((n, pad), junk, dtype=torch.float64)], dim=1)
    padded_mask = torch.cat([batch["mask"], torch.zeros(n, pad, dtype=torch.bool)], dim=1)
    padded = aggregate_loss(padded_loss, padded_mask, mode=mode, **extra)  # type: ignore[arg-type]
    assert abs(float(padded) - float(base)) < 1e-6


@FAST
@given(batch=token_batch(), clip=clip_settings, pad=st.integers(1, 3))
def test_padded_logprobs_do_not_change_the_policy_loss(batch: dict, clip: dict, pad: int) -> None:
    """Padding with -inf log-probs (mask 0) changes neither the loss nor the real tokens' gradients."""
    n = batch["mask"].shape[0]
    padded = {
        "logp": torch.cat([batch["logp"], torch.full((n, pad), float("-inf"), dtype=torch.float64)], 1),
        "old_logp": torch.cat([batch["old_logp"], torch.full((n, pad), -1.0, dtype=torch.float64)], 1),
        "adv": batch["adv"],
        "mask": torch.cat([batch["mask"], torch.zeros(n, pad, dtype=torch.bool)], 1),
    }
    logp_p = padded["logp"].clone().requires_grad_(True)
    per_token, _ = clipped_policy_loss(logp_p, padded["old_logp"], padded["adv"], loss_mask=padded["mask"], **clip)
    loss = aggregate_loss(per_token, padded["mask"], mode="token-mean")
    loss.backward()
    no_kl, _ = clipped_policy_loss(batch["logp"], batch["old_logp"], batch["adv"], loss_mask=batch["mask"], **clip)
    assert abs(loss.item() - aggregate_loss(no_kl, batch["mask"], mode="token-mean").item()) < 1e-6
    assert (logp_p.grad[:, -pad:] == 0).all()


@st.composite
def groups(draw: st.DrawFn) -> tuple[torch.Tensor, list[int]]:
    """Several groups of size >= 2 with non-constant scores, members interleaved by a permutation."""
    sizes = draw(st.lists(st.integers(2, 6), min_size=1, max_size=4))
    scores: list[float] = []
    ids: list[int] = []
    for g, size in enumerate(sizes):
        vals = draw(st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=size, max_size=size))
        if max(vals) - min(vals) < 0.1:  # non-constant, and std >> eps so the unit-std check is exact
            vals[0] = vals[0] + 1.0
        scores += vals
        ids += [g] * size
    perm = draw(st.permutations(range(len(scores))))
    return torch.tensor([scores[i] for i in perm], dtype=torch.float32), [ids[i] for i in perm]


@FAST
@given(data=groups(), mode=st.sampled_from(["grpo", "mean_norm", "rloo"]))
def test_group_advantages_sum_to_zero_within_each_group(data: tuple[torch.Tensor, list[int]], mode: str) -> None:
    scores, ids = data
    adv = group_advantages(scores, ids, mode=mode)  # type: ignore[arg-type]
    for g in set(ids):
        members = torch.tensor([i == g for i in ids])
        assert abs(float(adv[members].double().sum())) < 1e-4
        if mode == "grpo":  # unit (unbiased) std up to eps
            assert abs(float(adv[members].double().std()) - 1.0) < 1e-3


@FAST
@given(data=groups())
def test_group_filter_is_constant_within_a_group(data: tuple[torch.Tensor, list[int]]) -> None:
    scores, ids = data
    keep = group_filter(scores, ids, std_threshold=1.0, acc_range=(-5.0, 5.0))
    for g in set(ids):
        vals = keep[torch.tensor([i == g for i in ids])]
        assert vals.all() or not vals.any()


@FAST
@given(
    n=st.integers(1, 6),
    length=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    as_float=st.booleans(),
)
def test_sample_masks_are_idempotent_and_compose(n: int, length: int, seed: int, as_float: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    loss_mask = torch.rand(n, length, generator=gen) < 0.6
    if as_float:
        loss_mask = loss_mask.float()
    a = torch.rand(n, generator=gen) < 0.5
    b = torch.rand(n, generator=gen) < 0.5
    once = apply_sample_mask(loss_mask, a)
    assert once.dtype == loss_mask.dtype
    assert torch.equal(apply_sample_mask(once, a), once)
    assert torch.equal(apply_sample_mask(once, b), apply_sample_mask(loss_mask, a & b))
    assert torch.equal(apply_sample_mask(apply_sample_mask(loss_mask, b), a), apply_sample_mask(once, b))


kinds = st.sampled_from(["tool_call", "answer", "void", "invalid"])
reasons = st.sampled_from(["answered", "solved", "failed", "max_turns", "context_limit", "error"])


@FAST
@given(turns=st.lists(st.lists(kinds, max_size=4), min_size=1, max_size=6), ends=st.data())
def test_trajectory_masks_are_idempotent(turns: list[list[str]], ends: st.DataObject) -> None:
    end_reasons = ends.draw(st.lists(reasons, min_size=len(turns), max_size=len(turns)))
    last = [t[-1] if t else None for t in turns]
    void = void_trajectory_mask(turns)
    over = over_turn_mask(end_reasons, last_turn_kinds=last)
    loss_mask = torch.ones(len(turns), 3, dtype=torch.bool)
    combined = apply_sample_mask(apply_sample_mask(loss_mask, void), over)
    assert torch.equal(apply_sample_mask(apply_sample_mask(combined, void), over), combined)
    assert torch.equal(void_trajectory_mask(turns), void)
    for j, t in enumerate(turns):
        assert bool(void[j]) == ("void" not in t)
        assert bool(over[j]) == (not (end_reasons[j] in ("max_turns", "context_limit") and last[j] == "tool_call"))
