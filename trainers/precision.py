"""Mixed precision: float32 master weights, bfloat16 arithmetic where it is cheap and harmless.

Why: on the machines this project measures, a bfloat16 matrix product runs several times faster than a float32
one (CPUs with AVX512-BF16 or AMX, and every recent GPU), and a training step of the tiny model is almost all
matrix products. Training the weights themselves in bfloat16 (``dtype: bfloat16``) loses updates smaller than the
format's resolution (8 bits of mantissa: a weight near 0.05 moves in steps of about 2e-4, the size of an Adam step at
a learning rate of 3e-4). Here the weights and the optimizer stay float32; only the policy's forwards run under
``torch.autocast`` (products in bfloat16, norms, softmax and the loss in float32), and sampling runs on a bfloat16
copy of the weights, refreshed after every update as a vLLM engine would be. The sampler's log-probs are then those
of the bfloat16 copy, a little off the float32 forward the update computes: ``train/logprob_mismatch`` reports the
gap, and ``off_policy_correction`` bounds its effect as it does for vLLM.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

from agentgym.utils.procfs import cpu_flags

__all__ = ["MIXED_PRECISION", "forward_precision", "refresh_sampling_copy", "sampling_copy", "slow_bfloat16"]

MIXED_PRECISION = ("no", "bf16")
"""The values of ``mixed_precision``: ``no`` (float32 throughout) and ``bf16``."""


def forward_precision(device: str | torch.device, mixed_precision: str) -> contextlib.AbstractContextManager[Any]:
    """The context the policy's training forwards run in: ``torch.autocast`` to bfloat16 under ``bf16``, else none.

    The backward pass runs outside it (autocast records each op's precision for it)."""
    if mixed_precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def sampling_copy(model: Any, mixed_precision: str) -> Any:
    """A copy of ``model`` to sample with, apart from the trained one: in eval mode, without gradients, in bfloat16
    under ``bf16`` (else in the model's own dtype)."""
    shadow = copy.deepcopy(model).eval()
    if mixed_precision != "no":
        shadow = shadow.to(torch.bfloat16)
    for parameter in shadow.parameters():
        parameter.requires_grad_(False)
    return shadow


def refresh_sampling_copy(shadow: Any, model: Any) -> None:
    """Give ``shadow`` (from :func:`sampling_copy`) the current float32 weights of ``model``, rounded to bfloat16.

    The copy is in place, so every parameter's version counter moves and a policy's cached keys and values of the
    old weights are never reused."""
    with torch.no_grad():
        shadow.load_state_dict(model.state_dict())


def slow_bfloat16(device: str | torch.device) -> str | None:
    """Why bfloat16 products would be slow on ``device`` (a CPU without AVX512-BF16 or AMX: PyTorch then converts
    each product to float32 and back, slower than float32 alone), else ``None``. Unknown CPUs (no
    ``/proc/cpuinfo``) are not judged."""
    if torch.device(device).type != "cpu":
        return None
    flags = cpu_flags()
    if not flags or flags & {"avx512_bf16", "amx_bf16"}:
        return None
    return ("this CPU has no bfloat16 products (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo), so bfloat16 runs "
            "slower than float32 here: set mixed_precision: no")
