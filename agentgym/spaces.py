"""An honest Unicode text space.

Gymnasium's stock ``spaces.Text`` only admits a fixed charset (62 alphanumerics by default), so an LLM's
raw text would not be "in" the action space. :class:`UnicodeText` admits every Python ``str`` up to a
length, and its ``sample`` draws from the whole of Unicode (minus surrogates, which are not valid text),
so ``contains(sample())`` is always true and ``check_env`` passes unmodified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["UnicodeText"]

_MAX_CODEPOINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


class UnicodeText(spaces.Space[str]):
    """Any Unicode string whose length lies in ``[min_length, max_length]``."""

    def __init__(self, max_length: int = 1_000_000, *, min_length: int = 0, seed: int | None = None) -> None:
        if min_length < 0 or max_length < min_length:
            raise ValueError(
                f"UnicodeText needs 0 <= min_length <= max_length, got min_length={min_length}, "
                f"max_length={max_length}."
            )
        self.min_length = int(min_length)
        self.max_length = int(max_length)
        super().__init__(dtype=str, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None, *, sample_length: int = 64) -> str:
        """Draw a random string: mostly printable ASCII with a share of arbitrary code points.

        The length is uniform in ``[min_length, min(max_length, min_length + sample_length)]``; a huge
        ``max_length`` does not make samples huge.
        """
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample does not support masks or probabilities.")
        hi = min(self.max_length, self.min_length + sample_length)
        length = int(self.np_random.integers(self.min_length, hi + 1))
        ascii_part = self.np_random.integers(32, 127, size=length)
        wide = self.np_random.integers(0, _MAX_CODEPOINT - (_SURROGATES[1] - _SURROGATES[0]), size=length)
        wide = np.where(wide >= _SURROGATES[0], wide + (_SURROGATES[1] - _SURROGATES[0] + 1), wide)
        use_wide = self.np_random.random(size=length) < 0.25
        codes = np.where(use_wide, wide, ascii_part)
        return "".join(chr(int(c)) for c in codes)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and other.min_length == self.min_length
            and other.max_length == self.max_length
        )

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)
