"""``eval --suite`` and ``serve-env`` take env ids as ``play`` does: ids a suite YAML registers, with a "did you
mean" for the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agentgym.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_eval_takes_the_env_id_of_a_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--suite", "agentgym/Calculator-v0", "--policy", "reference", "--limit", "2",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["suite"] == "games-calc"
    assert "agentgym/Calculator-v0 is an env id; evaluating its suite 'games-calc'" in capsys.readouterr().err


def test_eval_names_the_suites_of_an_env_that_has_several(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--suite", "agentgym/Maze-v0", "--policy", "reference"]) == 2
    err = capsys.readouterr().err
    assert "these suites run in it: credit-maze, games-maze" in err


def test_eval_suggests_the_env_id_meant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--suite", "agentgym/Mazee-v0", "--policy", "reference"]) == 2
    assert "Did you mean 'agentgym/Maze-v0'" in capsys.readouterr().err


def test_serve_env_suggests_the_id_meant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-env", "agentgym/Mazee-v0"]) == 2
    assert "Did you mean 'agentgym/Maze-v0'" in capsys.readouterr().err
    assert main(["serve-env", "examples/Reverse-v0"]) == 2
    assert "--suite PATH.yaml" in capsys.readouterr().err


def test_serve_env_serves_an_env_a_suite_yaml_registers(tmp_path: Path) -> None:
    log = tmp_path / "serve-env.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "agentgym.cli", "serve-env", "examples/Reverse-v0",
                                    "--suite", str(REPO / "examples" / "reverse.yaml"), "--port", "0"],
                                   stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 180
        while "env server" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        line = log.read_text()
        assert "agentgym env server: examples/Reverse-v0 on http://" in line, line
        url = line.split(" on ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            assert response.status == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
