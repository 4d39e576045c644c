"""GiGPO advantages against examples hand-computed from GiGPO's equations (Feng et al., 2025, arXiv 2505.10978),
worked in the comments."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from agentgym.errors import ConfigError
from agentgym.trainers import algorithms as alg

# Hand-computed from GiGPO's equations: one task group of N = 3, gamma 0.95, omega 1, success reward 1.
SPEC_ANCHORS = [["s0", "s1", "s2"], ["s0", "s1", "s3"], ["s0", "s4"]]
SPEC_REWARDS = [[0, 0, 1], [0, 0, 0], [0, 1]]


def _lists(tensors: list[torch.Tensor]) -> list[list[float]]:
    return [t.tolist() for t in tensors]


def _flat(tensors: list[torch.Tensor]) -> list[float]:
    return [x for t in tensors for x in t.tolist()]


def _spec(**kwargs: object) -> alg.GigpoAdvantages:
    return alg.gigpo_advantages(["g"] * 3, SPEC_ANCHORS, SPEC_REWARDS, **kwargs)  # type: ignore[arg-type]


def test_t25_mean_norm_paper_and_code_columns() -> None:
    paper = _spec(mode="mean_norm", episode_stats="trajectories")
    assert _flat(paper.step_returns) == pytest.approx([0.9025, 0.95, 1.0, 0, 0, 0, 0.95, 1.0], abs=1e-6)
    assert _flat(paper.step) == pytest.approx([0.2850, 0.4750, 0, -0.6175, -0.4750, 0, 0.3325, 0], abs=1e-4)
    assert _flat(paper.episode) == pytest.approx([1 / 3] * 3 + [-2 / 3] * 3 + [1 / 3] * 2, abs=1e-4)
    assert _flat(paper.advantages) == pytest.approx(
        [0.6183, 0.8083, 0.3333, -1.2842, -1.1417, -0.6667, 0.6658, 0.3333], abs=1e-4)
    code = _spec(mode="mean_norm", episode_stats="all_steps")  # the pool is 8 samples, five 1s: mean 0.625
    assert _flat(code.episode) == pytest.approx([0.375] * 3 + [-0.625] * 3 + [0.375] * 2, abs=1e-4)
    assert _flat(code.advantages) == pytest.approx(
        [0.6600, 0.8500, 0.3750, -1.2425, -1.1000, -0.6250, 0.7075, 0.3750], abs=1e-4)
    assert _flat(code.step) == _flat(paper.step)  # the step part does not depend on the episode statistics
    assert all(t.dtype == torch.float32 for t in paper.advantages)
    assert [t.shape[0] for t in paper.advantages] == [3, 3, 2]


def test_t26_mean_std_norm() -> None:
    paper = _spec(mode="mean_std_norm", episode_stats="trajectories")
    step = _lists(paper.step)
    assert [step[0][0], step[1][0], step[2][0]] == pytest.approx([0.5324, -1.1536, 0.6211], abs=1e-4)  # s0
    assert [step[0][1], step[1][1]] == pytest.approx([0.7071, -0.7071], abs=1e-4)  # s1: +-0.7071 whatever the gap
    assert [t[0] for t in _lists(paper.episode)] == pytest.approx([0.5774, -1.1547, 0.5774], abs=1e-4)
    assert paper.advantages[0][0].item() == pytest.approx(1.1098, abs=1e-4)
    code = _spec(mode="mean_std_norm", episode_stats="all_steps")
    assert [t[0] for t in _lists(code.episode)] == pytest.approx([0.7246, -1.2076, 0.7246], abs=1e-4)
    assert code.advantages[0][0].item() == pytest.approx(1.2570, abs=1e-4)


def test_spec_invalid_action_variant_is_not_discounted_backwards() -> None:
    valid = [[True, False, True], [True] * 3, [True] * 2]
    out = _spec(valid=valid)
    assert out.step_returns[0].tolist() == pytest.approx([0.9025, 0.85, 1.0], abs=1e-6)  # t0 keeps 0.9025
    assert out.episode_scores[0].tolist() == pytest.approx([1.0, 0.9, 1.0], abs=1e-6)
    # Paper statistics use each trajectory's first-step score [1, 0, 1]: mean 2/3.
    # A^E(tau1 t1) = 0.9 - 2/3 = 0.233333; s1 = {0.85, 0} -> A^S = +0.425; total 0.658333.
    assert out.episode[0].tolist() == pytest.approx([1 / 3, 0.233333, 1 / 3], abs=1e-5)
    assert out.advantages[0][1].item() == pytest.approx(0.658333, abs=1e-5)
    assert out.stats["gigpo/invalid_steps"] == 1.0
    # Cross-step pool: [1, 0.9, 1, 0, 0, 0, 1, 1], mean 0.6125 -> A^E(tau1) = [0.3875, 0.2875, 0.3875].
    code = _spec(valid=valid, episode_stats="all_steps")
    assert code.episode[0].tolist() == pytest.approx([0.3875, 0.2875, 0.3875], abs=1e-5)
    # A penalty of 0 turns the check off; a larger one scales linearly.
    assert _flat(_spec(valid=valid, invalid_penalty=0.0).advantages) == pytest.approx(_flat(_spec().advantages))
    assert _spec(valid=valid, invalid_penalty=0.5).step_returns[0][1].item() == pytest.approx(0.45, abs=1e-6)


# Two task groups that use the same anchor keys (they must never be compared across groups), one loop.
#   group a: tau1 A -> B -> A -> G, rewards [0, 0, 0, 1]; tau2 A -> C, rewards [0, 0].
#   group b: tau3 A -> B, rewards [0, 1];                  tau4 A -> B, rewards [0, 0].
TWO_IDS = ["a", "a", "b", "b"]
TWO_ANCHORS = [["A", "B", "A", "G"], ["A", "C"], ["A", "B"], ["A", "B"]]
TWO_REWARDS = [[0, 0, 0, 1], [0, 0], [0, 1], [0, 0]]


def test_hand_vector_two_groups_with_a_loop_gamma_half() -> None:
    # gamma 0.5: tau1 returns [0.125, 0.25, 0.5, 1]; tau2 [0, 0]; tau3 [0.5, 1]; tau4 [0, 0].
    # group a, anchor A = {tau1 t0: 0.125, tau1 t2: 0.5, tau2 t0: 0} (the loop gives tau1 two members):
    #   mean 0.208333 -> A^S = [-0.083333, +0.291667, -0.208333]; B, G, C are singletons -> 0.
    # group b, anchor A = {0.5, 0} -> +-0.25; B = {1, 0} -> +-0.5 (group a's A and B are not mixed in).
    # Episode (mean_norm): group a R = [1, 0] -> +-0.5; group b R = [1, 0] -> +-0.5.
    out = alg.gigpo_advantages(TWO_IDS, TWO_ANCHORS, TWO_REWARDS, gamma=0.5)
    assert _lists(out.step_returns) == [[0.125, 0.25, 0.5, 1.0], [0.0, 0.0], [0.5, 1.0], [0.0, 0.0]]
    step = _lists(out.step)
    assert step[0] == pytest.approx([-0.083333, 0.0, 0.291667, 0.0], abs=1e-5)
    assert step[1] == pytest.approx([-0.208333, 0.0], abs=1e-5)
    assert step[2] == pytest.approx([0.25, 0.5]) and step[3] == pytest.approx([-0.25, -0.5])
    adv = _lists(out.advantages)
    assert adv[0] == pytest.approx([0.416667, 0.5, 0.791667, 0.5], abs=1e-5)
    assert adv[1] == pytest.approx([-0.708333, -0.5], abs=1e-5)
    assert adv[2] == pytest.approx([0.75, 1.0]) and adv[3] == pytest.approx([-0.75, -1.0])
    # Anchor groups: a -> A(3), B(1), G(1), C(1); b -> A(2), B(2). Ids follow first appearance.
    assert out.anchor_ids == [[0, 1, 0, 2], [0, 3], [4, 5], [4, 5]]
    assert out.anchor_group_sizes == [3, 1, 1, 1, 2, 2]
    assert out.stats["gigpo/anchor_groups"] == 6.0
    assert out.stats["gigpo/anchor_groups_nonsingleton"] == 3.0
    assert out.stats["gigpo/anchor_group_size_max"] == 3.0
    assert out.stats["gigpo/anchor_group_size_mean"] == pytest.approx(10 / 6)
    assert out.stats["gigpo/steps_in_shared_anchor"] == pytest.approx(0.7)
    assert out.stats["gigpo/steps"] == 10.0


def test_gamma_one_and_gamma_095_and_omega() -> None:
    # gamma 1: tau1 returns [1, 1, 1, 1]; anchor A in group a = {1, 1, 0}, mean 2/3 -> [1/3, 1/3, -2/3].
    one = alg.gigpo_advantages(TWO_IDS, TWO_ANCHORS, TWO_REWARDS, gamma=1.0)
    assert one.step_returns[0].tolist() == [1.0] * 4
    assert one.step[0].tolist() == pytest.approx([1 / 3, 0, 1 / 3, 0], abs=1e-6)
    assert one.step[1][0].item() == pytest.approx(-2 / 3, abs=1e-6)
    # gamma 0.95: tau1 returns [0.857375, 0.9025, 0.95, 1]; A = {0.857375, 0.95, 0}, mean 0.602458.
    g95 = alg.gigpo_advantages(TWO_IDS, TWO_ANCHORS, TWO_REWARDS, gamma=0.95)
    assert g95.step_returns[0].tolist() == pytest.approx([0.857375, 0.9025, 0.95, 1.0], abs=1e-6)
    assert [g95.step[0][0].item(), g95.step[0][2].item(), g95.step[1][0].item()] == pytest.approx(
        [0.254917, 0.347542, -0.602458], abs=1e-5)
    # gamma 0: returns are the raw rewards, so every member of group a's A (reward 0) ties: A^S = 0.
    zero = alg.gigpo_advantages(TWO_IDS, TWO_ANCHORS, TWO_REWARDS, gamma=0.0)
    assert zero.step[0][0].item() == 0.0 and zero.step[2].tolist() == [0.0, 1.0 - 0.5]
    # omega weighs the step part only.
    for omega in (0.0, 2.0):
        w = alg.gigpo_advantages(TWO_IDS, TWO_ANCHORS, TWO_REWARDS, gamma=0.95, omega=omega)
        expected = [e + omega * s for e, s in zip(_flat(g95.episode), _flat(g95.step))]
        assert _flat(w.advantages) == pytest.approx(expected, abs=1e-6)


def test_all_singleton_anchors_reduce_to_grpo() -> None:
    # Keys that carry history never repeat, so every anchor group is a singleton: A^S = 0 and A = the GRPO
    # episode advantage.
    anchors = [[f"{i}:{t}" for t in range(len(r))] for i, r in enumerate(TWO_REWARDS)]
    for mode, estimator in (("mean_norm", "mean_norm"), ("mean_std_norm", "grpo")):
        out = alg.gigpo_advantages(TWO_IDS, anchors, TWO_REWARDS, mode=mode)  # type: ignore[arg-type]
        assert all(t.abs().sum().item() == 0.0 for t in out.step)
        grpo = alg.group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), TWO_IDS, mode=estimator)
        assert [t[0].item() for t in out.advantages] == pytest.approx(grpo.tolist(), abs=1e-6)
        assert out.stats["gigpo/steps_in_shared_anchor"] == 0.0
        assert out.stats["gigpo/anchor_groups_nonsingleton"] == 0.0


def test_identical_returns_in_an_anchor_group_give_zero_in_mean_std_norm() -> None:
    out = alg.gigpo_advantages(["g", "g"], [["s", "x"], ["s", "y"]], [[0, 0], [0, 0]], mode="mean_std_norm")
    assert _flat(out.advantages) == [0.0] * 4  # 0 / (0 + eps), no NaN


def test_singleton_task_group_project_and_verl_conventions() -> None:
    out = alg.gigpo_advantages(["only"], [["s", "t"]], [[0, 1]])
    assert out.episode[0].tolist() == [0.0, 0.0]  # project: one sample says nothing
    raw = alg.gigpo_advantages(["only"], [["s", "t"]], [[0, 1]], singleton="raw")
    assert raw.episode[0].tolist() == [1.0, 1.0]  # verl: mean 0, std 1 -> A^E = R


def test_similarity_grouping_is_greedy_against_each_clusters_representative() -> None:
    # ratio("aaaa", "aaab") = 2*3/8 = 0.75 joins; ratio("aaaa", "aabb") = 0.5 opens a new cluster even though
    # ratio("aaab", "aabb") = 0.75: only the representative (first member) is compared.
    assert alg.anchor_groups(["aaaa", "aaab", "aabb"], similarity_thresh=0.75) == [0, 0, 1]
    assert alg.anchor_groups(["aaaa", "aaab", "aabb"]) == [0, 1, 2]
    assert alg.anchor_groups(["x", "y", "x"]) == [0, 1, 0]
    # "page A?q=1" vs "page A?q=2": ratio 18/20 = 0.9 -> one anchor group at thresh 0.9, two when exact.
    anchors, rewards = [["page A?q=1", "end"], ["page A?q=2", "other"]], [[0, 1], [0, 0]]
    similar = alg.gigpo_advantages(["g", "g"], anchors, rewards, gamma=0.5, similarity_thresh=0.9)
    assert [similar.step[0][0].item(), similar.step[1][0].item()] == pytest.approx([0.25, -0.25])
    exact = alg.gigpo_advantages(["g", "g"], anchors, rewards, gamma=0.5)
    assert [exact.step[0][0].item(), exact.step[1][0].item()] == [0.0, 0.0]
    with pytest.raises(ConfigError, match="str keys"):
        alg.gigpo_advantages(["g"], [[("tuple", 1)]], [[0]], similarity_thresh=0.9)


def test_empty_inputs() -> None:
    out = alg.gigpo_advantages([], [], [])
    assert out.advantages == [] and out.anchor_group_sizes == [] and out.stats["gigpo/anchor_groups"] == 0.0
    assert out.stats["gigpo/steps_in_shared_anchor"] == 0.0
    # A trajectory with no steps has nothing to train; its siblings are unaffected by it.
    part = alg.gigpo_advantages(["g", "g", "g"], [["s"], [], ["s"]], [[1], [], [0]])
    assert [t.shape[0] for t in part.advantages] == [1, 0, 1]
    assert part.advantages[0].item() == pytest.approx(0.5 + 0.5)


def test_bad_inputs_say_how_to_fix_them() -> None:
    with pytest.raises(ConfigError, match="one entry per trajectory"):
        alg.gigpo_advantages(["g"], [["s"], ["s"]], [[0], [0]])
    with pytest.raises(ConfigError, match="one of each per step"):
        alg.gigpo_advantages(["g"], [["s", "t"]], [[0]])
    with pytest.raises(ConfigError, match="validity"):
        alg.gigpo_advantages(["g"], [["s"]], [[0]], valid=[[True, False]])
    with pytest.raises(ConfigError, match="gamma"):
        alg.gigpo_advantages(["g"], [["s"]], [[0]], gamma=1.5)
    with pytest.raises(ConfigError, match="mode"):
        alg.gigpo_advantages(["g"], [["s"]], [[0]], mode="grpo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="finite"):
        alg.gigpo_advantages(["g"], [["s"]], [[float("nan")]])
    with pytest.raises(ConfigError, match="similarity_thresh"):
        alg.gigpo_advantages(["g"], [["s"]], [[0]], similarity_thresh=0.0)
    with pytest.raises(ConfigError, match=">= 0"):
        alg.gigpo_advantages(["g"], [["s"]], [[0]], invalid_penalty=-0.1)
    with pytest.raises(ConfigError, match="hashable"):
        alg.gigpo_advantages(["g"], [[["unhashable"]]], [[0]])
    assert issubclass(ConfigError, ValueError)


def test_broadcast_steps_to_tokens() -> None:
    steps = [torch.tensor([0.4, -0.5]), torch.tensor([1.5])]
    turn_index = torch.tensor([[-1, 0, 0, -1, 1, -1], [-1, -1, 0, 0, -1, -1]])
    tokens = alg.broadcast_steps_to_tokens(steps, turn_index)
    assert torch.allclose(tokens, torch.tensor([[0, 0.4, 0.4, 0, -0.5, 0], [0, 0, 1.5, 1.5, 0, 0]]))
    with pytest.raises(ConfigError, match="step 1"):
        alg.broadcast_steps_to_tokens([torch.tensor([0.4])], torch.tensor([[0, 1]]))
    with pytest.raises(ConfigError, match="integer"):
        alg.broadcast_steps_to_tokens(steps, turn_index.float())
