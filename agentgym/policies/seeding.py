"""Reproducible sampling: one random stream per row of a batch, derived from that row's seed alone.

A request's samples must not depend on which other requests happened to share its batch (a timing accident in a
concurrent rollout), or ``agentgym eval --seed`` would not repeat. Every sampler (HFPolicy, VLLMPolicy, the
OpenAI-compatible server) derives its rows' streams here, so one seed means the same tokens in each of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

__all__ = ["row_seeds", "row_uniforms"]


def row_seeds(seeds: Sequence[int | None]) -> list[int | None]:
    """One random stream per row, derived from the row's own seed and nothing else in the batch.

    Row i's stream is seeded from its seed and from how many earlier rows of the call carry the same seed:
    identical requests with one seed (a GRPO group, ``n`` choices of one server request) still sample
    independently, and requests with distinct seeds (the rollout engine derives one per episode and turn) sample
    the same tokens in any batch. Rows without a seed stay unseeded.
    """
    seen: dict[int, int] = {}
    out: list[int | None] = []
    for seed in seeds:
        if seed is None:
            out.append(None)
            continue
        k = seen.get(seed, 0)
        seen[seed] = k + 1
        digest = hashlib.sha256(f"{seed}:{k}".encode()).digest()
        out.append(int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF)
    return out


def row_uniforms(streams: Sequence[int | None], steps: int, device: Any) -> Any:
    """``[rows, steps]`` uniform numbers in [0, 1): row i's from the generator seeded with ``streams[i]`` (a
    :func:`row_seeds` result; ``None``: the global generator)."""
    import torch

    rows = []
    for seed in streams:
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        rows.append(torch.rand(steps, generator=generator, dtype=torch.float64))
    return torch.stack(rows).to(device) if rows else torch.zeros((0, steps), dtype=torch.float64, device=device)
