"""Parse text an agent wrote as a Python expression without the compiler's warnings reaching the user's log.

Why: agents write things like ``calc(1134or 2)`` or ``answer(0x1for)``; CPython's parser answers some of them with
a ``SyntaxWarning`` ("invalid decimal literal") printed to stderr (or logged as ``py.warnings``) besides the
``SyntaxError`` or value the caller handles. That is noise about the model's output, not about the user's code.
Parsing under a fixed filename lets one module-level filter drop exactly those warnings; a
``warnings.catch_warnings()`` block instead would change the process-wide filters while other threads (rollout
workers) run.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Literal

__all__ = ["UNTRUSTED_FILENAME", "parse_untrusted"]

UNTRUSTED_FILENAME = "<agent text>"
"""The filename agent text is compiled under; the compiler's warnings are attributed to it."""

warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(UNTRUSTED_FILENAME) + r"\Z")


def parse_untrusted(text: str, mode: Literal["eval", "exec"] = "eval") -> ast.AST:
    """``ast.parse(text, mode=mode)`` for agent-written text: the same tree and errors, no ``SyntaxWarning``."""
    return ast.parse(text, filename=UNTRUSTED_FILENAME, mode=mode)
