"""Entry-point plugins: a package installed with pip adds env ids and suites; a broken one is skipped.

The end-to-end test builds and installs ``examples/plugin`` (the ``agentgym new-env`` skeleton) into a
temporary virtualenv that sees this machine's packages, beside a broken plugin, and drives it from a fresh
interpreter: ``agentgym list``, ``gym.make("agentgym:...")``, ``load_suite`` and the light-import rule.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

from agentgym.registration import plugins
from agentgym.cli.scaffold import render_env_package

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _write_broken_plugin(root: Path) -> Path:
    """A package whose env entry point names a module that does not exist, and whose suite function raises."""
    (root / "broken_plugin").mkdir(parents=True)
    (root / "broken_plugin" / "__init__.py").write_text(
        "def suites():\n    raise RuntimeError('suite folder went missing')\n", encoding="utf-8")
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "broken-plugin"
        version = "0.0.1"
        [project.entry-points."agentgym.envs"]
        broken = "broken_plugin.no_such_module:register"
        [project.entry-points."agentgym.suites"]
        broken = "broken_plugin:suites"
        [tool.setuptools]
        packages = ["broken_plugin"]
        """), encoding="utf-8")
    return root


def test_examples_plugin_is_the_new_env_skeleton() -> None:
    """examples/plugin is exactly what ``agentgym new-env say-word`` writes (regenerate it when the template
    changes: ``agentgym new-env say-word --dir examples/plugin --force``)."""
    files = render_env_package("say-word")
    on_disk = {str(p.relative_to(PLUGIN)): p.read_text(encoding="utf-8") for p in PLUGIN.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)}
    assert on_disk == files


def test_broken_plugin_in_process_is_reported_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real distribution metadata on sys.path (no install): every failure mode is logged, none raises."""
    dist = tmp_path / "site" / "broken_plugin-0.0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(
        "[agentgym.envs]\nmissing = broken_plugin_missing:register\nbadreturn = json:dumps\n"
        "[agentgym.suites]\nnofolder = builtins:divmod\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    before = set(gym.registry)
    try:
        plugins.load_plugins(reload=True)
        errors = {e.name: e.error for e in plugins.plugin_errors()}
        assert set(errors) == {"missing", "badreturn", "nofolder"}, errors
        assert "ModuleNotFoundError" in errors["missing"] and "broken_plugin_missing" in errors["missing"]
        assert "TypeError" in errors["badreturn"]
        assert set(gym.registry) == before
    finally:
        monkeypatch.undo()
        plugins.load_plugins(reload=True)
    assert plugins.plugin_errors() == []


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv over this interpreter's packages, with examples/plugin and a broken plugin installed.

    ``--without-pip``: the venv then uses this interpreter's pip and setuptools, not the old ones ensurepip
    bundles (which lack ``bdist_wheel``), so the build needs no network."""
    root = tmp_path_factory.mktemp("plugin-venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root / "venv")],
                   check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    src = root / "src"
    shutil.copytree(PLUGIN, src / "say-word", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    _write_broken_plugin(src / "broken")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           str(src / "say-word"), str(src / "broken")], capture_output=True, text=True, timeout=300,
                          env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


def test_installed_plugin_is_listed_made_and_its_suite_loads(venv: Path) -> None:
    proc = subprocess.run([str(venv), "-m", "agentgym.cli", "list"], capture_output=True, text=True, timeout=120,
                          env={**ENV, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "say_word/SayWord-v0" in proc.stdout and "plugin:say_word" in proc.stdout
    assert "say-word" in proc.stdout.split("suites:")[1]
    assert "skipped a broken plugin" in proc.stdout and "broken_plugin.no_such_module" in proc.stdout
    code = textwrap.dedent("""\
        import json, sys
        import gymnasium as gym
        import agentgym
        heavy = [m for m in ("torch", "transformers", "vllm", "playwright", "docker", "ray", "say_word.env")
                 if m in sys.modules]
        env = gym.make("agentgym:say_word/SayWord-v0")
        obs, info = env.reset(seed=0)
        word = obs.split()[-1].rstrip(".")
        _, reward, terminated, _, step = env.step(f'answer("{word}")')
        suite = agentgym.load_suite("say-word")
        print(json.dumps({"heavy": heavy, "obs": obs, "reward": reward, "terminated": terminated,
                          "outcome": step["outcome"], "suite": [suite.name, len(suite.train), len(suite.test)],
                          "valid": suite.validate(limit=5).ok,
                          "errors": [str(e) for e in agentgym.registration.plugins.plugin_errors()]}))
        """)
    proc = subprocess.run([str(venv), "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [], "import agentgym must not import heavy modules or the plugin's env module"
    assert out["obs"].startswith("Say the word ") and out["terminated"] and out["reward"] == 1.0
    assert out["outcome"]["success"] is True
    assert out["suite"] == ["say-word", 40, 10] and out["valid"] is True
    assert len(out["errors"]) == 2 and all("broken" in e for e in out["errors"])
