"""agentgym.utils.images.decode_png: the one PNG decoder, with and without Pillow, and its RGB form."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from agentgym.errors import AgentGymError
from agentgym.utils.images import decode_png, encode_png

Image = pytest.importorskip("PIL.Image")


def _pillow_png(pixels: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels, mode=mode).save(buffer, "PNG",
                                                                                              optimize=True)
    return buffer.getvalue()


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_pillow_and_the_builtin_codec_read_the_same_pixels(channels: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow's encoder uses every row filter (Paeth and average included), so the builtin codec's slow path runs."""
    pixels = np.random.default_rng(channels).integers(0, 256, (9, 13, channels), dtype=np.uint8)
    pillow_file, own_file = _pillow_png(pixels), encode_png(pixels)
    with_pillow = [decode_png(pillow_file), decode_png(own_file)]
    monkeypatch.setitem(sys.modules, "PIL", None)  # `from PIL import Image` now fails: the builtin codec decodes
    without = [decode_png(pillow_file), decode_png(own_file)]
    for got in with_pillow + without:
        assert got.shape == pixels.shape and got.dtype == np.uint8 and np.array_equal(got, pixels)


def test_rgb_repeats_grey_and_drops_alpha() -> None:
    rgba = np.random.default_rng(0).integers(0, 256, (5, 7, 4), dtype=np.uint8)
    grey = rgba[:, :, :1]
    assert np.array_equal(decode_png(encode_png(rgba), rgb=True), rgba[:, :, :3])
    assert np.array_equal(decode_png(encode_png(grey), rgb=True), np.repeat(grey, 3, axis=2))
    palette = Image.fromarray(rgba[:, :, :3]).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    buffer = io.BytesIO()
    palette.save(buffer, "PNG")
    expected = np.asarray(palette.convert("RGB"))
    assert np.array_equal(decode_png(buffer.getvalue(), rgb=True), expected)  # what Pillow's own convert gives


def test_corrupt_files_are_reported_with_and_without_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode_png(np.zeros((4, 4, 3), dtype=np.uint8))
    with pytest.raises(AgentGymError, match="Not a PNG"):
        decode_png(b"GIF89a" + data[6:])
    with pytest.raises(AgentGymError, match="truncated or corrupt"):
        decode_png(data[:40])
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(AgentGymError, match="truncated or corrupt"):
        decode_png(data[:40])
