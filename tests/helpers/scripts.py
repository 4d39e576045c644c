"""Load a repository script (``benchmarks/*.py``, ``docker/build.py``) as a module, so tests can call its functions.

The scripts are not in a package; each test that checks one used to repeat these lines.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative_path: str) -> ModuleType:
    """The module of ``REPO/relative_path``, registered in ``sys.modules`` under its file stem (dataclasses look
    their module up there)."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
