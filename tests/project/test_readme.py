"""The README's snippets work as copied (a user copies them first).

Every Python snippet lives in the "Use it" section and each one there runs verbatim in a test below; every
``agentgym`` command line parses with the real CLI, and the reference-policy eval runs as written."""

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


def _command_lines() -> list[str]:
    """Every ``agentgym ...`` line of the README's bash blocks, without its trailing comment."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("agentgym ")]


def test_every_agentgym_command_of_the_readme_parses_as_written() -> None:
    """A renamed command or flag fails here, not in a newcomer's terminal (``...`` stands for a run's folder)."""
    import shlex

    from agentgym.cli.main import build_parser

    commands = _command_lines()
    assert len(commands) >= 8, commands
    parser = build_parser()
    for line in commands:
        try:
            parser.parse_args(shlex.split(line)[1:])
        except SystemExit:
            pytest.fail(f"the README's command does not parse: {line}")


def test_the_readmes_reference_eval_runs_as_written(tmp_path: Path) -> None:
    line = next(c for c in _command_lines() if "--policy reference" in c)
    result = subprocess.run([sys.executable, "-m", "agentgym.cli", *line.split()[1:]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "success" in result.stdout.lower()
