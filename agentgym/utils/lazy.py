"""Package attributes that import their module on first use (PEP 562 module ``__getattr__``).

Why: a package's front door (``from agentgym.policies import HFPolicy``, ``from agentgym.tools.retrieval import
DenseRetriever``) should not cost the heavy imports of every backend behind it (torch, Playwright, a search
index) when a caller wants one of them, or none. A package lists its lazy names once and gets both module hooks:

    __getattr__, __dir__ = lazy_attributes(__name__, {"HFPolicy": "agentgym.policies.hf"})

so ``dir()`` and tab completion show the lazy names, and a misspelt name gets a "did you mean".
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

__all__ = ["lazy_attributes"]


def lazy_attributes(module_name: str, attributes: Mapping[str, str]) -> tuple[Callable[[str], Any],
                                                                               Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` serving ``attributes`` from the modules that define them.

    Args:
        module_name: The package's ``__name__`` (named in error messages, and whose globals ``__dir__`` lists).
        attributes: Attribute name -> ``"module.path"`` (the attribute of the same name there) or
            ``"module.path:attr"`` (another name there). The module is imported when the attribute is first
            read; nothing is imported before.

    Returns:
        ``(__getattr__, __dir__)``: assign both at the package's module level.

    Raises:
        ConfigError: An entry names its module badly (an empty path or attribute), found when the package loads.
    """
    targets: dict[str, tuple[str, str]] = {}
    for name, spec in attributes.items():
        path, _, attr = spec.partition(":")
        if not path or (":" in spec and not attr):
            raise ConfigError(f"Lazy attribute {name!r} of {module_name} points at {spec!r}; write 'package.module' "
                              "or 'package.module:attribute'.")
        targets[name] = (path, attr or name)

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            if name.startswith("__"):  # hooks Python probes for (__path__, __wrapped__, ...): no suggestion
                raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
            known = [n for n in __dir__() if not n.startswith("_")]
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}.{did_you_mean(name, known)}")
        path, attr = target
        return getattr(importlib.import_module(path), attr)

    def __dir__() -> list[str]:
        module = sys.modules.get(module_name)
        return sorted(set(vars(module) if module is not None else ()) | set(targets))

    return __getattr__, __dir__
