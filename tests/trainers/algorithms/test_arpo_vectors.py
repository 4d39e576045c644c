"""ARPO math against worked examples hand-computed from ARPO's equations (Dong et al., 2025, arXiv 2507.19849):
segment entropy, branch probability, and hard and soft attribution over a branch tree."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.trainers import algorithms as alg

from agentgym.errors import ConfigError


def test_t17_segment_entropy_is_the_normalised_sum_over_positions() -> None:
    positions = [[math.log(0.5), math.log(0.25), math.log(0.25)], [math.log(1.0)]]
    assert alg.segment_entropy(positions, window=20, vocab_size=8) == pytest.approx(0.5, abs=1e-9)
    # A sum, not a mean: two copies of the uncertain position give twice the entropy.
    assert alg.segment_entropy(positions[:1] * 2, vocab_size=8) == pytest.approx(1.0, abs=1e-9)
    # Only the first K positions count.
    assert alg.segment_entropy(positions[:1] * 30, window=20, vocab_size=8) == pytest.approx(10.0, abs=1e-9)
    assert alg.segment_entropy([], vocab_size=8) == 0.0


def test_t18_branch_probability_and_the_uniform_draw() -> None:
    p = alg.branch_probability(0.5, 0.3, alpha=0.5, beta=0.2)
    assert p == pytest.approx(0.54)
    assert 0.53 < p  # u = 0.53 branches
    assert not 0.55 < p  # u = 0.55 does not
    assert alg.branch_probability(0.0, 3.0, alpha=0.5, beta=0.2) == 0.0  # entropy fell by 3: never
    assert alg.branch_probability(3.0, 0.0, alpha=0.5, beta=0.2) == 1.0  # rose by 3: always
    assert alg.branch_probability(0.9, 0.1, alpha=0.0, beta=0.0) == 0.0


def _tree() -> tuple[list[list[int]], torch.Tensor]:
    """A branch tree: tau2 branched from tau1 after P0, tau3 from tau2 after P1, tau4 independent."""
    p0, p1 = [10, 11, 12], [20, 21]
    sequences = [p0 + [30, 31], p0 + p1 + [40], p0 + p1 + [50, 51, 52], [60, 61]]
    advantages = alg.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), ["g"] * 4)
    return sequences, advantages


def test_t19_hard_attribution_of_the_branch_tree() -> None:
    sequences, advantages = _tree()
    assert advantages.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    adv, weights = alg.arpo_token_advantages(sequences, advantages, ["g"] * 4, mode="hard")
    a = 0.866025
    assert adv[0, :3].tolist() == pytest.approx([-0.288675] * 3, abs=1e-5)  # P0 in tau1
    assert adv[1, :3].tolist() == pytest.approx([-0.288675] * 3, abs=1e-5)  # P0 in tau2
    assert adv[1, 3:5].tolist() == pytest.approx([-a] * 2, abs=1e-5)  # P1
    assert adv[0, 3:5].tolist() == pytest.approx([a] * 2, abs=1e-5)  # tau1's own suffix
    assert adv[1, 5].item() == pytest.approx(-a, abs=1e-5)
    assert adv[2, 5:8].tolist() == pytest.approx([-a] * 3, abs=1e-5)
    assert adv[3, :2].tolist() == pytest.approx([a] * 2, abs=1e-5)  # independent: its own
    assert adv[3, 2:].abs().sum().item() == 0.0  # padding
    assert weights[0, :5].tolist() == [1.0] * 5


def test_soft_attribution_sums_to_hard_times_multiplicity_and_dedupe_trains_shared_tokens_once() -> None:
    sequences, advantages = _tree()
    soft, soft_w = alg.arpo_token_advantages(sequences, advantages, ["g"] * 4, mode="soft")
    hard, _ = alg.arpo_token_advantages(sequences, advantages, ["g"] * 4, mode="hard")
    # P0 (3 copies): sum of the soft advantages = 3 x the hard one = -0.866025.
    assert soft[:3, 0].sum().item() == pytest.approx(3 * hard[0, 0].item(), abs=1e-5)
    assert soft[:3, 0].sum().item() == pytest.approx(-0.866025, abs=1e-5)
    assert soft[2].tolist()[:8] == pytest.approx([-0.866025] * 8, abs=1e-5)
    assert soft_w[3].tolist() == [1.0, 1.0] + [0.0] * 6
    _, dedupe_w = alg.arpo_token_advantages(sequences, advantages, ["g"] * 4, mode="hard", dedupe=True)
    assert dedupe_w[:3, 0].tolist() == pytest.approx([1 / 3] * 3)  # P0 counted once in total
    assert dedupe_w[1:3, 3].tolist() == pytest.approx([0.5, 0.5])  # P1 once
    assert dedupe_w[2, 5].item() == 1.0 and dedupe_w[3, 0].item() == 1.0


def test_sharing_is_counted_only_inside_a_group() -> None:
    seqs = [[1, 2, 3], [1, 2, 4], [1, 2, 3]]
    advantages = torch.tensor([1.0, -1.0, 5.0])
    adv, _ = alg.arpo_token_advantages(seqs, advantages, ["a", "a", "b"], mode="hard")
    assert adv[0].tolist() == pytest.approx([0.0, 0.0, 1.0])
    assert adv[2].tolist() == pytest.approx([5.0, 5.0, 5.0])


def test_bad_inputs_say_how_to_fix_them() -> None:
    with pytest.raises(ConfigError, match="vocab_size"):
        alg.segment_entropy([[0.0]], vocab_size=1)
    with pytest.raises(ConfigError, match="window"):
        alg.segment_entropy([[0.0]], window=0, vocab_size=8)
    with pytest.raises(ConfigError, match="log-probs"):
        alg.segment_entropy([[0.5]], vocab_size=8)
    with pytest.raises(ConfigError, match="finite"):
        alg.branch_probability(float("nan"), 0.0, alpha=0.5, beta=0.2)
    with pytest.raises(ConfigError, match="one per sequence"):
        alg.arpo_token_advantages([[1]], torch.zeros(2), ["g", "g"])
    with pytest.raises(ConfigError, match="hard"):
        alg.arpo_token_advantages([[1]], torch.zeros(1), ["g"], dedupe=True)
    with pytest.raises(ConfigError):
        alg.arpo_token_advantages([[1]], torch.zeros(1), ["g"], mode="medium")  # type: ignore[arg-type]


def _crashed_sibling() -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """A healthy parent (R=1), a healthy independent sibling (R=0) and a child branched from the
    parent after its first 3 tokens that crashed (R=0, out of the statistics and the loss)."""
    sequences = [[10, 11, 12, 30, 31], [60, 61, 62], [10, 11, 12, 40, 41]]
    healthy = torch.tensor([True, True, False])
    advantages = alg.group_advantages(torch.tensor([1.0, 0.0, 0.0]), ["g"] * 3, stats_mask=healthy)
    # Statistics over the two healthy members: +-0.7071; the crashed child is measured against them: -0.7071.
    assert advantages.tolist() == pytest.approx([0.707106, -0.707106, -0.707106], abs=1e-5)
    return sequences, advantages, healthy


def test_crashed_or_masked_sibling_does_not_set_the_shared_prefix() -> None:
    sequences, advantages, healthy = _crashed_sibling()
    # Before the fix the crashed child voted: the parent's prefix got (0.707 - 0.707) / 2 = 0.0.
    voting, _ = alg.arpo_token_advantages(sequences, advantages, ["g"] * 3, mode="hard")
    assert voting[0, :3].tolist() == pytest.approx([0.0] * 3, abs=1e-6)
    adv, weights = alg.arpo_token_advantages(sequences, advantages, ["g"] * 3, mode="hard", counted=healthy)
    assert adv[0].tolist() == pytest.approx([0.707106] * 5, abs=1e-5)  # prefix and suffix: the parent's own
    assert adv[1, :3].tolist() == pytest.approx([-0.707106] * 3, abs=1e-5)
    assert adv[2].abs().sum().item() == 0.0 and weights[2].sum().item() == 0.0  # out of the loss
    _, dedupe_w = alg.arpo_token_advantages(sequences, advantages, ["g"] * 3, mode="hard", dedupe=True,
                                            counted=healthy)
    assert dedupe_w[0].tolist() == [1.0] * 5  # the prefix is the parent's alone: weight 1, not 1/2
    # A counted mask of all ones is the old behaviour; soft mode ignores the mask.
    everyone, _ = alg.arpo_token_advantages(sequences, advantages, ["g"] * 3, mode="hard",
                                            counted=torch.ones(3, dtype=torch.bool))
    assert torch.equal(everyone, voting)
    soft, _ = alg.arpo_token_advantages(sequences, advantages, ["g"] * 3, counted=healthy)
    assert soft[0, 0].item() == pytest.approx(0.707106, abs=1e-5)
    with pytest.raises(ConfigError, match="counted"):
        alg.arpo_token_advantages(sequences, advantages, ["g"] * 3, mode="hard", counted=torch.ones(2))


def test_arpo_trainer_attribution_skips_rows_out_of_the_loss(tmp_path: Path) -> None:
    """The trainer's hook reads 'counted' from the batch: a crashed row has an all-zero loss mask."""
    from types import SimpleNamespace

    from agentgym.trainers.arpo import ArpoConfig, ArpoTrainer
    from agentgym.trainers.batch import TrainingBatch

    sequences, advantages, healthy = _crashed_sibling()
    width = max(len(s) for s in sequences)
    ids = torch.zeros((3, width), dtype=torch.long)
    attention = torch.zeros((3, width))
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = torch.tensor(s)
        attention[i, :len(s)] = 1.0
    loss_mask = attention.clone()
    loss_mask[:, :1] = 0.0  # the first token is the prompt
    loss_mask[~healthy] = 0.0  # build_batch zeroes rows outside the sample mask
    batch = TrainingBatch(ids, attention.long(), loss_mask, advantages.clone(), torch.zeros((3, width)))
    config = ArpoConfig(model="unused", suite="games-calc", output_dir=str(tmp_path), attribution="hard")
    host = SimpleNamespace(config=config)  # the hook reads only its config
    trajectories = [SimpleNamespace(group_id="g")] * 3
    out = ArpoTrainer._attribute(host, batch, trajectories)  # type: ignore[arg-type]
    assert out.advantages[0, :5].tolist() == pytest.approx([0.707106] * 5, abs=1e-5)
    assert out.loss_mask[2].sum().item() == 0.0
