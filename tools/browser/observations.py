"""Observation spaces for browser envs that show pixels: ``{"text": str, "image": uint8[H, W, 3]}``.

The core env returns text; GUI envs (and the shop with ``screenshot=True``) return a dict. This module
holds the one honest space for that dict and the helper that turns any text observation (including the
core's crash message, which has no image) into a valid dict, so ``check_env`` passes unmodified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from agentgym.spaces import UnicodeText

__all__ = ["ScreenObservation", "blank_image"]


def blank_image(height: int, width: int) -> np.ndarray:
    """A white ``uint8[height, width, 3]`` image (shown when the browser died and no screenshot exists)."""
    return np.full((height, width, 3), 255, dtype=np.uint8)


class ScreenObservation:
    """Builds ``{"text", "image"}`` observations of a fixed image size and their Gymnasium space.

    Args:
        height: Image height in pixels.
        width: Image width in pixels.
    """

    def __init__(self, height: int, width: int) -> None:
        self.height, self.width = int(height), int(width)
        self.space = spaces.Dict({
            "text": UnicodeText(),
            "image": spaces.Box(0, 255, shape=(self.height, self.width, 3), dtype=np.uint8),
        })
        self.last_image = blank_image(self.height, self.width)

    def make(self, text: str, image: np.ndarray | None = None) -> dict[str, Any]:
        """The observation for ``text`` with ``image`` (or the last image seen when there is none)."""
        if image is not None:
            if image.shape != (self.height, self.width, 3) or image.dtype != np.uint8:
                raise ValueError(f"screenshot has shape {image.shape} and dtype {image.dtype}; expected "
                                 f"({self.height}, {self.width}, 3) uint8.")
            self.last_image = image
        return {"text": text, "image": self.last_image.copy()}

    def ensure(self, observation: Any) -> dict[str, Any]:
        """Turn a bare text observation (e.g. the core's crash message) into a dict with the last image."""
        if isinstance(observation, dict):
            return observation
        return self.make(str(observation))
