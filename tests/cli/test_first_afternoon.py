"""A researcher's first afternoon: the config reference (``train --help-config``), unknown flags answered with the
subcommand's usage and a hint, and ``play`` on envs a suite YAML registers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentgym.cli import main

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-m", "agentgym.cli", *args], input=stdin, capture_output=True,
                              text=True, timeout=120, cwd=cwd, env={**__import__("os").environ,
                                                                    "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("trainer", ["grpo", "gigpo", "arpo", "archer", "filtered_bc"])
def test_help_config_lists_every_field_with_its_default_and_doc(trainer: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.trainers.config_reference import config_class

    assert main(["train", "--help-config", trainer]) == 0
    out = capsys.readouterr().out
    cls = config_class(trainer)
    for key in cls.config_keys():
        assert f"\n  {key}: " in out, key
    assert "(undocumented)" not in out
    defaults = cls(model="m", suite="s", eval_split="t") if trainer != "archer" else None
    if defaults is not None:
        assert f"\n  learning_rate: float = {defaults.learning_rate!r}\n" in out
    assert "\n  cpu_threads: int | None = null\n      Torch threads of this process on a CPU" in out
    assert "\n  model: str = required\n" in out and "tiny:<suite>" in out


def test_help_config_of_an_unknown_trainer_says_which_exist(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help-config", "grpoo"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'grpo'" in err and "filtered_bc" in err


def test_the_docs_carry_the_same_reference_in_their_nav() -> None:
    from agentgym.trainers.config_reference import field_docs, markdown_reference
    from agentgym.trainers.config import GigpoConfig

    page = (REPO / "docs" / "trainers" / "config-reference.md").read_text(encoding="utf-8")
    assert page == markdown_reference()  # regenerate with: python docs/generate.py
    assert "Config reference: trainers/config-reference.md" in (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    omega = next(d for d in field_docs(GigpoConfig) if d.name == "omega")
    assert f"| `omega` | `float` | `1.0` | {' '.join(omega.doc.split())} |" in page
    assert {f.name for f in dataclasses.fields(GigpoConfig)} <= {d.name for d in field_docs(GigpoConfig)}


def test_an_unknown_flag_gets_the_subcommands_usage_and_the_fix() -> None:
    result = _run("train", "--steps", "5")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: agentgym train")  # not the top-level usage
    assert "unrecognized arguments: --steps" in result.stderr and "--set steps=5" in result.stderr
    result = _run("play", "agentgym/GuessNumber-v0", "--sed", "3")
    assert result.returncode == 2 and result.stderr.startswith("usage: agentgym play")
    assert "Did you mean '--seed'" in result.stderr


def test_play_takes_an_env_a_suite_yaml_registers() -> None:
    suite = str(REPO / "examples" / "reverse.yaml")
    for args in (("examples/Reverse-v0", "--suite", suite), (suite, "--split", "train", "--task", "3")):
        result = _run("play", *args, stdin=":q\n")
        assert result.returncode == 0, result.stderr
        assert "== examples/Reverse-v0 (task " in result.stdout and "Reverse the word" in result.stdout
        assert "bye" in result.stdout and "Traceback" not in result.stderr
    assert "(task train-00003)" in result.stdout


@pytest.mark.parametrize("env_id", ["examples/Reverse-v0", "Reverse-v0"])
def test_play_an_unregistered_id_fails_in_one_line_with_the_way_out(env_id: str) -> None:
    result = _run("play", env_id)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"Unknown environment id {env_id!r}" in result.stderr and "--suite" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_play_a_misspelled_shipped_suite_suggests_it() -> None:
    result = _run("play", "games-calc", "--task", "99999")
    assert result.returncode == 2 and "--task 99999" in result.stderr and "Traceback" not in result.stderr
