"""The command line as a user runs it: list, eval, play, view, and clear errors for bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentgym.cli import main


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh working directory, so default ``runs/...`` outputs never land in the repository."""
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-m", "agentgym.cli", *args], input=stdin, capture_output=True,
                              text=True, timeout=120, cwd=cwd)


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


def test_a_bad_policy_leaves_no_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--suite", "games-calc", "--policy", "hf:/no/such/dir", "--no-progress"]) == 2
    assert not (tmp_path / "runs").exists()


def test_default_out_dirs_of_runs_in_the_same_second_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.cli import evaluate as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli.time, "strftime", lambda _fmt: "20261124-050000")
    first = cli._new_default_out_dir("games-calc")
    first.mkdir(parents=True)
    second = cli._new_default_out_dir("games-calc")
    assert first != second and second.name == f"{first.name}-2"


@pytest.mark.parametrize("args", [["eval", "--suite", "games-calc", "--policy", "reference", "--limit", "0"],
                                  ["eval", "--suite", "games-calc", "--policy", "reference", "--temperature", "-1"]])
def test_argparse_validation(args: list[str]) -> None:
    result = _run(*args)
    assert result.returncode == 2 and "expected" in result.stderr


def test_play_in_the_terminal() -> None:
    result = _run("play", "agentgym/GuessNumber-v0", "--seed", "3", stdin="hello\nguess(50)\n:q\n")
    assert result.returncode == 0, result.stderr
    assert "[void]" in result.stdout and "[tool_call]" in result.stdout and "bye" in result.stdout


def _eval(out_dir: Path, *extra: str, limit: int = 2) -> int:
    return main(["eval", "--suite", "games-maze", "--policy", "reference", "--limit", str(limit), "--out", str(out_dir),
                 "--no-progress", *extra])


def _episodes(out_dir: Path) -> list[tuple[str, int | None]]:
    from agentgym.storage import read_trajectories

    return [(t.task_id, t.seed) for t in read_trajectories(out_dir / "trajectories.jsonl")]


def test_eval_refuses_an_existing_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "run"
    assert _eval(out_dir) == 0
    before = (out_dir / "trajectories.jsonl").read_bytes()
    assert _eval(out_dir) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--resume" in err and "--overwrite" in err
    assert (out_dir / "trajectories.jsonl").read_bytes() == before, "a refused run must not touch the old one"
    result = _run("eval", "--suite", "games-maze", "--policy", "reference", "--out", str(out_dir), "--resume",
                  "--overwrite")
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


def test_eval_resume_runs_only_missing_episodes(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    assert _eval(out_dir, limit=2) == 0
    first = _episodes(out_dir)
    with (out_dir / "trajectories.jsonl").open("ab") as fh:  # the first run was killed mid-write
        fh.write(b'{"schema_version": 1, "env_id": "agentgym/Ma')
    assert _eval(out_dir, "--resume", limit=4) == 0
    episodes = _episodes(out_dir)
    assert episodes[:2] == first and len(episodes) == 4 and len(set(episodes)) == 4, episodes
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["success_rate"] == 1.0
    assert _eval(out_dir, "--resume", limit=4) == 0 and len(_episodes(out_dir)) == 4, "nothing left to run"
    assert main(["eval", "--suite", "games-maze", "--policy", "reference", "--limit", "4", "--out", str(out_dir),
                 "--no-progress", "--resume", "--seed", "7"]) == 2, "a different seed is a different run"


def test_eval_overwrite_replaces_the_previous_results(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    assert _eval(out_dir, limit=3) == 0
    (out_dir / "notes.txt").write_text("mine")
    assert _eval(out_dir, "--overwrite", limit=1) == 0
    assert len(_episodes(out_dir)) == 1
    assert json.loads((out_dir / "summary.json").read_text())["episodes"] == 1
    assert (out_dir / "notes.txt").read_text() == "mine", "--overwrite deletes only the run's own files"
