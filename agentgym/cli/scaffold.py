"""``agentgym new-env NAME``: the skeleton of a plugin package whose first test run is green.

The skeleton is the extension path in miniature: an env (one ``answer`` tool, a task sampler, a reference
solver), a suite with train/test splits, a light registration module declared under the ``agentgym.envs`` and
``agentgym.suites`` entry points (see :mod:`agentgym.registration.plugins`), and tests that run ``check_agent_env`` and
``validate()``. It works installed (``pip install -e .``: the plugin registers the id) and uninstalled (the
suite's ``entry_point`` registers it), so a user can run its tests before packaging anything.
"""

from __future__ import annotations

import keyword
import re
from importlib import resources
from pathlib import Path
from string import Template

from agentgym.errors import ConfigError

__all__ = ["render_env_package", "write_env_package"]

_NAME = re.compile(r"[a-z][a-z0-9_\-]{0,40}")

#: The skeleton's files: the path written -> its template under templates/plugin/. Both are
#: :class:`string.Template` text: ``$package``, ``$cls``, ``$env_id``... are filled in by :func:`render_env_package`.
#: Template files end in ``.tmpl`` so that tools reading the agentgym source never take them for Python modules,
#: tests or package metadata.
_FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "README.md": "README.md.tmpl",
    "$package/__init__.py": "package/__init__.py.tmpl",
    "$package/registration.py": "package/registration.py.tmpl",
    "$package/env.py": "package/env.py.tmpl",
    "$package/suites/$suite.yaml": "package/suites/suite.yaml.tmpl",
    "tests/test_env.py": "tests/test_env.py.tmpl",
}


def _template(relative: str) -> str:
    """The text of template ``relative`` (package data, so it is found installed, editable or from a wheel)."""
    return resources.files("agentgym.cli").joinpath("templates", "plugin", *relative.split("/")).read_text(encoding="utf-8")


def render_env_package(name: str) -> dict[str, str]:
    """The skeleton's files (relative path -> text) for a plugin called ``name`` (e.g. ``word-game``).

    Raises:
        ConfigError: ``name`` is not a lowercase package name.
    """
    if not _NAME.fullmatch(name) or name.endswith(("-", "_")):
        raise ConfigError(f"new-env NAME must be lowercase letters, digits, '-' or '_', starting with a letter "
                          f"(e.g. word-game), got {name!r}.")
    package = name.replace("-", "_")
    if keyword.iskeyword(package) or package in {"agentgym", "gymnasium", "test", "tests"}:
        raise ConfigError(f"new-env NAME {name!r} would shadow a Python module; choose another name.")
    camel = "".join(part.capitalize() for part in re.split(r"[-_]", name) if part)
    values = {"dist": name, "package": package, "cls": f"{camel}Env", "env_id": f"{package}/{camel}-v0",
              "suite": name, "title": camel}
    return {Template(path).substitute(values): Template(_template(template)).substitute(values)
            for path, template in _FILES.items()}


def write_env_package(name: str, directory: str | Path | None = None, *, force: bool = False) -> Path:
    """Write the skeleton of plugin ``name`` into ``directory`` (default ``./NAME``) and return it.

    Raises:
        ConfigError: The name is invalid, or the directory holds files and ``force`` is False.
    """
    files = render_env_package(name)
    root = Path(directory) if directory is not None else Path(name)
    if root.exists() and any(root.iterdir()) and not force:
        raise ConfigError(f"{root} is not empty; choose another directory (--dir) or pass --force to overwrite "
                          "the skeleton's files there.")
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
