"""Suites by name: the shipped ``tasks/suites`` and those that installed plugins provide.

:class:`~agentgym.suite.TaskSuite` is the contract; this module is the registry that finds a suite from its name,
so it sits with env registration and reads the plugins' ``agentgym.suites`` entry points.
"""

from __future__ import annotations

from pathlib import Path

from agentgym.errors import TaskError, did_you_mean
from agentgym.registration.plugins import plugin_suite_paths, suite_files
from agentgym.suite import TaskSuite

__all__ = ["list_suites", "load_suite"]


def _suite_dirs() -> list[Path]:
    """Where shipped suites live: ``tasks/suites`` (installed as package data of ``agentgym.tasks``)."""
    from importlib import resources

    try:
        root = Path(str(resources.files("agentgym.tasks"))) / "suites"
    except (ModuleNotFoundError, TypeError):
        root = Path(__file__).resolve().parents[2] / "tasks" / "suites"
    return [root] if root.is_dir() else []


def _suite_files() -> list[Path]:
    """Shipped suite files, then those of installed plugins (``agentgym.suites`` entry points)."""
    return suite_files(_suite_dirs()) + suite_files(plugin_suite_paths())


def list_suites() -> list[str]:
    """Names of the suites shipped in ``tasks/suites`` and provided by plugins."""
    return sorted({p.stem for p in _suite_files()})


_CACHE: dict[str, TaskSuite] = {}


def load_suite(name_or_path: str) -> TaskSuite:
    """Load a suite by name (``games-calc``) or by path to a YAML/JSONL file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return TaskSuite.from_yaml(path)
    if name_or_path in _CACHE:
        return _CACHE[name_or_path]
    for candidate in _suite_files():
        if candidate.stem == name_or_path and candidate.is_file():
            suite = TaskSuite.from_yaml(candidate)
            _CACHE[name_or_path] = suite
            return suite
    raise TaskError(
        f"Unknown task suite {name_or_path!r}.{did_you_mean(name_or_path, list_suites())} "
        f"Available suites: {', '.join(list_suites()) or 'none'}. Or pass a path to a suite .yaml file."
    )
