"""The built-in tiny vision-language model: a LLaVA-architecture network built from a config, fully offline.

Why: the multimodal path (image content parts, processor-expanded image tokens, pixel values in sampling and in
the training forward pass) needs a real vision-language model in tests and on a CPU, and nothing may be
downloaded. LLaVA is the simplest real VLM architecture transformers ships: a CLIP vision tower, a projector
and a causal LM whose input embeddings at ``<image>`` tokens are replaced by the projected image features, with
plain 1-D positions. The tokenizer is the tiny model's locally trained BPE tokenizer plus one special
``<image>`` token, and the processor a ``LlavaProcessor`` (a CLIP image processor that resizes every image to
``image_size`` pixels square, so each image becomes ``(image_size / patch_size)**2`` tokens).

The directory written by :func:`build_tiny_vlm` loads with ``AutoProcessor`` /
``AutoModelForImageTextToText`` and with :meth:`agentgym.policies.hf.HFPolicy.from_pretrained`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.models.tiny import IM_END, _require, default_corpus, quiet_progress_bars, train_tokenizer

__all__ = ["IMAGE_TOKEN", "VLM_CHAT_TEMPLATE", "TinyVLMConfig", "build_tiny_vlm", "create_tiny_vlm"]

IMAGE_TOKEN = "<image>"

#: ChatML with content parts: ``text`` parts as text, ``image`` parts as the ``<image>`` placeholder that the
#: processor expands to the image's tokens.
VLM_CHAT_TEMPLATE = (
    r"{%- for message in messages -%}"
    r"{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}"
    r"{%- if message['content'] is string -%}{{- message['content'] -}}"
    r"{%- elif message['content'] -%}"
    r"{%- for part in message['content'] -%}"
    r"{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    r"{%- elif part['type'] == 'image' -%}{{- '<image>' -}}{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- endif -%}"
    r"{{- '<|im_end|>\n' -}}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class TinyVLMConfig:
    """Shape of the tiny VLM.

    Attributes:
        hidden_size: Width of the language model.
        num_layers: Language model blocks.
        num_heads: Attention heads of the language model (the head size must be even).
        intermediate_size: MLP width of the language model.
        vision_hidden_size: Width of the CLIP vision tower.
        vision_layers: Blocks of the vision tower.
        image_size: Side of the square every image is resized to.
        patch_size: Side of a vision patch; ``(image_size / patch_size)**2`` tokens per image.
        vocab_size: Target BPE vocabulary size (the ``<image>`` token comes on top).
        max_position_embeddings: Longest sequence.
        seed: Seed of the weight initialisation.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    vision_hidden_size: int = 32
    vision_layers: int = 1
    image_size: int = 28
    patch_size: int = 14
    vocab_size: int = 400
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vision_hidden_size",
                     "vision_layers", "image_size", "patch_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"TinyVLMConfig.{name} must be a positive integer, got {value!r}.")
        if self.image_size % self.patch_size:
            raise ConfigError(f"TinyVLMConfig.image_size ({self.image_size}) must be a multiple of patch_size "
                              f"({self.patch_size}): the vision tower cuts the image into whole patches.")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ConfigError(f"TinyVLMConfig.hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) must be "
                              "an even integer (rotary embeddings rotate pairs of dimensions).")


def _processor(tokenizer: Any, config: TinyVLMConfig) -> Any:
    transformers = _require("transformers")
    _require("PIL")  # the CLIP image processor's backend without torchvision
    image_cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    image_processor = image_cls(size={"shortest_edge": config.image_size},
                                crop_size={"height": config.image_size, "width": config.image_size})
    return transformers.LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=config.patch_size,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=VLM_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )


def create_tiny_vlm(texts: Iterable[str] | None = None, config: TinyVLMConfig = TinyVLMConfig()) -> tuple[Any, Any]:
    """``(model, processor)``, freshly initialised in memory (same config, same weights; global RNG untouched).

    Raises:
        DependencyNotInstalled: If torch, transformers, tokenizers or pillow is missing.
    """
    torch = _require("torch")
    transformers = _require("transformers")
    corpus = default_corpus() + list(texts or ())
    tokenizer = train_tokenizer(corpus, config.vocab_size)
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    tokenizer.model_max_length = config.max_position_embeddings
    processor = _processor(tokenizer, config)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    vision = transformers.CLIPVisionConfig(
        hidden_size=config.vision_hidden_size, intermediate_size=2 * config.vision_hidden_size,
        num_hidden_layers=config.vision_layers, num_attention_heads=2, image_size=config.image_size,
        patch_size=config.patch_size, projection_dim=config.vision_hidden_size,
    )
    text = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
        intermediate_size=config.intermediate_size, max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_id,
    )
    model_config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default", vision_feature_layer=-1, tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = transformers.LlavaForConditionalGeneration(model_config)
    model.generation_config = transformers.GenerationConfig(eos_token_id=[eos_id], pad_token_id=tokenizer.pad_token_id)
    return model.float().eval(), processor


def build_tiny_vlm(output_dir: str | Path, *, texts: Iterable[str] | None = None,
                   config: TinyVLMConfig = TinyVLMConfig()) -> Path:
    """Build the tiny VLM and save model, tokenizer and processor as one Hugging Face directory.

    Returns:
        The directory, loadable with ``HFPolicy.from_pretrained`` (which finds the processor) or
        ``AutoProcessor`` / ``AutoModelForImageTextToText``.
    """
    out = Path(output_dir)
    model, processor = create_tiny_vlm(texts, config)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_progress_bars():
        model.save_pretrained(out)
        processor.save_pretrained(out)
    return out
