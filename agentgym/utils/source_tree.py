"""Keep a source checkout's namespace folders with its own ``agentgym`` package.

``envs/``, ``tools/``, ``trainers/`` and ``tasks/`` are top-level folders installed as ``agentgym.envs`` and so
on. An editable install maps those names to the folders of the tree it was installed from; without more, a
second checkout imported from its own directory (tests, a ``git worktree``, a colleague's clone) would take
``agentgym`` from itself and ``agentgym.envs`` from the installed tree, silently mixing two versions. When
``agentgym`` is imported from a source checkout, :func:`bind_namespace_folders` puts a finder first on
``sys.meta_path`` that resolves those four names to the folders beside this ``agentgym/``, so every module comes
from one tree. An installed wheel has the folders inside the package and needs nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: Folders at the top of the repository that are installed under the ``agentgym`` namespace.
NAMESPACE_FOLDERS = ("envs", "tools", "trainers", "tasks")


class SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Finds ``agentgym.<folder>`` in one checkout; submodules then follow the package's ``__path__``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        package, _, folder = fullname.partition(".")
        if package != "agentgym" or folder not in NAMESPACE_FOLDERS:
            return None
        location = self.root / folder
        return importlib.util.spec_from_file_location(fullname, location / "__init__.py",
                                                      submodule_search_locations=[str(location)])


def source_root(package_dir: Path) -> Path | None:
    """The checkout that holds ``package_dir`` (the ``agentgym/`` folder), or None for an installed wheel."""
    root = package_dir.parent
    if (package_dir / "envs").is_dir() or not (root / "pyproject.toml").is_file():
        return None
    if not all((root / folder / "__init__.py").is_file() for folder in NAMESPACE_FOLDERS):
        return None
    return root


def bind_namespace_folders(package_dir: Path) -> None:
    """Install the finder for the checkout holding ``package_dir``, replacing any finder of another checkout."""
    root = source_root(package_dir)
    if root is None:
        return
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, SourceTreeFinder)]
    sys.meta_path.insert(0, SourceTreeFinder(root))
