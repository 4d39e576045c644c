"""Ctrl-C during a study: every process of the terminal's foreground group gets the signal once. The workers save
and stop, the study runner waits for them and says where each stopped, and ``agentgym study`` waits for the runner
instead of killing it. Real processes and real signals: the runs are stand-ins that only wait."""

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
from studies.run import run_jobs
from tests.helpers.interruptible import run_until_interrupted

if __name__ == "__main__":
    settings = argparse.Namespace(learning_rate=1e-5)
    jobs = [(method, 0, settings, sys.argv[1]) for method in ("grpo", "grpo_shuffled", "gigpo")]
    try:
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


#: SIGINT back to its default before the command starts, so Python installs its own Ctrl-C handler there whatever
#: the test runner's parent left it as (a shell's background job ignores SIGINT, and that is inherited)
_DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def _start(argv: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    # its own session, so the test can signal the whole group as a terminal's Ctrl-C does
    return subprocess.Popen([sys.executable, "-c", _DEFAULT_SIGINT, *argv[1:]], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path, start_new_session=True)


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT are POSIX")
def test_ctrl_c_lets_running_workers_save_and_reports_each_run(tmp_path: Path) -> None:
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT.format(repo=str(REPO), benchmarks=str(REPO / "benchmarks")))
    process = _start([sys.executable, str(script), str(tmp_path)], tmp_path)
    _wait_for([tmp_path / "grpo0.started", tmp_path / "grpo_shuffled0.started"])
    time.sleep(1.0)  # a pool that had queued the third run would have started it by now
    os.killpg(process.pid, signal.SIGINT)
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
    print("child saved", flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, save)
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
def test_agentgym_study_waits_for_its_interrupted_child(tmp_path: Path) -> None:
    process = _start([sys.executable, "-c", CLI.format(child=CHILD)], tmp_path)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "child ready"
    os.killpg(process.pid, signal.SIGINT)
    out, _ = process.communicate(timeout=30)
    assert "child saved" in out and "cli got 130" in out, out
    assert process.returncode == 130
