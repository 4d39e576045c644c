"""Checks on action arguments, done before anything reaches the browser.

Every argument a model writes is suspect: a key name Playwright does not know, a click at (-5, 10**9), a
20 MB string to type. Each check either returns the cleaned value or raises :class:`ActionError` with a
message that shows the model what a valid call looks like, so garbage actions never reach Chromium.
"""

from __future__ import annotations

import math
from typing import Any

from agentgym.tools.browser.errors import ActionError

__all__ = [
    "KEY_NAMES",
    "MAX_SCROLL",
    "MAX_TYPE_CHARS",
    "SCROLL_DIRECTIONS",
    "check_key",
    "check_point",
    "check_scroll_delta",
    "check_text",
]

MAX_TYPE_CHARS = 2000
MAX_SCROLL = 10_000
SCROLL_DIRECTIONS = ("up", "down", "left", "right")

_MODIFIERS = ("Shift", "Control", "Alt", "Meta", "ControlOrMeta")
#: Key names Playwright's ``keyboard.press`` understands (single printable characters are accepted too).
KEY_NAMES: frozenset[str] = frozenset(
    [
        "Enter", "Tab", "Escape", "Backspace", "Delete", "Insert", "Home", "End", "PageUp", "PageDown",
        "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Space", "Backquote", "Minus", "Equal", "Backslash",
        "BracketLeft", "BracketRight", "Semicolon", "Quote", "Comma", "Period", "Slash", "CapsLock",
        *_MODIFIERS, "ShiftLeft", "ShiftRight", "ControlLeft", "ControlRight", "AltLeft", "AltRight",
        "MetaLeft", "MetaRight",
        *(f"F{i}" for i in range(1, 13)),
        *(f"Digit{i}" for i in range(10)),
        *(f"Key{chr(c)}" for c in range(ord("A"), ord("Z") + 1)),
    ]
)
_ALIASES = {name.lower(): name for name in KEY_NAMES} | {
    "return": "Enter", "esc": "Escape", "del": "Delete", "up": "ArrowUp", "down": "ArrowDown", "left": "ArrowLeft",
    "right": "ArrowRight", "ctrl": "Control", "cmd": "Meta", "pgup": "PageUp", "pgdn": "PageDown", "space": "Space",
}


def check_key(name: Any) -> str:
    """A key or chord such as ``Enter``, ``Shift+Tab`` or ``Control+a``, in Playwright's spelling."""
    example = "key('Enter'), key('Tab'), key('Control+a') or key('a')"
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ActionError(f"Error: the key name must be a short string; for example {example}.")
    if name == "+":
        parts = ["+"]
    elif name.endswith("++"):  # a chord whose last key is '+' itself, e.g. Shift++
        parts = [*name[:-2].split("+"), "+"]
    else:
        parts = name.split("+")
    keys: list[str] = []
    for index, part in enumerate(parts):
        is_last = index == len(parts) - 1
        if len(part) == 1 and part.isprintable() and is_last:
            keys.append(part)
            continue
        canonical = _ALIASES.get(part.strip().lower())
        if canonical is None or (not is_last and canonical not in _MODIFIERS):
            raise ActionError(
                f"Error: unknown key {part[:40]!r} in {name[:64]!r}. Use a key name such as Enter, Tab, Escape, "
                f"Backspace, ArrowDown, PageDown, F5, a single character, or a chord like Shift+Tab; for "
                f"example {example}."
            )
        keys.append(canonical)
    return "+".join(keys)


def check_point(x: Any, y: Any, width: int, height: int, *, what: str = "point") -> tuple[float, float]:
    """Screen coordinates inside the ``width x height`` viewport (pixels from the top-left corner)."""
    for label, value in (("x", x), ("y", y)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ActionError(f"Error: {label} must be a number of pixels, got {value!r}.")
    if not (0 <= x < width and 0 <= y < height):
        raise ActionError(
            f"Error: the {what} ({x}, {y}) is outside the {width}x{height} screen; x must lie in [0, {width - 1}] "
            f"and y in [0, {height - 1}] (pixels from the top-left corner of the screenshot)."
        )
    return float(x), float(y)


def check_text(text: Any, *, limit: int = MAX_TYPE_CHARS) -> str:
    """Text to type: a string of at most ``limit`` characters, without NUL or unpaired surrogates."""
    if not isinstance(text, str):
        raise ActionError(f"Error: the text to type must be a string, got {type(text).__name__}.")
    if len(text) > limit:
        raise ActionError(f"Error: the text has {len(text)} characters; type at most {limit} at a time.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ActionError("Error: the text contains unpaired surrogate characters; type valid Unicode text.") from None
    if "\x00" in text:
        raise ActionError("Error: the text contains a NUL character, which cannot be typed.")
    return text


def check_scroll_delta(dy: Any) -> float:
    """A wheel delta in pixels (positive scrolls down), at most ``MAX_SCROLL`` either way."""
    if isinstance(dy, bool) or not isinstance(dy, (int, float)) or not math.isfinite(dy):
        raise ActionError(f"Error: dy must be a number of pixels (positive scrolls down), got {dy!r}.")
    if abs(dy) > MAX_SCROLL:
        raise ActionError(f"Error: dy={dy} is too large; scroll at most {MAX_SCROLL} pixels at a time.")
    return float(dy)
