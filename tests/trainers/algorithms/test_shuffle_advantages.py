"""The shuffled-advantage control's permutation: the same values, dealt among trained units only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.trainers.algorithms import shuffle_advantages  # noqa: E402


def test_trained_values_are_permuted_among_themselves_and_the_rest_stay() -> None:
    values = torch.tensor([1.0, -2.0, 3.0, 9.0, -4.0, 5.0, 6.0])
    trained = torch.tensor([1, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    out = shuffle_advantages(values, trained, torch.Generator().manual_seed(3))
    assert sorted(out[trained].tolist()) == sorted(values[trained].tolist())  # a permutation: same magnitudes
    assert out[3] == 9.0  # an untrained unit neither lends nor receives a value
    assert not torch.equal(out, values)  # the pairing of value and unit is gone
    again = shuffle_advantages(values, trained, torch.Generator().manual_seed(3))
    assert torch.equal(out, again) and torch.equal(values[3:4], torch.tensor([9.0]))  # seeded; input untouched


def test_empty_and_bad_shapes() -> None:
    assert shuffle_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.bool), torch.Generator()).numel() == 0
    with pytest.raises(ConfigError, match="shape"):
        shuffle_advantages(torch.zeros(3), torch.ones(2, dtype=torch.bool), torch.Generator())
    with pytest.raises(ConfigError, match="1-D"):
        shuffle_advantages(torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool), torch.Generator())
