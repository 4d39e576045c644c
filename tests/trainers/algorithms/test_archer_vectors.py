"""ArCHer and filtered-BC functions against worked examples hand-computed from ArCHer's equations (Zhou et al.,
2024, arXiv 2402.19446), and TD targets that bootstrap through truncation but stop at termination (a time limit
is not an end state, so the value after it still counts)."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.errors import ConfigError
from agentgym.trainers.algorithms import discounted_returns
from agentgym.trainers.algorithms.archer import (
    archer_actor_loss,
    archer_critic_loss,
    explained_variance,
    filtered_bc_selection,
    polyak_update,
    sampled_baseline_advantage,
    td_targets,
    utterance_advantage,
)

TOL = 1e-4


def close(actual: torch.Tensor | float, expected: list | float, tol: float = TOL) -> None:
    a = torch.as_tensor(actual, dtype=torch.float64)
    e = torch.as_tensor(expected, dtype=torch.float64)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert torch.allclose(a, e, atol=tol, rtol=0), (a.tolist(), e.tolist())


def test_t11_td_target_each_head_onto_its_own_target_v() -> None:
    y = td_targets(torch.tensor([0.0]), torch.tensor([[0.8], [0.6]]), torch.tensor([False]), gamma=0.95)
    close(y, [[0.76], [0.57]])


def test_t11_terminal_target_is_the_reward_whatever_vbar() -> None:
    y = td_targets(torch.tensor([1.0]), torch.tensor([[123.0], [-7.0]]), torch.tensor([True]), gamma=0.95)
    close(y, [[1.0], [1.0]])


def test_td_targets_bootstrap_on_truncation_not_on_termination() -> None:
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0])
    vbar = torch.tensor([0.8, 0.8, 0.8, 0.8])
    terminated = torch.tensor([False, True, False, True])
    truncated = torch.tensor([False, False, True, False])
    y = td_targets(rewards, vbar, terminated, truncated, gamma=0.95)
    close(y, [0.76, 0.0, 0.76, 1.0])  # the truncated turn bootstraps like a mid-episode one
    legacy = td_targets(rewards, vbar, terminated, truncated, gamma=0.95, bootstrap_truncated=False)
    close(legacy, [0.76, 0.0, 0.0, 1.0])  # reference code: a time limit counts as done


def test_worked_example_critic_loss() -> None:
    q = torch.tensor([[0.5], [0.6]])
    v = torch.tensor([[0.4], [0.5]])
    yq = torch.tensor([[0.76], [0.57]])
    yv = torch.tensor([[0.7], [0.5]])
    close(archer_critic_loss(q, v, yq, yv), 0.1585)


def test_critic_loss_gradient_reaches_online_heads_only() -> None:
    q = torch.tensor([[0.5], [0.6]], requires_grad=True)
    v = torch.tensor([[0.4], [0.5]], requires_grad=True)
    yq = torch.tensor([[0.76], [0.57]], requires_grad=True)
    archer_critic_loss(q, v, yq, torch.tensor([[0.7], [0.5]])).backward()
    assert q.grad is not None and v.grad is not None and yq.grad is None


def test_t12_advantage_min_q_minus_min_v() -> None:
    close(utterance_advantage(torch.tensor([0.7, 0.9]), torch.tensor([0.6, 0.65])), 0.1)
    batch = utterance_advantage(torch.tensor([[0.7, 0.2], [0.9, 0.1]]), torch.tensor([[0.6, 0.0], [0.65, 0.3]]))
    close(batch, [0.1, 0.1])


def test_sampled_baseline_is_the_leave_one_out_mean_q_at_the_same_state() -> None:
    # two states, two utterances each: min over heads [0.7, 0.5 | 0.2, 0.1], each minus the other's value
    q = torch.tensor([[0.7, 0.9, 0.2, 0.4], [0.8, 0.5, 0.3, 0.1]])
    close(sampled_baseline_advantage(q, 2), [0.2, -0.2, 0.1, -0.1])
    # three at one state: 0.9 - (0.3 + 0.0) / 2 = 0.75, 0.3 - 0.45 = -0.15, 0.0 - 0.6 = -0.6
    close(sampled_baseline_advantage(torch.tensor([[0.9, 0.3, 0.0]] * 2), 3), [0.75, -0.15, -0.6])


def test_sampled_baseline_cancels_an_offset_the_value_baseline_keeps() -> None:
    """A V that lags Q by a constant shifts every reference advantage by it; the sampled baseline does not move."""
    q = torch.tensor([[0.7, 0.9, 0.2, 0.4], [0.8, 0.5, 0.3, 0.1]])
    v = torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1]])
    shifted = utterance_advantage(q, v) - utterance_advantage(q + 0.5, v)
    close(shifted, [-0.5] * 4)
    close(sampled_baseline_advantage(q + 0.5, 2), sampled_baseline_advantage(q, 2).tolist())
    close(sampled_baseline_advantage(q, 4).sum(), 0.0)


def test_sampled_baseline_rejects_groups_that_do_not_fit() -> None:
    with pytest.raises(ConfigError, match=">= 2 utterances"):
        sampled_baseline_advantage(torch.zeros(2, 4), 1)
    with pytest.raises(ConfigError, match="multiple"):
        sampled_baseline_advantage(torch.zeros(2, 5), 2)
    with pytest.raises(ConfigError, match=r"\[K, B\]"):
        sampled_baseline_advantage(torch.zeros(4), 2)


def test_t13_actor_loss() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the 4th position is padding
    loss = archer_actor_loss(torch.tensor([0.1]), logp, mask)
    close(loss, 0.35)
    loss.backward()
    close(logp.grad, [[-0.1, -0.1, -0.1, 0.0]])


def test_actor_loss_is_a_batch_mean() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    close(archer_actor_loss(torch.tensor([0.1, -1.0]), logp, mask), (0.35 - 1.0) / 2)


def test_t14_polyak() -> None:
    target, online = [torch.tensor([1.0])], [torch.tensor([2.0])]
    polyak_update(target, online, 0.1)
    close(target[0], [1.1])


def test_polyak_on_modules_and_hard_copy() -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    polyak_update(a, b, 1.0)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ConfigError):
        polyak_update(a, b, 1.5)


def test_t15_mc_returns() -> None:
    close(discounted_returns(torch.tensor([0.0, 0.0, 1.0]), 0.95), [0.9025, 0.95, 1.0])
    close(discounted_returns(torch.tensor([0.0, 0.0, 1.0]), 0.5), [0.25, 0.5, 1.0])


def test_t16_filtered_bc_cutoff() -> None:
    cutoff, keep = filtered_bc_selection(torch.tensor([0, 1, 0, 0, 1, 0, 0, 0, 0, 2], dtype=torch.float32))
    assert cutoff == pytest.approx(1.1, abs=TOL)
    assert keep.nonzero().flatten().tolist() == [9]


def test_filtered_bc_binary_rewards_keep_only_successes_and_uniform_pool_is_skipped() -> None:
    _, keep = filtered_bc_selection(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert keep.tolist() == [False, True, False, False]
    cutoff, keep = filtered_bc_selection(torch.zeros(5))
    # no update on a uniform pool: cloning every sample would be plain BC on the policy's own outputs
    assert cutoff == 0.0 and not keep.any()
    _, keep = filtered_bc_selection(torch.zeros(5), skip_if_uniform=False)
    assert keep.all()  # reference behaviour: plain BC on every sample


def test_explained_variance_of_a_critic_against_returns() -> None:
    returns = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert explained_variance(returns.clone(), returns) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 0.5), returns) == pytest.approx(0.0)  # the mean explains nothing
    assert explained_variance(returns + 3.0, returns) == pytest.approx(1.0)  # an offset is not spread
    assert explained_variance(torch.tensor([0.1, 0.1, 0.9, 0.9]), returns) == pytest.approx(0.96)
    assert explained_variance(1.0 - returns, returns) == pytest.approx(-3.0)  # worse than the mean
    assert math.isnan(explained_variance(torch.tensor([0.2, 0.7]), torch.ones(2)))  # no spread: nothing to explain


def test_bad_inputs_fail_with_config_error() -> None:
    with pytest.raises(ConfigError):
        td_targets(torch.zeros(3), torch.zeros(2), torch.zeros(3, dtype=torch.bool), gamma=0.9)
    with pytest.raises(ConfigError):
        td_targets(torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool), gamma=1.5)
    with pytest.raises(ConfigError):
        archer_actor_loss(torch.zeros(2), torch.zeros(3, 4), torch.zeros(3, 4))
    with pytest.raises(ConfigError):
        utterance_advantage(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ConfigError):
        explained_variance(torch.zeros(3), torch.zeros(4))
