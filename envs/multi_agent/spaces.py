"""Spaces for text agents in PettingZoo games.

Two facts of PettingZoo's ``api_test`` shape these spaces:

* It compares the numpy ``dtype`` of the observation with the space's, and for a ``Dict`` space it
  only looks under the ``observation`` key; a bare ``str`` observation has no dtype and crashes it. So
  an observation is a dict: ``observation`` (a numeric encoding of exactly what the agent may know, as
  PettingZoo's classic games do), ``action_mask`` (where the game has a fixed action catalogue) and
  ``text`` (the same information rendered for a language model, with the legal moves listed).
* It samples actions with ``action_space(agent).sample(mask)`` whenever an ``action_mask`` is present.
  :class:`CatalogueText` is an honest text space for that: it contains every string (a model may write
  anything), ``sample()`` draws arbitrary Unicode like :class:`~agentgym.spaces.UnicodeText`, and
  ``sample(mask)`` picks an allowed catalogue index and returns that action's canonical text, so the
  test plays real games instead of only bouncing off the parser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from agentgym.spaces import UnicodeText

__all__ = ["CatalogueText", "text_observation_space"]


class CatalogueText(UnicodeText):
    """Any Unicode string, with ``n`` canonical actions addressable by an action mask.

    Args:
        n: Size of the action catalogue (the length of the matching ``action_mask``).
        render: Maps a catalogue index to its canonical action text *in the current game state* (a chess
            move index means different squares in different positions, so rendering is late-bound).
        max_length: Longest string the space contains.
        seed: Seed of the space's own sampler.
    """

    def __init__(self, n: int, render: Callable[[int], str], *, max_length: int = 1_000_000,
                 seed: int | None = None) -> None:
        if n < 1:
            raise ValueError(f"CatalogueText needs a catalogue of at least one action, got n={n}.")
        self.n = int(n)
        self._render = render
        super().__init__(max_length=max_length, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None, *, sample_length: int = 64) -> str:
        """Random Unicode without a mask; with a mask, the canonical text of a random allowed action.

        An all-zero mask (no legal action, e.g. not this agent's turn) falls back to random text, as
        ``Discrete.sample`` falls back to its start value.
        """
        if probability is not None:
            raise ValueError("CatalogueText.sample supports a mask but not probabilities.")
        if mask is None:
            return super().sample(sample_length=sample_length)
        mask = np.asarray(mask)
        if mask.shape != (self.n,):
            raise ValueError(f"The action mask must have shape ({self.n},), got {mask.shape}.")
        allowed = np.flatnonzero(mask)
        if allowed.size == 0:
            return super().sample(sample_length=sample_length)
        return self._render(int(allowed[int(self.np_random.integers(allowed.size))]))

    def __repr__(self) -> str:
        return f"CatalogueText(n={self.n}, max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CatalogueText) and other.n == self.n and other.max_length == self.max_length


def text_observation_space(observation: spaces.Box, catalogue_size: int | None) -> spaces.Dict:
    """The observation space of one agent: numeric ``observation``, optional ``action_mask``, ``text``."""
    members: dict[str, spaces.Space[Any]] = {"observation": observation, "text": UnicodeText()}
    if catalogue_size is not None:
        members["action_mask"] = spaces.Box(0, 1, shape=(catalogue_size,), dtype=np.int8)
    return spaces.Dict(members)
