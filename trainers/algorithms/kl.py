"""Per-token KL estimators between the current policy and a frozen reference (k1 and k3, as in verl).

The default is ``kl_coef = 0`` (no reference model, as in ARPO, SimpleTIR and Mini-o3); GiGPO uses k3 in the loss
with 0.01.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from agentgym.errors import ConfigError

from ._common import check_choice

__all__ = ["K3_CLAMP", "kl_penalty"]

KLEstimator = Literal["k1", "k3"]

#: verl's ``low_var_kl`` clamps the k3 value to ``[-K3_CLAMP, K3_CLAMP]``.
K3_CLAMP = 10.0
_LOG_RATIO_CLAMP = 20.0


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from the sampled tokens' log-probs.

    * ``"k1"``: ``logp - ref_logp``. Unbiased but high variance and can be negative per token; it is
      the form used when the KL is folded into the reward.
    * ``"k3"`` (verl ``low_var_kl``): with ``d = ref_logp - logp``, ``exp(d) - d - 1``, which is
      always >= 0 and has low variance. Clamped to ``[-10, 10]`` (:data:`K3_CLAMP`) as in verl, so
      one token with a huge log-ratio cannot dominate the loss. ``d`` is first clamped to
      ``[-20, 20]``, which never changes the clamped value but keeps ``exp`` finite, so gradients
      stay finite.

    Reduce the result with ``aggregate_loss`` and the same mask and mode as the policy loss.

    Args:
        logp: ``[N, L]`` (any shape) log-probs under the current policy.
        ref_logp: Same shape, log-probs under the frozen reference; detached.
        estimator: ``"k1"`` or ``"k3"``.

    Returns:
        Tensor of ``logp``'s shape.

    Raises:
        ConfigError: on mismatched shapes or an unknown estimator.
    """
    if not isinstance(logp, Tensor) or not isinstance(ref_logp, Tensor):
        raise ConfigError("logp and ref_logp must both be torch tensors.")
    if logp.shape != ref_logp.shape:
        raise ConfigError(
            f"ref_logp has shape {tuple(ref_logp.shape)} but logp has {tuple(logp.shape)}; "
            "compute both on the same padded token layout."
        )
    check_choice("estimator", estimator, ("k1", "k3"))
    ref = ref_logp.detach().to(device=logp.device, dtype=logp.dtype)
    if estimator == "k1":
        return logp - ref
    d = (ref - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
