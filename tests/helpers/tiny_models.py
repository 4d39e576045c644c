"""Tiny models for policy tests whose outputs depend on the whole context.

A freshly initialised tiny model is close to uniform and mostly copies its input, so cache, padding and
backend comparisons on it prove little; larger random weights make every output token context-dependent.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentgym.models.tiny import TinyModelConfig, build_tiny_model, load_tiny_model


#: The small tiny-model shape the trainer tests use (fast on a CPU).
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


def build_small_tiny_model(path: Path, suite: str = "games-calc", demonstrations: int = 100) -> Path:
    """An untrained :data:`SMALL` tiny model whose tokenizer was trained on ``demonstrations`` of ``suite``."""
    from agentgym.cli.quickstart import demonstration_texts

    return build_tiny_model(path, texts=demonstration_texts(suite, demonstrations), config=SMALL)


def build_maze_tiny_model(path: Path) -> Path:
    """An untrained :data:`SMALL` tiny model whose tokenizer was trained on ``games-maze`` demonstrations."""
    return build_small_tiny_model(path, "games-maze", 40)


def build_context_sensitive_tiny_model(path: Path, config: TinyModelConfig, *, std: float = 0.2) -> Path:
    """Build a tiny model at ``path`` and re-draw its matrices with a larger spread (seeded)."""
    path = build_tiny_model(path, config=config)
    model, _ = load_tiny_model(path)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, std, generator=gen)
    model.save_pretrained(path)
    return path
