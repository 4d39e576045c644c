"""Observation images: pixels in memory, content-hashed PNG files on disk, never base64 inside JSONL.

GUI envs observe ``{"text": str, "image": uint8[H, W, 3]}``. An :class:`ImageRef` is how such an image travels
through agentgym: the :class:`~agentgym.agent.ChatAgent` puts it in a message content part
(``{"type": "image", "image": ref}``), each policy turns it into what its backend reads (a data URI for an
OpenAI server, pixel values for a Hugging Face processor), and a :class:`~agentgym.trajectory.Turn` keeps it by
reference: ``images/<sha256 of the PNG bytes>.png`` next to the JSONL file, written by
:class:`~agentgym.storage.TrajectoryWriter`. Content hashing makes a screenshot that repeats across turns,
episodes and runs one file, and makes the reference check itself (a file whose bytes do not hash to its name
is reported as corrupt, not shown).

The PNG encoder is our own (``zlib`` + ``struct``, 8-bit grey/RGB/RGBA, no interlacing), so the same pixels always
give the same bytes, hence the same file name, whatever imaging library is installed. The one decoder,
:func:`decode_png`, reads every PNG in agentgym (stored observations, served env observations, browser
screenshots): with Pillow where it is installed, because undoing the row filters other encoders use (Chromium's
screenshots, Pillow's own files) is a sequential loop that takes seconds per screenshot in Python, else with the
codec here, so the core needs no imaging library.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.errors import AgentGymError

__all__ = ["IMAGE_DIR", "ImageRef", "decode_png", "encode_png", "image_parts", "observation_parts"]

#: Folder, next to a trajectories JSONL file, that holds its images.
IMAGE_DIR = "images"

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOR_TYPES = {1: 0, 3: 2, 4: 6}  # channels -> PNG colour type (grey, RGB, RGBA)
_CHANNELS = {v: k for k, v in _COLOR_TYPES.items()}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _as_pixels(array: Any) -> np.ndarray:
    """``array`` as a C-contiguous uint8 ``[H, W, C]`` array with C in 1, 3, 4; a clear error otherwise."""
    pixels = np.asarray(array)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in _COLOR_TYPES or 0 in pixels.shape:
        raise AgentGymError(
            f"An observation image must be a non-empty uint8 array of shape [H, W], [H, W, 3] or [H, W, 4]; got "
            f"dtype {pixels.dtype} and shape {tuple(pixels.shape)}. Convert it with np.asarray(img, dtype=np.uint8)."
        )
    return np.ascontiguousarray(pixels)


def encode_png(array: Any) -> bytes:
    """PNG bytes of a uint8 ``[H, W]``/``[H, W, 3]``/``[H, W, 4]`` array (deterministic: same pixels, same bytes)."""
    pixels = _as_pixels(array)
    height, width, channels = pixels.shape
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOR_TYPES[channels], 0, 0, 0)
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, width * channels)], axis=1)
    return (_PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + _chunk(b"IEND", b""))


def _unfilter(raw: bytes, height: int, stride: int, bpp: int) -> np.ndarray:
    """Undo PNG's per-row filters (all five types, so PNGs from other encoders read too)."""
    out = np.zeros((height, stride), dtype=np.uint8)
    data = np.frombuffer(raw, dtype=np.uint8).reshape(height, stride + 1)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind, line = int(data[y, 0]), data[y, 1:].astype(np.int32)
        if kind == 0:
            cur = line
        elif kind == 2:
            cur = (line + prev) & 0xFF
        elif kind in (1, 3, 4):  # depend on the reconstructed byte to the left: sequential
            cur = np.zeros(stride, dtype=np.int32)
            for x in range(stride):
                left = cur[x - bpp] if x >= bpp else 0
                if kind == 1:
                    pred = left
                elif kind == 3:
                    pred = (left + prev[x]) >> 1
                else:
                    up_left = prev[x - bpp] if x >= bpp else 0
                    p = left + prev[x] - up_left
                    pa, pb, pc = abs(p - left), abs(p - prev[x]), abs(p - up_left)
                    pred = left if pa <= pb and pa <= pc else prev[x] if pb <= pc else up_left
                cur[x] = (line[x] + pred) & 0xFF
        else:
            raise AgentGymError(f"PNG row {y} has filter type {kind}; valid types are 0-4 (the file is corrupt).")
        out[y] = cur
        prev = cur
    return out


