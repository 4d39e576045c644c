"""A model's shape facts that the sampler and the trainers must agree on: vocabulary size and position ids.

Trainers recompute the log-probs the sampler (:class:`~agentgym.policies.hf.HFPolicy`) recorded; they match
only when both feed every token at the same position. Positions are counted along the attention mask for
1-D rotary models, and come from the model's own ``get_rope_index`` for models with 3-D multimodal rotary
positions (M-RoPE: Qwen2-VL, Qwen2.5-VL), whose image tokens sit on a grid. Both callers take them from here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

from agentgym.models.vision import image_token_id

__all__ = ["mrope_positions", "mrope_suffix_positions", "rope_index_fn", "rope_position_ids", "vocab_size"]


def vocab_size(model: Any) -> int:
    """The output vocabulary size (a VLM's config keeps it in its text config)."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "vocab_size", None) or model.get_output_embeddings().out_features)


def rope_index_fn(model: Any) -> Any:
    """The model's own 3-D position computation (``get_rope_index``, Qwen2-VL style M-RoPE), or ``None``."""
    for owner in (getattr(model, "model", None), model):
        fn = getattr(owner, "get_rope_index", None)
        if callable(fn):
            return fn
    return None


@functools.lru_cache(maxsize=16)
def _marks_image_tokens(fn: Any) -> bool:
    """Whether a ``get_rope_index`` takes ``mm_token_type_ids`` (read once per function, not once per row)."""
    try:
        return "mm_token_type_ids" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic callables
        return False


def mrope_positions(model: Any, input_ids: Any, attention_mask: Any, image_grid_thw: Any) -> Any:
    """``[3, N, L]`` M-RoPE positions of ``input_ids`` from the model's own ``get_rope_index``.

    ``image_grid_thw`` lists the images of all rows in row order (what the image processor returns with the pixel
    values); padding (``attention_mask`` 0) gets position 0. Why the model's function and not a copy: the layout
    of vision positions differs between model versions (Qwen2-VL, Qwen2.5-VL), and the model is the reference.
    """
    fn = rope_index_fn(model)
    kwargs: dict[str, Any] = {"image_grid_thw": image_grid_thw, "attention_mask": attention_mask}
    if _marks_image_tokens(getattr(fn, "__func__", fn)):  # newer transformers: image tokens marked (text 0, image 1)
        kwargs["mm_token_type_ids"] = (input_ids == image_token_id(None, model)).int()
    positions, _ = fn(input_ids, **kwargs)
    return positions


def mrope_suffix_positions(model: Any, prompts: Sequence[Sequence[int]], cached: Sequence[int], suffix_width: int,
                           grids: Sequence[Any], device: Any) -> tuple[Any, Any]:
    """``([3, B, suffix_width], [B])``: M-RoPE positions of the prompt tokens a decoding pass computes (each row's
    prompt after its ``cached`` prefix, left padded to ``suffix_width``), and each row's first generated position.

    Each row's positions come from its whole prompt (the cached prefix's images shift the text after them, so
    ``grids`` holds each row's stacked ``image_grid_thw``, or ``None`` for a row without images), then the computed
    part is sliced out. Padding repeats the last cached position, so positions never decrease along a row.
    Generated tokens are text: all three components continue from the prompt's largest position plus one, as in
    the model's own ``generate``.
    """
    import torch

    positions = torch.zeros((3, len(prompts), suffix_width), dtype=torch.long, device=device)
    next_pos = torch.empty(len(prompts), dtype=torch.long, device=device)
    for i, (prompt, c, row_grids) in enumerate(zip(prompts, cached, grids)):
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        full = mrope_positions(model, ids, None, row_grids)[:, 0]
        s = len(prompt) - c
        positions[:, i, suffix_width - s:] = full[:, c:]
        if c and s < suffix_width:
            positions[:, i, : suffix_width - s] = full[:, c - 1: c]
        next_pos[i] = full.max() + 1
    return positions, next_pos


def rope_position_ids(model: Any, input_ids: Any, attention_mask: Any, vision: Any = None) -> Any:
    """Position ids for a training forward pass over right- or left-padded rows.

    ``[N, L]`` positions counted along the mask, or, for a model with multimodal rotary positions (Qwen2-VL)
    whose batch holds images (``vision`` with ``image_grid_thw``), ``[3, N, L]`` from the model's own
    ``get_rope_index``: the positions the sampler used (:class:`~agentgym.policies.hf.HFPolicy`), so the scored
    log-probs match.
    """
    if vision and "image_grid_thw" in vision and rope_index_fn(model) is not None:
        return mrope_positions(model, input_ids, attention_mask, vision["image_grid_thw"])
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
