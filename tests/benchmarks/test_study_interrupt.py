"""Stopping a study: a terminal's Ctrl-C, a SIGINT or SIGTERM to the runner alone, or to ``agentgym study``. Each
worker hears one SIGINT from the runner, saves and stops; the runner waits for them and says where each stopped,
and ``agentgym study`` waits for the runner instead of killing it. Real processes and real signals: the runs are
stand-ins that only wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.scripts import REPO

POOL_SCRIPT = """
import argparse, sys
sys.path[:0] = [{repo!r}, {benchmarks!r}]
from studies.run import run_jobs, sigterm_as_ctrl_c
from tests.helpers.interruptible import run_until_interrupted

if __name__ == "__main__":
    settings = argparse.Namespace(learning_rate=1e-5)
    jobs = [(method, 0, settings, sys.argv[1]) for method in ("grpo", "grpo_shuffled", "gigpo")]
    try:
        with sigterm_as_ctrl_c():
            run_jobs(jobs, ("study", "goal"), "model", 2, [], train=run_until_interrupted)
    except KeyboardInterrupt as stopped:
        print("runner interrupted:", stopped, flush=True)
        raise SystemExit(130)
"""


def _wait_for(paths: list[Path], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never appeared: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.1)


#: SIGINT set before the command starts (``SIG_DFL``: Python installs its own Ctrl-C handler there whatever the test
#: runner's parent left it as; ``SIG_IGN``: as a shell's background job starts it, which is inherited)
_WITH_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, getattr(signal, sys.argv[1])); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")


def _start(argv: list[str], tmp_path: Path, sigint: str = "SIG_DFL") -> subprocess.Popen[str]:
    # its own session, so the test can signal the whole group as a terminal's Ctrl-C does
    return subprocess.Popen([sys.executable, "-c", _WITH_SIGINT, sigint, *argv[1:]], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path, start_new_session=True)


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT are POSIX")
@pytest.mark.parametrize(("sent", "to_group", "sigint"), [
    ("SIGINT", True, "SIG_DFL"),  # a terminal's Ctrl-C: every process of the foreground group
    ("SIGINT", False, "SIG_DFL"),  # kill -INT PID: the runner only
    ("SIGTERM", False, "SIG_DFL"),  # kill PID, a scheduler's time limit
    ("SIGTERM", False, "SIG_IGN"),  # the same to a runner started as a shell's background job
], ids=["ctrl-c", "sigint-to-runner", "sigterm-to-runner", "sigterm-to-background-runner"])
def test_a_stopped_study_lets_running_workers_save_and_reports_each_run(tmp_path: Path, sent: str, to_group: bool,
                                                                         sigint: str) -> None:
    """However the runner is stopped, each worker hears one SIGINT: the runs under way save and stop, and the run
    not started yet never starts."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT.format(repo=str(REPO), benchmarks=str(REPO / "benchmarks")))
    process = _start([sys.executable, str(script), str(tmp_path)], tmp_path, sigint)
    _wait_for([tmp_path / "grpo0.started", tmp_path / "grpo_shuffled0.started"])
    time.sleep(1.0)  # a pool that had queued the third run would have started it by now
    (os.killpg if to_group else os.kill)(process.pid, getattr(signal, sent))
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 130, out
    assert (tmp_path / "grpo0.saved").exists() and (tmp_path / "grpo_shuffled0.saved").exists()
    assert not (tmp_path / "gigpo0.started").exists(), "the run not started yet is dropped, not started after Ctrl-C"
    assert "waiting for 2 run(s) under way" in out, out
    assert f"grpo seed 0: interrupted at step 2/5; checkpoint saved in {tmp_path / 'grpo0'}" in out
    assert "grpo_shuffled seed 0: interrupted at step 2/5" in out and "runner interrupted" in out


CHILD = """
import signal, sys, time
def save(signum, frame):
    time.sleep(0.5)  # longer than subprocess.run's grace before it kills its child
    print("child saved on", signal.Signals(signum).name, flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, save)
signal.signal(signal.SIGTERM, save)
print("child ready", flush=True)
time.sleep(60)
"""

CLI = """
import subprocess, sys
from agentgym.cli.study import wait_through_interrupts
child = subprocess.Popen([sys.executable, "-c", {child!r}])
code = wait_through_interrupts(child)
print("cli got", code, flush=True)
sys.exit(code)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT are POSIX")
@pytest.mark.parametrize(("sent", "to_group"), [("SIGINT", True), ("SIGTERM", False)], ids=["ctrl-c", "sigterm"])
def test_agentgym_study_waits_for_its_interrupted_child(tmp_path: Path, sent: str, to_group: bool) -> None:
    """A Ctrl-C reaches the child itself; a SIGTERM to ``agentgym study`` alone is passed on to it. Either way the
    command waits while the child saves."""
    process = _start([sys.executable, "-c", CLI.format(child=CHILD)], tmp_path)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "child ready"
    (os.killpg if to_group else os.kill)(process.pid, getattr(signal, sent))
    out, _ = process.communicate(timeout=30)
    assert f"child saved on {sent}" in out and "cli got 130" in out, out
    assert process.returncode == 130