def decode_png(data: bytes, *, rgb: bool = False) -> np.ndarray:
    """uint8 ``[H, W, C]`` pixels of a PNG: C is 1 (grey), 3 (RGB) or 4 (RGBA), as the file holds.

    Pillow decodes when it is installed (any PNG; palette and 16-bit files come back as RGB or RGBA); without it,
    the codec here reads 8-bit, non-interlaced grey/RGB/RGBA files (what :func:`encode_png` writes).

    Args:
        data: The file's bytes.
        rgb: Return ``[H, W, 3]`` whatever the file holds (grey repeated, alpha dropped), the form a browser
            screenshot's readers take.

    Raises:
        AgentGymError: The bytes are not a PNG, are truncated or corrupt, or (without Pillow) use a format the
            codec here does not read.
    """
    if not data.startswith(_PNG_SIGNATURE):
        raise AgentGymError("Not a PNG file (wrong signature); observation images are stored as PNG.")
    try:
        from PIL import Image
    except ImportError:
        pixels = _decode_png_here(data)
    else:
        pixels = _decode_png_pillow(Image, data)
    if rgb and pixels.shape[2] != 3:
        pixels = np.ascontiguousarray(np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels[:, :, :3])
    return pixels


def _decode_png_pillow(image_module: Any, data: bytes) -> np.ndarray:
    """``[H, W, C]`` pixels decoded by Pillow, in the channel layout of :func:`decode_png`."""
    import io

    try:
        with image_module.open(io.BytesIO(data), formats=["PNG"]) as image:
            image.load()
            if image.mode not in ("L", "RGB", "RGBA"):
                has_alpha = "A" in image.getbands() or "transparency" in image.info
                image = image.convert("RGBA" if has_alpha else "RGB")
            pixels = np.array(image, dtype=np.uint8)
    except (OSError, SyntaxError, ValueError) as exc:  # Pillow's errors for truncated or malformed files
        raise AgentGymError(f"The PNG file could not be read ({exc}); it is truncated or corrupt.") from exc
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def _decode_png_here(data: bytes) -> np.ndarray:
    """``[H, W, C]`` pixels of an 8-bit, non-interlaced grey/RGB/RGBA PNG, decoded without an imaging library."""
    pos, header, idat = len(_PNG_SIGNATURE), b"", []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if len(header) != 13:
        raise AgentGymError("PNG without a valid IHDR chunk (the file is truncated or corrupt).")
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or color not in _CHANNELS or interlace:
        raise AgentGymError(f"Unsupported PNG (bit depth {depth}, colour type {color}, interlace {interlace}); "
                            "agentgym reads 8-bit grey/RGB/RGBA PNGs without interlacing.")
    channels = _CHANNELS[color]
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise AgentGymError(f"PNG pixel data does not decompress ({exc}); the file is truncated or corrupt.") from exc
    if len(raw) != height * (width * channels + 1):
        raise AgentGymError("PNG pixel data has the wrong length (the file is truncated or corrupt).")
    return _unfilter(raw, height, width * channels, channels).reshape(height, width, channels)


