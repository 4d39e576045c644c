"""Packaging: every sub-package is installed under the agentgym namespace, with suite data."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAPPED = {"agentgym": "agentgym", "envs": "agentgym.envs", "tools": "agentgym.tools",
          "trainers": "agentgym.trainers", "tasks": "agentgym.tasks"}


def _packages_on_disk() -> set[str]:
    found = set()
    for folder, dotted in MAPPED.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([dotted, *rel.parts]))
    return found


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    missing = _packages_on_disk() - listed
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_wheel_contains_namespaced_packages_and_suites(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("agentgym-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "agentgym/envs/games/calculator.py" in names
    assert "agentgym/suite.py" in names and "agentgym/tasks/__init__.py" in names
    assert "agentgym/tasks/suites/games-calc.yaml" in names
    assert not any(n.startswith(("envs/", "tasks/", "tools/", "trainers/")) for n in names)
