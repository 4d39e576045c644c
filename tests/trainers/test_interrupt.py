"""Ctrl-C during ``agentgym train``: the run stops within about a second, keeps a checkpoint (of a BC warm start
too), prints the command that resumes it and no traceback; running that command continues where it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "quickstart_calc.yaml")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.trainers.tiny_model import demonstration_texts

    shape = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 40),
                            config=shape)


def _args(model: Path, out: Path, *extra: str) -> list[str]:
    base = {"model": str(model), "bc_demos": 8, "bc_batch_size": 4, "tasks_per_step": 2, "group_size": 2,
            "eval_tasks": 2, "progress": "false", "tensorboard": "false", "checkpoint_every": 0}
    args = [sys.executable, "-m", "agentgym.cli", "train", CONFIG, "--output-dir", str(out)]
    for key, value in base.items():
        args += ["--set", f"{key}={value}"]
    return args + list(extra)


def _interrupt_after(args: list[str], marker: str) -> tuple[int, float, str]:
    """Run ``args``, send SIGINT once a stderr line holds ``marker``; (exit status, seconds to exit, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTGYM_CPU_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell may ignore it
    seen = []
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if marker in line:
                break
        else:
            pytest.fail("the run ended before " + repr(marker) + ":\n" + "".join(seen[-30:]))
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()  # type: ignore[union-attr]
        proc.wait(timeout=120)
        return proc.returncode, time.perf_counter() - sent, "".join(seen) + rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_during_bc_saves_its_steps_and_the_resume_continues_them(small_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, seconds, err = _interrupt_after(_args(small_model, out, "--set", "bc_steps=100000", "--set", "steps=1"),
                                          "BC step 26/100000")
    assert code == 130, err[-3000:]
    assert "Traceback" not in err
    assert seconds < 5.0, f"took {seconds:.1f} s to stop"  # about a second on a busy 2-core machine
    checkpoint = out / "checkpoints" / "step-000000"
    state = json.loads((checkpoint / "state.json").read_text())
    done = state["bc_steps_done"]
    assert done >= 26 and (checkpoint / "model" / "config.json").is_file()
    assert f"interrupted at BC warm start step {done}; checkpoint saved in {checkpoint}" in err
    resume = next(line for line in err.splitlines() if line.startswith("resume with: "))[len("resume with: "):]
    assert resume.startswith(f"agentgym train {CONFIG} ") and "bc_steps=100000" in resume

    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTGYM_CPU_THREADS": "1"}
    # a shorter warm start and run is another config: refused without --force (the resume command keeps the flags)
    again = subprocess.run(_args(small_model, out, "--set", f"bc_steps={done + 3}", "--set", "steps=1", "--force"),
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    changed = {c["field"] for c in json.loads((out / "resume_changes.jsonl").read_text())["changes"]}
    assert changed == {"bc_steps"}, changed
    assert f"continuing the interrupted BC warm start at step {done}/{done + 3}" in again.stderr
    assert f"BC step {done + 3}/{done + 3}" in again.stderr  # the remaining steps ran, not the whole warm start
    summary = json.loads((out / "summary.json").read_text())
    assert "bc" in summary and summary["resumed_from"].endswith("step-000000")


def test_ctrl_c_during_rl_steps_saves_the_completed_steps(small_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, seconds, err = _interrupt_after(_args(small_model, out, "--warmstart", "none", "--set", "steps=1000"),
                                          "trainers.loop: step    1/1000  train/success_rate=")
    assert code == 130 and "Traceback" not in err, err[-3000:]
    assert seconds < 5.0, f"took {seconds:.1f} s to stop"
    latest = (out / "checkpoints" / "latest").read_text().strip()
    step = json.loads((out / "checkpoints" / latest / "state.json").read_text())["step"]
    assert step >= 1 and "bc_steps_done" not in json.loads((out / "checkpoints" / latest / "state.json").read_text())
    assert f"interrupted at step {step}/1000; checkpoint saved in {out / 'checkpoints' / latest}" in err
    assert "resume with: agentgym train" in err and "--warmstart none" in err
