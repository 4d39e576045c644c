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
from pathlib import Path
from string import Template

from agentgym.errors import ConfigError

__all__ = ["render_env_package", "write_env_package"]

_NAME = re.compile(r"[a-z][a-z0-9_\-]{0,40}")

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "$title: an agentgym environment plugin"
requires-python = ">=3.11"
dependencies = ["agentgym"]

# agentgym reads these at import time: the env ids and the task suites of this package.
[project.entry-points."agentgym.envs"]
$package = "$package.registration:register"

[project.entry-points."agentgym.suites"]
$package = "$package.registration:suite_dirs"

[tool.setuptools]
packages = ["$package"]

[tool.setuptools.package-data]
$package = ["suites/*.yaml"]

[tool.pytest.ini_options]
pythonpath = ["."]
'''

_README = '''\
# $dist

An agentgym environment plugin: `$env_id` and the suite `$suite`.

    pip install -e .            # agentgym list now shows $env_id; gym.make("agentgym:$env_id") works
    python -m pytest -q         # check_agent_env (contract, determinism, fuzz, reward rule) and validate()
    agentgym eval --suite $suite --policy reference

Edit `$package/env.py` (the tools, the task sampler, the reference solver) and keep the tests green.
'''

_INIT = '''\
"""$title: an agentgym environment plugin (the env lives in $package.env, imported only by gym.make)."""
'''

_REGISTRATION = '''\
"""What agentgym reads at import time (entry points in pyproject.toml). Keep this module light: the env module
is named by a string and imported only when the env is made."""

from pathlib import Path


def register() -> list[dict[str, str]]:
    """The env ids of this package (agentgym registers them with Gymnasium)."""
    return [{"id": "$env_id", "entry_point": "$package.env:$cls",
             "description": "$title: say the word you are given."}]


def suite_dirs() -> list[Path]:
    """Folders of suite YAML files (agentgym list, load_suite("$suite"))."""
    return [Path(__file__).parent / "suites"]
'''

_ENV = '''\
"""$title: say the word you are given. Replace the task and the tools with your own."""

import random

from agentgym import AgentEnv, Task, ToolSet, tool

# Held out means never trained on: the test split draws from words the training split cannot contain.
WORDS = {"train": ["apple", "river", "stone", "cloud", "tiger", "maple", "piano", "lemon"], "test": ["ocean", "zebra"]}


def make_tasks(rng: random.Random, count: int, words: str = "train") -> list[Task]:
    """The task sampler: ``count`` tasks drawn from ``rng`` out of the ``words`` list (a suite file calls it once
    per split, with that split's options)."""
    drawn = [rng.choice(WORDS[words]) for _ in range(count)]
    return [Task(id=f"say-{i}", prompt=f"Say the word {w}.", answer=w) for i, w in enumerate(drawn)]


class $cls(AgentEnv):
    description = "$title: say the word you are given."

    @tool
    def answer(self, text: str) -> str:
        """Say the word; this ends the episode.

        Args:
            text: The word.
        """
        self.mark_answer()
        self.finish(success=text.strip().lower() == self.task.answer)  # score 1.0 or 0.0, paid as the reward
        return f"The word was {self.task.answer}."

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.answer])

    def _sample_task(self, rng) -> Task:  # rng is self.np_random, so episodes replay from their seed
        return make_tasks(random.Random(int(rng.integers(2**31))), 1)[0]

    def _begin_episode(self, task: Task) -> str:
        return task.prompt

    def _task_instructions(self) -> str:
        return "Call answer with the word you are asked to say."

    def reference_solver(self):
        return lambda observation: f'answer("{self.task.answer}")'
'''

_SUITE = '''\
# The suite of $env_id: tasks generated from the seed, a training and a held-out split.
# entry_point registers the env when the suite is loaded by path without the package installed.
name: $suite
version: 1
env: $env_id
entry_point: $package.env:$cls
generator: $package.env:make_tasks
seed: 0
env_kwargs: {max_turns: 3}
splits:
  train: {count: 40, words: train}
  test: {count: 10, words: test}
'''

_TESTS = '''\
"""The env honours the agentgym contract and its reference solver solves every task of the suite."""

from pathlib import Path

from agentgym import load_suite
from agentgym.testing import check_agent_env

SUITE = Path(__file__).resolve().parents[1] / "$package" / "suites" / "$suite.yaml"


def test_env_contract() -> None:
    suite = load_suite(str(SUITE))
    check_agent_env(suite.env_id, fuzz_examples=30, env_kwargs=dict(suite.env_kwargs))


def test_suite_is_solvable() -> None:
    report = load_suite(str(SUITE)).validate()
    assert report.ok, report
'''


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
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"{package}/__init__.py": _INIT,
        f"{package}/registration.py": _REGISTRATION,
        f"{package}/env.py": _ENV,
        f"{package}/suites/{name}.yaml": _SUITE,
        "tests/test_env.py": _TESTS,
    }
    return {path: Template(text).substitute(values) for path, text in files.items()}


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
