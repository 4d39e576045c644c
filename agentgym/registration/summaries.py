"""An env's summary line, read from its module's source without importing it.

``agentgym list`` shows one line per env and must stay fast and light: importing every env module would load
torch, Playwright, Java bridges and more. So the summary is taken from the class docstring in the source file,
found through the import system's specs without executing any package.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import io
import re
import tokenize
from pathlib import Path

__all__ = ["entry_point_summary"]


def _module_source(module_name: str) -> Path | None:
    """The ``.py`` file of a module, found without importing it or its packages (only the top-level name is
    looked up; an env package's ``__init__`` may import heavy dependencies)."""
    top, *rest = module_name.split(".")
    if top == "agentgym" and rest:  # agentgym.envs, .tools, ... live in other folders (pyproject's package-dir)
        top, rest = f"agentgym.{rest[0]}", rest[1:]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for folder in spec.submodule_search_locations or ():
        path = Path(folder).joinpath(*rest[:-1])
        for candidate in (path / f"{rest[-1]}.py", path / rest[-1] / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _class_docstring(source: str, name: str) -> str | None:
    """The docstring of the top-level class ``name`` in ``source``, read with :mod:`tokenize` from the class line
    up to its first statement only: parsing whole env modules with :mod:`ast` would cost ``agentgym list`` a
    tenth of a second or more."""
    match = re.search(rf"^class {re.escape(name)}\b", source, re.MULTILINE)
    if match is None:
        return None
    depth, in_body = 0, False
    try:
        for token in tokenize.generate_tokens(io.StringIO(source[match.start():]).readline):
            if not in_body:
                if token.type == tokenize.OP and token.string in "([{":
                    depth += 1
                elif token.type == tokenize.OP and token.string in ")]}":
                    depth -= 1
                elif token.type == tokenize.OP and token.string == ":" and depth == 0:
                    in_body = True
            elif token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.COMMENT):
                continue
            elif token.type == tokenize.STRING:
                value = ast.literal_eval(token.string)
                return inspect.cleandoc(value) if isinstance(value, str) else None
            else:
                return None
    except (tokenize.TokenError, SyntaxError, ValueError):
        return None
    return None


@functools.cache
def entry_point_summary(entry_point: str) -> str:
    """The summary line of a ``module:Class`` entry point's docstring, read from the module's source with
    :mod:`ast` (nothing is imported). Empty when the source or the docstring cannot be found."""
    module_name, _, attr = entry_point.partition(":")
    path = _module_source(module_name)
    if path is None or not attr:
        return ""
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    doc = _class_docstring(source, attr) or ""
    return doc.strip().split("\n", 1)[0].strip()
