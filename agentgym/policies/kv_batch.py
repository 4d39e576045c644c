"""Between per-episode KV-cache entries and a batch's transformers cache.

:mod:`agentgym.policies.kv_cache` only stores each episode's keys and values. A decoding batch needs them as
one ``DynamicCache`` whose rows have cached parts of different lengths: each row's part is left padded to the
longest (zeros, hidden by the attention mask). After decoding, each row's keys and values are cut back out of
the batch's cache, padding columns dropped, and stored for the episode's next turn. Both directions assume
plain full-attention layers (:func:`plain_dynamic_layers`); other cache types are recomputed every turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.policies.kv_cache import CachedPrefix, EpisodeKVCache

__all__ = ["batch_cache", "plain_dynamic_layers", "store_rows"]


def plain_dynamic_layers(past: Any) -> list[Any] | None:
    """The layers of ``past`` when each is a plain full-attention ``DynamicLayer`` holding ``[batch, heads, length,
    dim]`` keys and values (what prefix reuse can slice and rebuild), else ``None``."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - older transformers
        return None
    layers = getattr(past, "layers", None)
    if not layers:
        return None
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if type(layer) is not DynamicLayer or keys is None or keys.dim() != 4:
            return None
    return list(layers)


def batch_cache(model: Any, found: Sequence[tuple[int, CachedPrefix | None]], cached_width: int) -> Any:
    """A ``DynamicCache`` holding each row's reused prefix (``found``: per row, how many tokens it reuses and the
    entry they come from), left padded to ``cached_width`` (zeros, masked)."""
    import torch
    from transformers.cache_utils import DynamicCache

    first = next(entry for c, entry in found if c)
    cache = DynamicCache(config=getattr(model, "config", None))
    with torch.inference_mode():  # the stored tensors are inference tensors, made in the decoding loop
        for layer_idx, (k0, v0) in enumerate(first.layers):
            keys = k0.new_zeros((len(found), k0.shape[0], cached_width, k0.shape[2]))
            values = v0.new_zeros((len(found), v0.shape[0], cached_width, v0.shape[2]))
            for i, (c, entry) in enumerate(found):
                if c:
                    k, v = entry.layers[layer_idx]
                    keys[i, :, cached_width - c:] = k[:, :c]
                    values[i, :, cached_width - c:] = v[:, :c]
            cache.update(keys, values, layer_idx)
    return cache


def store_rows(kv_cache: EpisodeKVCache, layers: Sequence[Any], positions: Sequence[int], rows: Any, mask: Any,
               width: int, step: int, prompts: Sequence[Sequence[int]], out_tokens: Any, num_generated: Any,
               episodes: Sequence[str]) -> None:
    """Store, for the rows at ``positions`` of the live batch, the keys and values of their prompt and sampled
    tokens without the padding columns, for the next turn of their episodes.

    ``layers`` are the batch cache's :func:`plain_dynamic_layers`. After the forward pass of step ``step`` the
    cache holds ``width + step`` columns; a row's j-th sampled token was fed at step j + 1, so the first
    ``min(n, step)`` of its n sampled tokens are covered (the last one usually is not: nothing was fed after it).
    """
    import torch

    counts = num_generated.tolist()
    for pos in positions:
        row = int(rows[pos])
        if not episodes[row]:
            continue
        k = min(counts[row], step)
        cols = mask[pos, :width].nonzero().squeeze(-1)
        if cols.numel() != len(prompts[row]):  # pragma: no cover - the mask always covers the prompt exactly
            continue
        cols = torch.cat([cols, torch.arange(width, width + k, device=cols.device)])
        ids = tuple(prompts[row]) + tuple(out_tokens[row, :k].tolist())
        kv = tuple((layer.keys[pos][:, cols], layer.values[pos][:, cols]) for layer in layers)
        kv_cache.store(episodes[row], CachedPrefix(ids, kv))
