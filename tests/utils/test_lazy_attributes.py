"""agentgym.utils.lazy: package attributes imported on first use, listed by dir(), misspellings suggested."""

from __future__ import annotations

import sys
import types

import pytest

from agentgym.errors import ConfigError
from agentgym.utils.lazy import lazy_attributes


def _package(attributes: dict[str, str]) -> types.ModuleType:
    module = types.ModuleType("agentgym_test_lazy_pkg")
    module.__getattr__, module.__dir__ = lazy_attributes(module.__name__, attributes)  # type: ignore[method-assign]
    sys.modules[module.__name__] = module
    return module


def test_names_resolve_from_their_module_and_show_in_dir() -> None:
    package = _package({"dumps": "json", "loads_json": "json:loads", "Path": "pathlib"})
    try:
        import json
        import pathlib

        assert package.dumps is json.dumps and package.loads_json is json.loads and package.Path is pathlib.Path
        assert {"dumps", "loads_json", "Path"} <= set(dir(package))
    finally:
        del sys.modules[package.__name__]


def test_an_unknown_name_says_did_you_mean() -> None:
    package = _package({"dumps": "json"})
    try:
        with pytest.raises(AttributeError, match=r"has no attribute 'dump'\. Did you mean 'dumps'\?"):
            package.dump  # noqa: B018
        with pytest.raises(AttributeError, match=r"has no attribute '__wrapped__'$"):
            package.__wrapped__  # noqa: B018
    finally:
        del sys.modules[package.__name__]


def test_a_malformed_target_fails_when_the_package_loads() -> None:
    with pytest.raises(ConfigError, match="package.module:attribute"):
        lazy_attributes("pkg", {"x": "json:"})
    with pytest.raises(ConfigError, match="package.module"):
        lazy_attributes("pkg", {"x": ":loads"})
