"""Built-in models that run offline on a CPU.

The tiny model (:mod:`agentgym.models.tiny`) is a small Llama/Qwen2-architecture network built from a
config, with a byte-level, digit-level BPE tokenizer trained locally and a ChatML chat template. It lets
every test, quickstart and learning experiment run without downloading anything from a model hub.
The tiny VLM (:mod:`agentgym.models.tiny_vlm`) is its LLaVA-architecture counterpart for image observations.
torch and transformers are imported only when a function here is called, so ``import agentgym.models``
stays light.
"""

from __future__ import annotations

from agentgym.models.tiny import (
    TinyModelConfig,
    build_tiny_model,
    create_model,
    default_corpus,
    load_tiny_model,
    train_tokenizer,
)
from agentgym.models.tiny_vlm import TinyVLMConfig, build_tiny_vlm, create_tiny_vlm

__all__ = [
    "TinyModelConfig", "TinyVLMConfig", "build_tiny_model", "build_tiny_vlm", "create_model", "create_tiny_vlm",
    "default_corpus", "load_tiny_model", "train_tokenizer",
]
