"""Worked examples for trainers.algorithms, hand-computed from the papers' equations (GRPO, Shao et al., 2024;
DAPO, Yu et al., 2025; LOOP, Chen et al., 2025; ArCHer, Zhou et al., 2024; G-RA, Sun et al., 2025; SimpleTIR,
Xue et al., 2025; Mini-o3, Lai et al., 2025) and their reference code's conventions (unbiased std, eps 1e-6)."""

from __future__ import annotations

import pytest
import torch

from agentgym.errors import ConfigError
from agentgym.trainers.algorithms import (
    aggregate_loss,
    apply_sample_mask,
    broadcast_to_tokens,
    clipped_policy_loss,
    direct_reward_accumulation,
    discounted_returns,
    gated_reward_accumulation,
    gated_reward_accumulation_batch,
    group_advantages,
    group_filter,
    is_void_turn_simpletir,
    kl_penalty,
    loss_denominators,
    over_turn_mask,
    reinforce_loss,
    simpletir_turn_flags,
    void_trajectory_mask,
)

TOL = 1e-4


def close(actual: torch.Tensor | float, expected: list[float] | float, tol: float = TOL) -> None:
    a = torch.as_tensor(actual, dtype=torch.float64)
    e = torch.as_tensor(expected, dtype=torch.float64)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert torch.allclose(a, e, atol=tol, rtol=0), (a.tolist(), e.tolist())


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


ONE_GROUP = [0, 0, 0, 0]


# ---- group advantages (GRPO, mean_norm, RLOO, singletons) --------------------------------------------
def test_t1_grpo() -> None:
    close(group_advantages(t([1, 0, 0, 0]), ONE_GROUP), [1.5, -0.5, -0.5, -0.5])
    close(group_advantages(t([1, 0, 0, 0]), ONE_GROUP), [1.499997, -0.499999, -0.499999, -0.499999], tol=1e-6)


def test_t2_grpo() -> None:
    close(group_advantages(t([1, 0, 0, 1]), ONE_GROUP), [0.866025, -0.866025, -0.866025, 0.866025])


def test_t3_mean_norm() -> None:
    close(group_advantages(t([1, 0, 0, 0]), ONE_GROUP, mode="mean_norm"), [0.75, -0.25, -0.25, -0.25])


def test_t4_singleton_verl_and_project_modes() -> None:
    close(group_advantages(t([0.7]), ["g"], singleton="raw"), [0.7])
    close(group_advantages(t([0.7]), ["g"]), [0.0])
    close(group_advantages(t([0.7]), ["g"], mode="mean_norm", singleton="raw"), [0.7])


def test_t5_rloo_and_loop_worked_example() -> None:
    close(group_advantages(t([1, 0, 0, 1]), ONE_GROUP, mode="rloo"), [0.666667, -0.666667, -0.666667, 0.666667])
    close(group_advantages(t([1, 1, 1, 1]), ONE_GROUP, mode="rloo"), [0.0, 0.0, 0.0, 0.0])


def test_groups_are_found_by_id_not_position() -> None:
    scores = t([1, 5, 0, 5, 0, 6, 0, 7])
    ids = ["a", "b", "a", "b", "a", "b", "a", "b"]
    adv = group_advantages(scores, ids)
    close(adv[0::2], [1.5, -0.5, -0.5, -0.5])
    close(group_advantages(scores, torch.tensor([3, 9, 3, 9, 3, 9, 3, 9])), adv.tolist())