class ImageRef:
    """One observation image, identified by the SHA-256 of its PNG bytes.

    Made from pixels (:meth:`from_array`, in memory) or read back from a stored trajectory (:meth:`from_dict`,
    a file under ``root``). Equal when the hashes are equal. The JSON form (:meth:`to_dict`) is a reference,
    ``{"path": "images/<sha256>.png", "sha256", "width", "height"}``, never the pixels.
    """

    __slots__ = ("_png", "height", "root", "sha256", "width")

    def __init__(self, sha256: str, width: int, height: int, *, png: bytes | None = None,
                 root: str | Path | None = None) -> None:
        if not isinstance(sha256, str) or len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise AgentGymError(f"ImageRef needs the 64-hex-digit SHA-256 of its PNG bytes, got {sha256!r}.")
        self.sha256 = sha256
        self.width = int(width)
        self.height = int(height)
        self._png = png
        self.root = None if root is None else Path(root)

    @classmethod
    def from_array(cls, array: Any) -> ImageRef:
        """Encode pixels (uint8 ``[H, W, 3]``, ``[H, W, 4]`` or ``[H, W]``) as PNG, in memory."""
        pixels = _as_pixels(array)
        png = encode_png(pixels)
        return cls(hashlib.sha256(png).hexdigest(), pixels.shape[1], pixels.shape[0], png=png)

    @classmethod
    def from_data_uri(cls, uri: str) -> ImageRef:
        """An image sent inline (``data:image/...;base64,...``, what OpenAI clients send). PNGs decode here;
        other formats (JPEG, WebP) need Pillow. The pixels are re-encoded, so equal pixels get one hash.

        Raises:
            AgentGymError: Not a base64 data URI, or an image that cannot be decoded.
        """
        head, sep, payload = uri.partition(",")
        if not (sep and head.startswith("data:image/") and head.endswith(";base64")):
            raise AgentGymError("Images must be sent inline as 'data:image/png;base64,...' URIs (this server reads "
                                f"nothing from the network); got one starting {uri[:40]!r}.")
        try:
            data = base64.b64decode(payload, validate=True)
        except ValueError as exc:
            raise AgentGymError(f"The image data URI is not valid base64 ({exc}).") from exc
        if data.startswith(_PNG_SIGNATURE):
            try:
                return cls.from_array(decode_png(data))
            except AgentGymError:
                pass  # 16-bit, palette or interlaced PNGs: Pillow reads them
        try:
            import io

            from PIL import Image
        except ImportError as exc:
            raise AgentGymError(f"Only 8-bit PNG images can be read without Pillow (got {head[5:-7]}); "
                                "pip install pillow.") from exc
        try:
            with Image.open(io.BytesIO(data)) as img:
                return cls.from_array(np.asarray(img.convert("RGB")))
        except Exception as exc:  # noqa: BLE001 - any decoder failure is a bad image from the client
            raise AgentGymError(f"The image could not be decoded ({type(exc).__name__}: {exc}).") from exc

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], root: str | Path | None = None) -> ImageRef:
        """The reference stored by :meth:`to_dict`; ``root`` is the folder its ``path`` is relative to."""
        try:
            return cls(str(d["sha256"]), int(d["width"]), int(d["height"]), root=root)
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentGymError(f"Bad image reference {dict(d)!r}: expected keys path, sha256, width, height.") from exc

    @property
    def path(self) -> str:
        """Where the PNG lives, relative to the trajectories file's folder (``images/<sha256>.png``)."""
        return f"{IMAGE_DIR}/{self.sha256}.png"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "width": self.width, "height": self.height}

    def png_bytes(self) -> bytes:
        """The PNG bytes, from memory or from ``root/path`` (checked against the hash).

        Raises:
            AgentGymError: The image is neither in memory nor at its path, or its file does not match its hash.
        """
        if self._png is not None:
            return self._png
        if self.root is None:
            raise AgentGymError(f"Image {self.sha256[:12]} has no pixels in memory and no folder to read "
                                f"{self.path} from; read trajectories with agentgym.storage.read_trajectories(path).")
        file = self.root / self.path
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise AgentGymError(f"Image file {file} is missing ({exc.strerror}); copy the {IMAGE_DIR}/ folder "
                                "together with the trajectories JSONL.") from exc
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise AgentGymError(f"Image file {file} does not hash to its name; it is corrupt or was edited.")
        self._png = data
        return data

    def array(self) -> np.ndarray:
        """The pixels, uint8 ``[H, W, C]``."""
        return decode_png(self.png_bytes())

    def data_uri(self) -> str:
        """``data:image/png;base64,...``: how OpenAI-compatible chat APIs take an image inline."""
        return "data:image/png;base64," + base64.b64encode(self.png_bytes()).decode("ascii")

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/images/<sha256>.png`` unless it is there already (atomically: temp file + rename)."""
        target = Path(folder) / self.path
        if not target.exists():
            from agentgym.utils.durable import atomic_write_bytes

            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, self.png_bytes())  # a full disk leaves no partial PNG or temp file behind
        return target

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageRef) and other.sha256 == self.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"ImageRef({self.sha256[:12]}, {self.width}x{self.height})"


def observation_parts(observation: Any) -> tuple[str, tuple[ImageRef, ...]]:
    """``(text, images)`` of an env observation: a ``str``, or a mapping ``{"text": str, "image": pixels}``
    (``"images"``: a list of them) as GUI envs return. Pixels may be arrays or :class:`ImageRef`."""
    if type(observation) is str:  # text envs, every turn: no ABC check
        return observation, ()
    if not isinstance(observation, Mapping):
        return str(observation), ()
    raw = [observation["image"]] if observation.get("image") is not None else []
    raw += list(observation.get("images") or ())
    images = tuple(x if isinstance(x, ImageRef) else ImageRef.from_array(x) for x in raw)
    return str(observation.get("text", "")), images


def image_parts(content: Any) -> list[ImageRef]:
    """The images of one message's content (a string has none), in order."""
    if isinstance(content, str) or not content:
        return []
    return [part["image"] for part in content
            if isinstance(part, Mapping) and part.get("type") == "image" and isinstance(part.get("image"), ImageRef)]
