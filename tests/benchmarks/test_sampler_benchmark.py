"""The sampler benchmark counts the work a turn needs the way the samplers do it (its floor and FLOP rates rest on it)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sampler  # noqa: E402


def _trajectory(*turns: tuple[int, int]) -> SimpleNamespace:
    """Turns of (prompt tokens added, sampled tokens)."""
    return SimpleNamespace(turns=[SimpleNamespace(prompt_token_ids=[0] * p, action_token_ids=[1] * a) for p, a in turns])


def test_a_turn_computes_its_new_prompt_and_the_previous_reply_s_last_token() -> None:
    # Turn 1: 10 prompt tokens, 3 sampled; the last sampled one is never fed, so 12 columns are cached.
    # Turn 2: that token, 5 new prompt tokens and 1 of its 2 sampled tokens are computed: 7 tokens ending at 19.
    assert sampler.computed_turns([_trajectory((10, 3), (5, 2))]) == [(12, 12), (7, 19)]


def test_attention_flops_count_every_column_each_new_token_sees() -> None:
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2, hidden_size=8, tie_word_embeddings=False),
                            named_parameters=lambda: [("w", SimpleNamespace(dim=lambda: 2, numel=lambda: 100))])
    linear, attention = sampler.flops(model, [_trajectory((10, 3), (5, 2))])
    assert linear == 2 * 100 * (12 + 7)
    # positions 0..11 see 1..12 columns, positions 12..18 see 13..19
    assert attention == pytest.approx(4 * 2 * 8 * (sum(range(1, 13)) + sum(range(13, 20))))
