"""Text from a model or an environment made safe to print on a terminal.

A terminal executes control sequences found in what it prints (ECMA-48): ``ESC ] 52 ; c ; <base64> BEL`` writes
the user's clipboard (OSC 52), ``ESC ] 0 ; ... BEL`` sets the window title, ``ESC [ 2 A`` moves the cursor up so
later text overwrites earlier lines (a forged ``success=True``), and the 8-bit C1 forms (U+009B is CSI, U+009D is
OSC) do the same on terminals that honour them. Model and env output is untrusted, so every place the CLI prints it
goes through :func:`terminal_safe`, which renders each such character visibly as a Python-style escape
(``\\x1b``, ``\\x9b``, ``\\u202e``) instead of passing it through. Newline and tab are kept: they lay text out
but cannot move the cursor up or rewrite earlier output.

Besides C0 (U+0000-U+001F except ``\\n`` and ``\\t``), DEL (U+007F) and C1 (U+0080-U+009F), the Unicode
bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) are escaped too: they reorder how a line is
displayed, which can make printed text read differently from what it is (CVE-2021-42574, "Trojan Source").
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["TerminalSafeFormatter", "TerminalSafeWriter", "terminal_safe"]

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character except newline and tab shown as an escape (``\\x1b``), so printing it
    cannot send a terminal a control sequence. Plain text comes back unchanged (the same object)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_visible, text)


class TerminalSafeWriter:
    """A text stream that passes every write through :func:`terminal_safe` (for code that prints with ``write``)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(terminal_safe(text))

    def flush(self) -> None:
        self._stream.flush()


class TerminalSafeFormatter(logging.Formatter):
    """A log formatter whose output goes through :func:`terminal_safe`: log messages quote env and model text
    (an env's exception message, a task id), and a log handler writes to the same terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))
