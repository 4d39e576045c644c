"""What a vision-language model needs next to its token ids: its image placeholder token and pixel tensors.

A VLM's prompt holds, for each image, a run of placeholder tokens that the model replaces with the image's
features; the pixels travel separately as the image processor's tensors. The sampler
(:class:`~agentgym.policies.hf.HFPolicy`), the model loaders (:mod:`agentgym.models.loading`) and the trainers'
scoring pass all read these facts the same way, so they live here, below policies and trainers. torch is imported
only when pixels are made, so importing this module stays light.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError, DependencyNotInstalled
from agentgym.utils.images import ImageRef

__all__ = ["image_token_id", "image_token_spans", "is_vision_model_dir", "pixel_inputs"]


def is_vision_model_dir(directory: str | Path) -> bool:
    """Whether a model directory holds a vision-language model (a saved processor with an image processor)."""
    directory = Path(directory)
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = directory / name
        if file.is_file():
            try:
                data = json.loads(file.read_text())
            except (OSError, ValueError):
                return False
            return "image_processor" in data or "image_processor_type" in data or "image_mean" in data
    return False


def image_token_id(processor: Any, model: Any) -> int:
    """The id of the placeholder token the model replaces with image features.

    ``processor`` may be ``None``: then only the model's config is read, as M-RoPE positions do.

    Raises:
        ConfigError: Neither the processor nor the model's config names an image token.
    """
    config = getattr(model, "config", None)
    for source, name in ((processor, "image_token_id"), (config, "image_token_id"), (config, "image_token_index")):
        value = getattr(source, name, None)
        if isinstance(value, int):
            break
    else:
        token = getattr(processor, "image_token", None)
        value = processor.tokenizer.convert_tokens_to_ids(token) if token else None
    if not isinstance(value, int):
        owner = type(processor).__name__ if processor is not None else f"{type(model).__name__}'s config"
        raise ConfigError(f"Cannot find the image token of {owner}; HFPolicy reads images with processors and models "
                          "that name one (image_token_id: LLaVA-style, Idefics3/SmolVLM, Qwen2-VL).")
    return int(value)


def image_token_spans(ids: Sequence[int], image_token_id: int, count: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each of ``count`` images' placeholder runs in ``ids``.

    Runs of the image token are split per image: one run per image when the template separates them, else an
    even split of adjacent runs (models with a fixed number of tokens per image).

    Raises:
        AgentGymError: The ids hold no placeholders for the images, or a number that does not split.
    """
    runs: list[list[int]] = []
    for i, token in enumerate(ids):
        if token == image_token_id:
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
    if len(runs) == count:
        return [(a, b) for a, b in runs]
    total = sum(b - a for a, b in runs)
    if count and total % count == 0 and total:
        per = total // count
        spans = []
        for a, b in runs:
            if (b - a) % per:
                break
            spans += [(s, s + per) for s in range(a, b, per)]
        else:
            return spans
    raise AgentGymError(f"The prompt holds {total} image tokens in {len(runs)} run(s) for {count} image(s); the ids "
                        "must come from the model's processor (ChatAgent with policy.processor), one expansion per "
                        "image.")


def pixel_inputs(processor: Any, images: Sequence[ImageRef], device: Any = None, dtype: Any = None) -> dict[str, Any]:
    """The image processor's tensors for ``images`` in order: what a VLM's forward takes next to the ids
    (``pixel_values``, plus e.g. ``pixel_attention_mask`` or ``image_sizes`` where the model uses them).

    Raises:
        DependencyNotInstalled: torch is missing.
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyNotInstalled("torch", "train", "image inputs of a vision-language model") from exc
    out = processor.image_processor(images=[image.array() for image in images], return_tensors="pt")
    tensors = {}
    for key, value in dict(out).items():
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and dtype is not None:
                value = value.to(dtype)
            tensors[key] = value.to(device) if device is not None else value
    return tensors
