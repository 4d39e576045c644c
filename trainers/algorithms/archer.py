"""ArCHer (Zhou et al., 2024, arXiv 2402.19446) and its online filtered-BC baseline as pure torch functions.

ArCHer splits credit assignment in two: an utterance-level critic (double Q and V heads, target copies
updated by Polyak averaging) learns by TD from a replay buffer of turns, and a token-level actor takes a
REINFORCE step in which every token of a freshly sampled utterance gets that utterance's advantage
``min(Q1, Q2)(s, a) - min(V1, V2)(s)``. The functions below are the whole of that math; the trainer in
:mod:`agentgym.trainers.archer` only feeds them tensors.

Where this departs from the reference code, and why: TD targets stop at *termination* and bootstrap through
*truncation*, because a time limit is not an end state (``bootstrap_truncated=False`` restores the reference
code's ``done`` behaviour); gradients are averaged over micro-batches, not summed, so ``lr`` means the same
whatever ``grad_accum_steps`` is; there is no token-level baseline, since the paper's optional one is only a
stub in the released code. :func:`sampled_baseline_advantage` is an option beside the reference advantage: the
learned V replaced, in the actor only, by the other fresh utterances' Q at the same state.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_mask, check_vector

__all__ = [
    "archer_actor_loss",
    "archer_critic_loss",
    "explained_variance",
    "filtered_bc_selection",
    "polyak_update",
    "sampled_baseline_advantage",
    "td_targets",
    "utterance_advantage",
]


def td_targets(rewards: Tensor, next_values: Tensor, terminated: Tensor, truncated: Tensor | None = None, *,
               gamma: float, bootstrap_truncated: bool = True) -> Tensor:
    """Q-head regression targets ``y = r + gamma * (1 - end) * Vbar(s')`` (no gradient).

    ``end`` is ``terminated`` (the episode reached an end state, so nothing follows). A ``truncated``
    transition (turn or context limit: stopped from outside) bootstraps from ``Vbar(s')`` like any other,
    unless ``bootstrap_truncated=False`` (the reference code's behaviour, where a time limit counts as done).

    Args:
        rewards: ``[B]`` step rewards.
        next_values: ``[B]`` or ``[K, B]`` target-critic values of the next state (``K`` = number of V heads;
            each Q head regresses onto its own target V head, as in ArCHer's code).
        terminated: ``[B]`` bool/0-1.
        truncated: ``[B]`` bool/0-1 (``None``: no truncations).
        gamma: Discount in ``[0, 1]``.
        bootstrap_truncated: Bootstrap through truncations (the default) or stop there (reference code).

    Returns:
        Targets of ``next_values``' shape, detached.
    """
    if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
        raise ConfigError(f"gamma must be a number in [0, 1], got {gamma!r}.")
    check_vector("rewards", rewards)
    n = rewards.shape[0]
    check_vector("terminated", terminated, n)
    if next_values.dim() not in (1, 2) or next_values.shape[-1] != n:
        raise ConfigError(f"next_values must be [B] or [K, B] with B={n}, got shape {tuple(next_values.shape)}.")
    end = terminated.to(torch.bool)
    if truncated is not None:
        check_vector("truncated", truncated, n)
        if not bootstrap_truncated:
            end = end | truncated.to(torch.bool)
    dtype = next_values.dtype if next_values.is_floating_point() else torch.float32
    keep = (~end).to(dtype)
    return (rewards.to(dtype) + gamma * keep * next_values.detach().to(dtype)).detach()


def archer_critic_loss(q: Tensor, v: Tensor, q_targets: Tensor, v_targets: Tensor) -> Tensor:
    """Sum over heads of batch-mean squared errors, each head against its own target (ArCHer, Zhou et al., 2024).

    Args:
        q: ``[2, B]`` online ``Q1(s, a), Q2(s, a)`` at the buffer action.
        v: ``[2, B]`` online ``V1(s), V2(s)``.
        q_targets: ``[2, B]`` from :func:`td_targets` with the target V heads.
        v_targets: ``[2, B]`` target ``Qbar_k(s, a_pi)`` at a fresh policy sample.

    Returns:
        Scalar loss ``sum_k MSE(Q_k, y_Q^k) + sum_k MSE(V_k, y_V^k)``.
    """
    for name, x in (("q", q), ("v", v), ("q_targets", q_targets), ("v_targets", v_targets)):
        if x.dim() != 2:
            raise ConfigError(f"{name} must be [K, B] (one row per head), got shape {tuple(x.shape)}.")
    check_mask("q_targets", q_targets, q.shape)
    check_mask("v_targets", v_targets, v.shape)
    q_loss = ((q - q_targets.detach()) ** 2).mean(dim=1).sum()
    v_loss = ((v - v_targets.detach()) ** 2).mean(dim=1).sum()
    return q_loss + v_loss


def utterance_advantage(q: Tensor, v: Tensor) -> Tensor:
    """``A = min(Q1, Q2)(s, a_pi) - min(V1, V2)(s)`` from the *online* critic, detached, unnormalised.

    Args:
        q: ``[2, B]`` (or ``[2]`` for one utterance) Q heads at the freshly sampled utterance.
        v: Same shape, the V heads at the state.

    Returns:
        ``[B]`` (or a scalar) advantages.
    """
    if q.shape != v.shape or q.dim() not in (1, 2) or q.shape[0] < 1:
        raise ConfigError(f"q and v must both be [K] or [K, B] (K heads), got {tuple(q.shape)} and {tuple(v.shape)}.")
    return (q.min(dim=0).values - v.min(dim=0).values).detach()


def sampled_baseline_advantage(q: Tensor, samples_per_state: int) -> Tensor:
    """``A_j = min(Q1, Q2)(s, a_j) - mean_{k != j} min(Q1, Q2)(s, a_k)`` over ``samples_per_state`` fresh utterances
    at each state, detached, unnormalised.

    The reference advantage subtracts the learned ``min(V1, V2)(s)``, which is only as good as the V heads' fit to
    the Q heads at fresh samples. When V lags Q (it regresses onto the *target* Q heads, and ``min`` of two V heads
    is not ``min`` of two Q heads averaged over actions), every utterance of a batch shares one offset, and the
    actor's REINFORCE step then raises (or lowers) whatever it sampled whatever its merit. The leave-one-out mean
    of the other utterances' Q at the same state estimates ``E_{a ~ pi} Q(s, a)`` from the current policy
    itself: it is independent of ``a_j``, so the gradient stays unbiased, and a shared offset cancels exactly.

    Args:
        q: ``[2, B]`` Q heads at ``B = states x samples_per_state`` utterances, each state's samples contiguous.
        samples_per_state: Utterances drawn at each state (>= 2).

    Returns:
        ``[B]`` advantages; each state's sum to 0.
    """
    if q.dim() != 2 or q.shape[0] < 1:
        raise ConfigError(f"q must be [K, B] (K heads), got {tuple(q.shape)}.")
    if samples_per_state < 2 or q.shape[1] % samples_per_state:
        raise ConfigError(f"need >= 2 utterances a state and B ({q.shape[1]}) a multiple of them, got "
                          f"samples_per_state={samples_per_state}.")
    values = q.min(dim=0).values.detach().reshape(-1, samples_per_state)
    others = (values.sum(dim=1, keepdim=True) - values) / (samples_per_state - 1)
    return (values - others).reshape(-1)


def explained_variance(predictions: Tensor, targets: Tensor) -> float:
    """``1 - Var(targets - predictions) / Var(targets)``: how much of the targets' spread a critic explains.

    A diagnostic, not part of any loss: 1 is a perfect fit, 0 is no better than predicting the mean, and
    negative is worse than that. Returns ``nan`` when the targets have no spread (nothing to explain), so a
    batch without any reward never reads as a perfect or a failed critic.

    Args:
        predictions: ``[B]`` critic values (e.g. ``min(Q1, Q2)`` at the buffer actions).
        targets: ``[B]`` what they should predict (e.g. the Monte-Carlo returns stored in the buffer).
    """
    check_vector("predictions", predictions)
    check_vector("targets", targets, predictions.shape[0])
    y, p = targets.detach().double(), predictions.detach().double().to(targets.device)
    spread = float(y.var(unbiased=False)) if y.numel() > 1 else 0.0
    if spread <= 1e-12:
        return float("nan")
    return 1.0 - float((y - p).var(unbiased=False)) / spread


def archer_actor_loss(advantages: Tensor, token_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
    """Token-level REINFORCE with one advantage per utterance: ``-mean_b[A_b * sum_i logp_{b,i}]``.

    Args:
        advantages: ``[B]`` utterance advantages (from :func:`utterance_advantage`; no gradient flows).
        token_logprobs: ``[B, L]`` log-probs of the utterance tokens under the current policy.
        loss_mask: ``[B, L]`` 1 on the utterance's sampled tokens.

    Returns:
        Scalar loss (no importance ratio, no KL, as in ArCHer's actor).
    """
    if token_logprobs.dim() != 2:
        raise ConfigError(f"token_logprobs must be [B, L], got shape {tuple(token_logprobs.shape)}.")
    check_vector("advantages", advantages, token_logprobs.shape[0])
    check_mask("loss_mask", loss_mask, token_logprobs.shape)
    m = loss_mask.to(token_logprobs.dtype)
    per_utterance = (token_logprobs * m).sum(dim=1)
    return -(advantages.detach().to(token_logprobs.dtype) * per_utterance).mean()


@torch.no_grad()
def polyak_update(target: Iterable[Tensor] | torch.nn.Module, online: Iterable[Tensor] | torch.nn.Module,
                  tau: float) -> None:
    """In place: ``theta_bar <- (1 - tau) * theta_bar + tau * theta`` for every parameter pair.

    ``tau = 1`` is a hard copy (done once at initialisation, as ArCHer's target critic is). Buffers (e.g. norm
    statistics) are copied along with parameters when modules are given.
    """
    if not (isinstance(tau, (int, float)) and 0.0 <= tau <= 1.0):
        raise ConfigError(f"tau must be a number in [0, 1], got {tau!r}.")
    if isinstance(target, torch.nn.Module) and isinstance(online, torch.nn.Module):
        target_params, online_params = list(target.parameters()), list(online.parameters())
        for tb, ob in zip(target.buffers(), online.buffers()):
            tb.copy_(ob)
    else:
        target_params, online_params = list(target), list(online)  # type: ignore[arg-type]
    if len(target_params) != len(online_params):
        raise ConfigError(f"target has {len(target_params)} parameters but online has {len(online_params)}; "
                          "the target must be a copy of the online network.")
    for tp, op in zip(target_params, online_params):
        if tp.shape != op.shape:
            raise ConfigError(f"parameter shapes differ: target {tuple(tp.shape)} vs online {tuple(op.shape)}.")
        tp.mul_(1.0 - tau).add_(op.detach(), alpha=tau)


def filtered_bc_selection(returns: Tensor, quantile: float = 0.9, *, skip_if_uniform: bool = True) -> tuple[float, Tensor]:
    """ArCHer's filtered-BC baseline: keep the returns ``>=`` their ``quantile`` (linear interpolation).

    Args:
        returns: ``[N]`` episode returns of every trajectory collected so far (the pool is cumulative).
        quantile: Quantile in ``[0, 1]`` (0.9 in the reference code).
        skip_if_uniform: When every return is equal (no success yet) keep nothing instead of everything,
            so the update is skipped rather than degenerating into BC on the policy's own samples.

    Returns:
        ``(cutoff, keep)``: the cutoff and a ``[N]`` bool mask.
    """
    check_vector("returns", returns)
    if not 0.0 <= quantile <= 1.0:
        raise ConfigError(f"quantile must be in [0, 1], got {quantile!r}.")
    if returns.numel() == 0:
        return float("nan"), torch.zeros(0, dtype=torch.bool)
    r = returns.to(torch.float64)
    cutoff = float(torch.quantile(r, quantile))  # linear interpolation, as numpy's default
    keep = r >= cutoff - 1e-12
    if skip_if_uniform and bool(r.max() == r.min()):
        keep = torch.zeros_like(keep)
    return cutoff, keep
