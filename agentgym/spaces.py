"""An honest Unicode text space.

Gymnasium's stock ``spaces.Text`` only admits a fixed charset (62 alphanumerics by default), so an LLM's
raw text would not be "in" the action space. :class:`UnicodeText` admits every Python ``str`` up to a
length, and its ``sample`` draws from the whole of Unicode (minus surrogates, which are not valid text),
so ``contains(sample())`` is always true and ``check_env`` passes unmodified.

Gymnasium's ``AsyncVectorEnv`` (and ``gym.make_vec(id, n, vectorization_mode="async")``) passes observations
back through shared memory by default, and asks ``create_shared_memory`` / ``read_from_shared_memory`` /
``write_to_shared_memory`` (single-dispatch functions) how to lay a space out. This module registers
:class:`UnicodeText` with them; see :class:`SharedTextBatch` for the layout.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator, Sequence
from multiprocessing.sharedctypes import SynchronizedArray
from types import ModuleType
from typing import Any, overload

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

__all__ = ["SharedTextBatch", "UnicodeText"]

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


# ---- Gymnasium's shared-memory vector envs ----------------------------------------------------------------------
_CODE_UNIT = np.uint32  # one UTF-32 code point per slot: every str of length L fits in L slots, whatever it holds


class SharedTextBatch(Sequence[str]):
    """The batch of text observations an ``AsyncVectorEnv`` reads from shared memory, one ``str`` per env.

    Gymnasium reads the shared buffer **once**, when the vector env is built, and hands that same object back
    after every ``reset``/``step`` (it expects a NumPy view that the workers write into). A tuple of ``str``
    would therefore be stale forever, so this is a live view: each env owns ``max_length + 1`` UTF-32 slots,
    the first holding the length, and indexing decodes the slots the worker wrote last. ``deepcopy`` (which the
    vector env applies when ``copy=True``, its default) returns a plain tuple of the current strings.
    Memory: ``4 * (max_length + 1)`` bytes per env, e.g. 4 MB for the default ``UnicodeText()``.
    """

    def __init__(self, buffer: np.ndarray, n: int) -> None:
        self._slots = buffer.reshape(n, -1)

    def __len__(self) -> int:
        return int(self._slots.shape[0])

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._slots[index]
        length = int(row[0])
        return row[1 : 1 + length].tobytes().decode("utf-32-le", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # contents change under it

    def __repr__(self) -> str:
        return f"SharedTextBatch({tuple(self)!r})"


@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> SynchronizedArray:
    return ctx.Array(np.dtype(_CODE_UNIT).char, n * (space.max_length + 1))


def _shared_slots(shared_memory: SynchronizedArray) -> np.ndarray:
    return np.frombuffer(shared_memory.get_obj(), dtype=_CODE_UNIT)


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(space: UnicodeText, shared_memory: SynchronizedArray, n: int = 1) -> SharedTextBatch:
    return SharedTextBatch(_shared_slots(shared_memory), n)


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(space: UnicodeText, index: int, value: str, shared_memory: SynchronizedArray) -> None:
    if not isinstance(value, str):
        raise TypeError(f"A UnicodeText observation must be a str, got {type(value).__name__}.")
    if len(value) > space.max_length:
        raise ValueError(
            f"Observation of {len(value)} characters does not fit {space}; raise the space's max_length or "
            "build the vector env with shared_memory=False."
        )
    width = space.max_length + 1
    row = _shared_slots(shared_memory)[index * width : (index + 1) * width]
    # surrogatepass: a lone surrogate in a str (e.g. from bytes decoded with surrogateescape) still round-trips
    row[1 : 1 + len(value)] = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype=_CODE_UNIT)
    row[0] = len(value)