# ---- aggregation with a fully masked trajectory ----------------------------------------------------
def e12_batch(void_masked: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advantages [1.5, -.5, -.5, -.5], policy tokens [2, 3, 4, 1] after a 2-token prompt, traj 3 masked."""
    adv = group_advantages(t([1, 0, 0, 0]), ONE_GROUP)
    counts = [2, 3, 4, 1]
    width = 2 + max(counts) + 1  # prompt + response + right padding
    mask = torch.zeros(4, width, dtype=torch.bool)
    for j, c in enumerate(counts):
        mask[j, 2 : 2 + c] = True
    if void_masked:
        mask = apply_sample_mask(mask, torch.tensor([True, True, False, True]))
    return adv, mask, torch.randn(4, width)


def rho_one_loss(adv: torch.Tensor, mask: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    loss, _ = clipped_policy_loss(old.clone(), old, adv, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    return loss


def test_t6_token_mean_with_masked_trajectory() -> None:
    adv, mask, old = e12_batch()
    close(aggregate_loss(rho_one_loss(adv, mask, old), mask, mode="token-mean"), -1 / 6)


def test_t7_seq_mean_token_mean_with_masked_trajectory_is_not_nan() -> None:
    adv, mask, old = e12_batch()
    loss = aggregate_loss(rho_one_loss(adv, mask, old), mask, mode="seq-mean-token-mean")
    close(loss, -0.166667)


def test_e12_naive_seq_mean_token_mean_gives_nan() -> None:
    """Negative test: verl's formula divides 0 by 0 for the fully masked trajectory."""
    adv, mask, old = e12_batch()
    per_token = rho_one_loss(adv, mask, old)
    m = mask.float()
    naive = ((per_token * m).sum(-1) / m.sum(-1)).mean()
    assert torch.isnan(naive)
    assert torch.isfinite(aggregate_loss(per_token, mask, mode="seq-mean-token-mean"))


# ---- SimpleTIR's void-turn masks -----------------------------------------------------------------------
def test_simpletir_67_masking_vs_no_masking() -> None:
    adv, mask, old = e12_batch(void_masked=True)
    close(aggregate_loss(rho_one_loss(adv, mask, old), mask, mode="token-mean"), -0.166667)
    adv, unmasked, old = e12_batch(void_masked=False)
    close(aggregate_loss(rho_one_loss(adv, unmasked, old), unmasked, mode="token-mean"), 0.1)


def test_simpletir_67_void_member_keeps_its_advantage_in_the_tensor() -> None:
    adv, mask, _ = e12_batch()
    token_adv = broadcast_to_tokens(adv, torch.ones_like(mask))
    assert token_adv[2].eq(adv[2]).all() and not mask[2].any()


def test_simpletir_67_excluded_from_stats() -> None:
    scores = t([1, 0, 0, 0])
    stats = torch.tensor([True, True, False, True])
    adv = group_advantages(scores, ONE_GROUP, stats_mask=stats)
    close(adv[stats], [1.154700, -0.577350, -0.577350])
    close(group_advantages(t([1, 0, 0]), [0, 0, 0]), [1.154700, -0.577350, -0.577350])


# ---- clipping (DAPO clip-higher, dual clip, LOOP's clip) ----------------------------------------------
def per_token_clip(pairs: list[tuple[float, float]], **kwargs: object) -> torch.Tensor:
    adv = t([a for a, _ in pairs])[:, None]
    logp = torch.log(t([r for _, r in pairs]))[:, None]
    loss, _ = clipped_policy_loss(logp, torch.zeros_like(logp), adv, **kwargs)  # type: ignore[arg-type]
    return loss[:, 0]


def test_t8_dapo_dual_clip() -> None:
    loss = per_token_clip([(1, 1.5), (-1, 0.5), (-1, 5.0), (1, 0.5)], eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    close(loss, [-1.28, 0.8, 3.0, -0.5])


def test_t8_plain_clip_has_no_cap() -> None:
    loss = per_token_clip([(-1, 5.0)], eps_low=0.2, eps_high=0.28)
    close(loss, [5.0])


def test_t8_metrics() -> None:
    adv = t([1, -1, -1, 1])[:, None]
    logp = torch.log(t([1.5, 0.5, 5.0, 0.5]))[:, None]
    _, metrics = clipped_policy_loss(logp, torch.zeros_like(logp), adv, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    close(metrics["clip_frac"], 0.5)  # tokens 0 (high side) and 1 (low side) take the clipped term
    close(metrics["clip_frac_high"], 0.25)
    close(metrics["clip_frac_low"], 0.25)
    close(metrics["dual_clip_frac"], 0.25)
    close(metrics["ratio_max"], 5.0)


def test_t9_loop_clip() -> None:
    loss = per_token_clip([(0.666667, 1.2), (-0.666667, 0.8)], eps_low=0.1, eps_high=0.1, ratio_clip="loop")
    close(loss, [-0.733333, 0.606061])
    # the LOOP lower bound 1/1.1 = 0.909091 differs from PPO's 0.9
    close(per_token_clip([(-1, 0.5)], eps_low=0.1, eps_high=0.1, ratio_clip="loop"), [1 / 1.1])
    close(per_token_clip([(-1, 0.5)], eps_low=0.1, eps_high=0.1), [0.9])


# ---- k3 KL -----------------------------------------------------------------------------------------
def test_t10_k3() -> None:
    close(kl_penalty(t([-1.0]), t([-1.5])), [0.106531])
    close(kl_penalty(t([-1.0]), t([-1.5]), estimator="k1"), [0.5])
    close(kl_penalty(t([0.0]), t([-50.0])), [10.0])  # clamped to [-10, 10]


# ---- REINFORCE: sum over the utterance (ArCHer's actor) --------------------------------------------
def test_t13_reinforce_sum_over_utterance() -> None:
    logp = t([-1, -2, -0.5])[None, :]
    loss = reinforce_loss(logp, t([0.1]))
    close(aggregate_loss(loss, torch.ones_like(logp), mode="seq-mean-token-sum"), 0.35)


# ---- Monte-Carlo returns -----------------------------------------------------------------------------
def test_t15_returns() -> None:
    close(discounted_returns(t([0, 0, 1]), 0.95), [0.9025, 0.95, 1.0])
    close(discounted_returns(t([0, 0, 1]), 0.5), [0.25, 0.5, 1.0])
    batch = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    close(discounted_returns(batch, 0.5, mask), [[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]])


# ---- G-RA and D-RA (Sun et al., 2025) ------------------------------------------------------------
GRA_TABLE = [  # (r_high, r_low per step)
    (0.0, [0.05, 0.05, 0.05]),  # A: no submit
    (0.5, [0.05, -0.05, 0.05]),  # B: fails tests
    (1.0, [0.05, 0.05]),  # C: passes
]


def test_t20_gra_totals_and_advantages() -> None:
    totals = [gated_reward_accumulation([hi, t(lo)], [0.5])[0] for hi, lo in GRA_TABLE]
    close(totals, [0.0, 0.55, 1.10])
    close(group_advantages(torch.tensor(totals), [0, 0, 0]), [-1.0, 0.0, 1.0])
    close(group_advantages(torch.tensor(totals), [0, 0, 0]), [-0.999998, 0.0, 0.999998], tol=1e-5)


def test_t21_dra_control() -> None:
    totals = [direct_reward_accumulation([hi, t(lo)])[0] for hi, lo in GRA_TABLE]
    close(totals, [0.15, 0.55, 1.10])
    close(group_advantages(torch.tensor(totals), [0, 0, 0]), [-0.943454, -0.104828, 1.048283])


def test_56_hacking_illustration() -> None:
    farm = t([0.05] * 20)
    assert abs(direct_reward_accumulation([0.0, farm])[0] - 1.0) < TOL
    assert gated_reward_accumulation([0.0, farm], [0.5])[0] == 0.0


def test_56_step_variant_returns_to_go() -> None:
    total, per_step = gated_reward_accumulation([0.5, t([0.05, -0.05, 0.05])], [0.5])
    close(per_step, [0.05, -0.05, 0.55])
    close(discounted_returns(per_step, 1.0), [0.55, 0.50, 0.55])
    close(total, float(per_step.sum()))
    _, per_step_a = gated_reward_accumulation([0.0, t([0.05, 0.05, 0.05])], [0.5])
    close(per_step_a, [0.0, 0.0, 0.0])


def test_gra_comparison_operator_and_priorities() -> None:
    assert gated_reward_accumulation([0.5, t([0.1])], [0.5], cmp=">")[0] == 0.5
    # three channels: a closed middle gate also closes the last channel
    total, _ = gated_reward_accumulation([1.0, 0.2, t([0.3, 0.3])], [1.0, 0.5])
    close(total, 1.2)
    total, _ = gated_reward_accumulation([1.0, 0.6, t([0.3, 0.3])], [1.0, 0.5])
    close(total, 2.2)


def test_gra_batch_matches_single() -> None:
    outcome = t([hi for hi, _ in GRA_TABLE])
    steps = torch.zeros(3, 3)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    for j, (_, lo) in enumerate(GRA_TABLE):
        steps[j, : len(lo)] = t(lo)
        mask[j, : len(lo)] = True
    steps[2, 2] = 99.0  # padding is ignored
    totals, per_step = gated_reward_accumulation_batch([outcome, steps], [0.5], step_mask=mask)
    close(totals, [0.0, 0.55, 1.10])
    close(per_step, [[0, 0, 0], [0.05, -0.05, 0.55], [0.05, 1.05, 0.0]])


# ---- SimpleTIR void detection --------------------------------------------------------------------
T22 = [
    ("Let me think about it.", "void"),
    ("```python\nprint(1)\n```", "code"),
    ("so the answer is \\boxed{3}", "answer"),
    ("```python\nprint(1)", "void"),
    ("```py\nx=1\n```", "code"),
    ("```\nx=1\n```", "code"),
    ("```python\n```", "void"),
    ("```Python\nx=1\n```", "void"),
]


@pytest.mark.parametrize(("text", "expected"), T22)
def test_t22_simpletir_void(text: str, expected: str) -> None:
    has_code, has_answer, is_void = simpletir_turn_flags(text)
    assert is_void_turn_simpletir(text) is is_void
    assert {"void": (False, False, True), "code": (True, False, False), "answer": (False, True, False)}[expected] == (
        has_code,
        has_answer,
        is_void,
    )


def test_void_trajectory_mask() -> None:
    kinds = [["tool_call", "answer"], ["tool_call", "void"], [], ["invalid", "answer"]]
    assert void_trajectory_mask(kinds).tolist() == [True, False, True, True]
    assert void_trajectory_mask(kinds, void_kinds=("void", "invalid")).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="Did you mean 'tool_call'"):
        void_trajectory_mask([["tool_calls"]])


def test_over_turn_mask_follows_72() -> None:
    reasons = ["max_turns", "max_turns", "context_limit", "answered", "max_turns", "error"]
    last = ["tool_call", "answer", "tool_call", "tool_call", "void", "tool_call"]
    assert over_turn_mask(reasons, last_turn_kinds=last).tolist() == [False, True, False, True, True, True]


# ---- Mini-o3 over-turn masking and filtering ------------------------------------------------------
def test_t23_minio3_filter_uses_non_over_turn_members() -> None:
    scores, over = t([1, 1, 0]), torch.tensor([False, False, True])
    assert group_filter(scores, [0, 0, 0], std_threshold=1e-4, member_mask=~over).tolist() == [False] * 3
    assert group_filter(scores, [0, 0, 0], std_threshold=1e-4).tolist() == [True] * 3


def test_t24_all_over_turn_group_is_dropped() -> None:
    scores, over = t([0, 0, 0, 1, 0]), torch.tensor([True, True, True, False, False])
    keep = group_filter(scores, ["a", "a", "a", "b", "b"], std_threshold=1e-4, member_mask=~over)
    assert keep.tolist() == [False, False, False, True, True]


def test_group_filter_acc_range_and_all_masked() -> None:
    scores = t([1, 1, 1, 0, 1, 0, 0, 0, 1, 0])
    ids = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    keep = group_filter(scores, ids, std_threshold=1e-3, acc_range=(0.1, 0.9))
    assert keep.tolist() == [True] * 4 + [True] * 4 + [True] * 2
    keep = group_filter(scores, ids, std_threshold=1e-3, acc_range=(0.3, 0.6))
    assert keep.tolist() == [False] * 4 + [False] * 4 + [True] * 2
    sample = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    keep = group_filter(scores, ids, std_threshold=1e-3, sample_mask=sample)
    assert keep.tolist() == [True] * 8 + [False] * 2


def test_minio3_76_advantages_and_normalisation() -> None:
    adv = group_advantages(t([1, 0, 0, 0]), ONE_GROUP)
    close(adv, [1.5, -0.5, -0.5, -0.5])
    over = torch.tensor([False, False, True, False])
    close(group_advantages(t([1, 0, 0, 0]), ONE_GROUP, stats_mask=~over)[~over], [1.154700, -0.577350, -0.577350])
    counts = [2, 3, 4, 1]
    mask = torch.zeros(4, 5, dtype=torch.bool)
    for j, c in enumerate(counts):
        mask[j, :c] = True
    mask = apply_sample_mask(mask, ~over)
    old = torch.randn(4, 5)
    per_token, _ = clipped_policy_loss(old.clone(), old, adv, eps_low=0.2, eps_high=0.3, loss_mask=mask)
    close(aggregate_loss(per_token, mask, mode="token-mean"), -0.166667)
    # code behaviour: per-sample mean, divided by all 4 samples (masked ones included)
    close(aggregate_loss(per_token, mask, mode="seq-mean-token-mean", normalize_by="all"), -0.125)
    close(aggregate_loss(per_token, mask, mode="seq-mean-token-mean"), -0.166667)
    tokens, seqs = loss_denominators(mask, normalize_by="all")
    assert (tokens, seqs) == (6.0, 4.0)
    close(aggregate_loss(per_token, mask, mode="seq-mean-token-mean", global_seq_count=seqs), -0.125)


# ---- input validation --------------------------------------------------------------------------------
def test_invalid_inputs_raise_value_error_with_fix() -> None:
    with pytest.raises(ValueError, match="Did you mean 'grpo'"):
        group_advantages(t([1, 0]), [0, 0], mode="grp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one id per trajectory"):
        group_advantages(t([1, 0]), [0])
    with pytest.raises(ValueError, match="max_len_norm"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="shape"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 4), mode="token-mean")
    with pytest.raises(ValueError, match="dual_clip_c"):
        clipped_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), t([1]), dual_clip_c=0.5)
    with pytest.raises(ValueError, match="thresholds"):
        gated_reward_accumulation([1.0, 0.5, t([0.1])], [0.5])
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(t([1, float("nan")]), [0, 0])
    with pytest.raises(ConfigError, match="mode='seq-mean-token-mean'"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), mode="token-mean", normalize_by="all")
