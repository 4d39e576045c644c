"""Runs say what they are doing, in one format, and resume only what they started.

* ``eval --resume`` with other sampling settings, policy or a lower ``--limit`` is refused with ``field: old -> new``
  and the fix; ``--force`` records the change in the run directory.
* A tiny ``train`` run and an ``hf:`` evaluation write every log line as ``HH:MM:SS LEVEL name: message``, metrics as
  ``key=value`` (never a dict repr), no library FutureWarning (even under ``-W always``, where transformers warns on
  every forward call) and the template-fork note at most once.
* ``make quickstart`` installs nothing when everything it imports is there, and says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.cli import main

REPO = Path(__file__).resolve().parents[2]
#: the one log line format: time, level, logger short name, message
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: ")


def _eval(out: Path, *extra: str, limit: int = 2) -> int:
    return main(["eval", "--suite", "games-maze", "--policy", "reference", "--limit", str(limit), "--out", str(out),
                 "--no-progress", *extra])


def test_eval_resume_with_other_settings_is_refused_with_the_diff(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert _eval(out) == 0
    before = (out / "trajectories.jsonl").read_bytes()
    capsys.readouterr()
    assert _eval(out, "--resume", "--temperature", "0.7", "--max-tokens", "64") == 2
    err = capsys.readouterr().err
    assert "  sampling.temperature: 0.0 -> 0.7\n" in err and "  sampling.max_tokens: 256 -> 64\n" in err
    assert "--force" in err and "new --out directory" in err
    assert (out / "trajectories.jsonl").read_bytes() == before and not (out / "resume_changes.jsonl").exists()

    assert _eval(out, "--resume", limit=1) == 2, "a lower --limit would leave episodes the summary does not claim"
    assert "  limit: 2 -> 1\n" in capsys.readouterr().err
    assert _eval(out, "--resume", limit=3) == 0, "a higher --limit extends the same run"

    assert _eval(out, "--resume", "--temperature", "0.7", "--force", limit=3) == 0
    record = json.loads((out / "resume_changes.jsonl").read_text())
    assert record["changes"] == [{"field": "sampling.temperature", "old": 0.0, "new": 0.7}]
    assert json.loads((out / "run.json").read_text())["sampling"]["temperature"] == 0.7
    assert _eval(out, "--force", limit=3) == 2 and "--force only applies to --resume" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.trainers.tiny_model import demonstration_texts

    small = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 100),
                            config=small)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, with every warning shown each time it is raised (``-W always``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-W", "always", "-m", "agentgym.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)


def _check_one_format(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "FutureWarning" not in stderr and "DeprecationWarning" not in stderr, stderr[-3000:]
    assert not re.search(r"\{'[\w/]+': ", stderr), "metrics printed as a Python dict"
    logged = [line for line in lines if LOG_LINE.match(line)]
    others = [line for line in lines if not LOG_LINE.match(line) and not line.startswith("agentgym ")]
    assert logged and not others, others[:5]
    return logged


def test_a_tiny_train_run_logs_in_one_format_without_foreign_warnings(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(f"trainer: grpo\nmodel: {tiny_model}\nsuite: games-calc\noutput_dir: {tmp_path / 'run'}\n"
                      "system_prompt: ''\nsteps: 3\ntasks_per_step: 2\ngroup_size: 4\neval_tasks: 4\neval_every: 2\n"
                      "checkpoint_every: 1\nmax_tokens_per_turn: 12\nmax_context_tokens: 128\ntensorboard: false\n"
                      "progress: false\n")
    result = _cli("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = _check_one_format(result.stderr)
    steps = [line for line in logged if " trainers.loop: step " in line]
    assert len([line for line in steps if "train/success_rate=" in line]) == 3, steps
    assert all(re.search(r"step [1-3]/3  train/success_rate=[\d.]+ +train/loss=", line) for line in steps
               if "train/" in line), steps
    assert sum("template" in line for line in logged) <= 1, "the template-fork note is said once per run"

    result = _cli("eval", "--suite", "games-calc", "--policy", f"hf:{tiny_model}", "--limit", "2", "--max-tokens",
                  "8", "--no-progress", "--out", str(tmp_path / "eval"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FutureWarning" not in result.stderr, "transformers warns on each forward call under -W always"


def test_make_quickstart_installs_nothing_when_everything_imports(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-s", "quickstart", f"PYTHON={sys.executable}", f"VENV={tmp_path / 'venv'}",
                             "QUICKSTART_ARGS=--help"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nothing to install" in result.stdout and "pip" not in result.stdout + result.stderr
    assert "agentgym.cli.quickstart" in result.stdout and "--out" in result.stdout
    assert not (tmp_path / "venv").exists(), "no environment is created when nothing is missing"
    assert time.perf_counter() - started < 120
