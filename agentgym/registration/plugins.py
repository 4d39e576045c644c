"""Entry-point plugins: other packages add env ids and task suites after a plain ``pip install``.

A package declares, in its ``pyproject.toml``::

    [project.entry-points."agentgym.envs"]
    myenvs = "myenvs.registration:register"     # returns catalogue entries (or calls gym.register itself)

    [project.entry-points."agentgym.suites"]
    myenvs = "myenvs.registration:suite_dirs"   # returns folders (or files) of suite .yaml files

``import agentgym`` (so also ``agentgym list`` and ``gym.make("agentgym:...")``) reads both groups with
:mod:`importlib.metadata` and calls each function once. The functions live in a light module and register ids
with *string* entry points, so no env module (and none of its heavy dependencies) is imported until
``gym.make``. A plugin that fails to load is logged and skipped, never fatal: a broken third-party package must
not take the user's other envs down with it; :func:`plugin_errors` and ``agentgym list`` report it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from agentgym.registration.entry import CatalogueEntry

__all__ = ["ENV_GROUP", "SUITE_GROUP", "PluginError", "load_plugins", "plugin_entries", "plugin_errors",
           "plugin_suite_paths"]

logger = logging.getLogger(__name__)

ENV_GROUP = "agentgym.envs"
SUITE_GROUP = "agentgym.suites"


@dataclass(frozen=True)
class PluginError:
    """A plugin that could not be loaded: which entry point, from which distribution, and why."""

    group: str
    name: str
    value: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return f"{self.group} plugin {self.name!r} ({self.value}, from {self.distribution}): {self.error}"


_loaded = False
_entries: list[Any] = []
_suite_paths: list[Path] = []
_errors: list[PluginError] = []


def _entry_points(group: str) -> list[Any]:
    from importlib.metadata import entry_points

    try:
        return sorted(entry_points(group=group), key=lambda ep: ep.name)
    except Exception as exc:  # noqa: BLE001 - broken metadata of some unrelated distribution
        logger.warning("could not read the %s entry points: %s", group, exc)
        return []


def _distribution(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


def _fail(group: str, ep: Any, exc: BaseException) -> None:
    error = PluginError(group, ep.name, ep.value, _distribution(ep), f"{type(exc).__name__}: {exc}")
    _errors.append(error)
    logger.warning("skipped the %s; fix or uninstall that package", error)


def _as_entry(item: Any, plugin: str) -> Any:
    """A catalogue entry from what a plugin returned (a CatalogueEntry or a mapping with id and entry_point)."""
    if isinstance(item, CatalogueEntry):
        return item
    if isinstance(item, Mapping) and {"id", "entry_point"} <= set(item):
        return CatalogueEntry(str(item["id"]), str(item["entry_point"]), str(item.get("description", "")),
                              str(item.get("family", f"plugin:{plugin}")), dict(item.get("kwargs") or {}))
    raise TypeError(f"expected CatalogueEntry or a mapping with 'id' and 'entry_point', got {item!r}")


def _load_env_plugin(ep: Any) -> None:
    before = set(gym.registry)
    register = ep.load()
    returned = register() if callable(register) else register
    entries = [_as_entry(item, ep.name) for item in (returned or ())]
    for entry in entries:
        if entry.id in gym.registry:
            if entry.id not in before or gym.registry[entry.id].entry_point == entry.entry_point:
                continue  # the function registered it itself, or a reload
            raise ValueError(f"env id {entry.id!r} is already registered by agentgym or another plugin; "
                             "choose another namespace or name")
        gym.register(id=entry.id, entry_point=entry.entry_point, kwargs=dict(entry.kwargs))
    listed = {e.id for e in entries}
    for env_id in sorted(set(gym.registry) - before - listed):  # ids the function registered itself
        spec = gym.registry[env_id]
        entry_point = spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point)
        entries.append(CatalogueEntry(env_id, entry_point, "", f"plugin:{ep.name}"))
    _entries.extend(entries)


def _load_suite_plugin(ep: Any) -> None:
    provider = ep.load()
    returned = provider() if callable(provider) else provider
    paths = [returned] if isinstance(returned, (str, Path)) else list(returned or ())
    for path in (Path(p) for p in paths):
        if not path.exists():
            raise FileNotFoundError(f"suite path {path} does not exist")
        _suite_paths.append(path)


def load_plugins(*, reload: bool = False) -> None:
    """Read the ``agentgym.envs`` and ``agentgym.suites`` entry points once per process (idempotent)."""
    global _loaded
    if _loaded and not reload:
        return
    _loaded = True
    if reload:
        _entries.clear()
        _suite_paths.clear()
        _errors.clear()
    for group, load in ((ENV_GROUP, _load_env_plugin), (SUITE_GROUP, _load_suite_plugin)):
        for ep in _entry_points(group):
            try:
                load(ep)
            except Exception as exc:  # noqa: BLE001 - a broken plugin is reported and skipped, never fatal
                _fail(group, ep, exc)


def plugin_entries() -> list[Any]:
    """Catalogue entries of the env ids that plugins registered (shown by ``agentgym list``)."""
    load_plugins()
    return list(_entries)


def plugin_suite_paths() -> list[Path]:
    """Folders and files of suite YAMLs that plugins provide (``load_suite`` and ``list_suites`` search them)."""
    load_plugins()
    return list(_suite_paths)


def plugin_errors() -> list[PluginError]:
    """Plugins that failed to load in this process, with the reason."""
    load_plugins()
    return list(_errors)


def suite_files(paths: Iterable[Path]) -> list[Path]:
    """The suite YAML files among ``paths`` (folders are searched one level deep)."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    return files
