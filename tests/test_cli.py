"""The command line as a user runs it: list, eval, play, view, and clear errors for bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym.cli import main


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentgym.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_list_prints_every_id(capsys: pytest.CaptureFixture[str]) -> None:
    import agentgym

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in agentgym.env_ids():
        assert env_id in out
    assert "games-calc" in out


def test_eval_reference_writes_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "eval"
    assert main(["eval", "--suite", "games-maze", "--policy", "reference", "--limit", "5", "--out", str(out_dir),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "success rate" in printed and "1.000" in printed
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["episodes"] == 5 and summary["success_rate"] == 1.0
    assert len((out_dir / "trajectories.jsonl").read_text().splitlines()) == 5
    report = (out_dir / "report.html").read_text()
    assert "<html" in report and "final observation" in report
    assert main(["view", str(out_dir / "trajectories.jsonl"), "--limit", "1"]) == 0
    assert "final observation" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--suite", "games-calk", "--policy", "reference"], "Did you mean 'games-calc'"),
        (["eval", "--suite", "games-calc", "--policy", "gpt:foo"], "Unknown policy spec"),
        (["eval", "--suite", "games-calc", "--policy", "hf:/no/such/dir"], "/no/such/dir"),
        (["eval", "--suite", "games-calc", "--policy", "reference", "--split", "dev"], "no split 'dev'"),
        (["play", "agentgym/GuessNumbr-v0"], "Did you mean"),
        (["view", "/no/such/file.jsonl"], "No trajectory file"),
    ],
)
def test_bad_arguments_exit_2_with_a_fix(args: list[str], message: str) -> None:
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["eval", "--suite", "games-calc", "--policy", "reference", "--limit", "0"],
                                  ["eval", "--suite", "games-calc", "--policy", "reference", "--temperature", "-1"]])
def test_argparse_validation(args: list[str]) -> None:
    result = _run(*args)
    assert result.returncode == 2 and "expected" in result.stderr


def test_play_in_the_terminal() -> None:
    result = _run("play", "agentgym/GuessNumber-v0", "--seed", "3", stdin="hello\nguess(50)\n:q\n")
    assert result.returncode == 0, result.stderr
    assert "[void]" in result.stdout and "[tool_call]" in result.stdout and "bye" in result.stdout
