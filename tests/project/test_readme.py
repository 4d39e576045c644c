"""The README's Python snippets run verbatim against the current API (a user copies them first).

Every snippet lives in the "Use it" section, and each one there is run by a test below."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _use_it_snippets() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Use it"):]
    section = section[: section.index("\n## ", 1)]
    return _python_snippets(section)


def test_every_python_snippet_of_the_readme_is_one_these_tests_run() -> None:
    """A snippet added anywhere else in the README would go untested: put it in "Use it" with a test."""
    assert _python_snippets(README.read_text(encoding="utf-8")) == _use_it_snippets()
    assert len(_use_it_snippets()) == 2, "each Use-it snippet needs its own test below"


def _run(code: str, cwd: Path) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_the_env_snippet_prints_what_its_comments_say(tmp_path: Path) -> None:
    snippet = _use_it_snippets()[0]
    claimed = [line.split("# ", 1)[1].strip() for line in snippet.splitlines()
               if line.startswith("print(") and "# " in line]
    assert claimed, "the first snippet should say what it prints"
    assert [line.strip() for line in _run(snippet, tmp_path)] == claimed


def test_the_rollout_snippet_runs_on_a_trained_model_directory(tmp_path: Path) -> None:
    """Same code on a freshly built tiny model (the quickstart's figure needs its 3-minute training run)."""
    pytest.importorskip("torch")
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.rollout_defaults import save_rollout_defaults

    model_dir = tmp_path / "runs" / "quickstart" / "grpo" / "model"
    build_tiny_model(model_dir, config=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, vocab_size=400))
    save_rollout_defaults(model_dir, system_prompt="", max_tokens=24, suite="games-calc")
    snippet = _use_it_snippets()[1].replace("limit=100", "limit=4")
    printed = _run(snippet, tmp_path)
    assert 0.0 <= float(printed[-1]) <= 1.0
    assert (tmp_path / "runs" / "traj.jsonl").read_text(encoding="utf-8").count("\n") == 4
