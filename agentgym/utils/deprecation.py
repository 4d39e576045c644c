"""Old import paths that keep working for one release.

A module moved to a new home leaves a file at its old path that calls :func:`moved_module`; importing the old path
warns once with the new one and then *is* the new module (same object in ``sys.modules``), so attributes, patches
and ``isinstance`` checks behave exactly as through the new path.
"""

from __future__ import annotations

import importlib
import runpy
import sys
import warnings


def moved_module(old: str, new: str) -> None:
    """Make ``old`` an alias of ``new`` with a :class:`DeprecationWarning` naming the new path.

    Called from the old module's body; the import system returns whatever ``sys.modules[old]`` holds once that
    body has run, so the caller's ``import old`` gets the new module itself.
    """
    if old == "__main__":  # ``python -m <old path>`` runs the new module as the program
        warnings.warn(f"this module has moved: run python -m {new} (the old path will be removed in the next "
                      "release)", DeprecationWarning, stacklevel=2)
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    warnings.warn(f"{old} has moved to {new}; import it from there (the old path will be removed in the next "
                  "release)", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)


def moved_name(module: str, name: str, new_module: str, moved: tuple[str, ...]) -> object:
    """A module ``__getattr__`` body for names that moved to ``new_module``: warn, then return the new object.

    Raises the usual :class:`AttributeError` for names that never lived in ``module``.
    """
    if name not in moved:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} has moved to {new_module}.{name}; import it from there (the old path will be "
                  "removed in the next release)", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new_module), name)
