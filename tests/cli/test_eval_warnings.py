"""``agentgym eval`` says so when a run's failures look like a setting (prompt, token budget), not the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentgym.cli import main
from agentgym.cli.eval_warnings import run_warnings
from agentgym.trajectory import Trajectory, Turn


def _eval(tmp_path: Path, policy: str, *flags: str) -> dict[str, Any]:
    out = tmp_path / "run"
    assert main(["eval", "--suite", "games-calc", "--policy", policy, "--limit", "4", "--out", str(out),
                 "--no-progress", *flags]) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose context the env's instructions alone overflow, and which records no training settings."""
    pytest.importorskip("torch")
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("short") / "model", config=TinyModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=400,
        max_position_embeddings=96))


def test_a_run_that_ends_at_the_context_limit_names_the_cause_and_the_fix(
        short_context_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The served model refuses the env's instructions as longer than its context: every episode ends at once."""
    pytest.importorskip("fastapi")
    from agentgym.serving.openai_server import ServerThread

    with ServerThread(short_context_model) as server:
        summary = _eval(tmp_path, f"openai:{server.base_url}#model")
    assert summary["end_reasons"] == {"context_limit": 4}, summary
    [warning] = [w for w in summary["warnings"] if "context_limit" in w]
    assert warning.startswith("4/4 episodes ended context_limit") and "--max-tokens 256" in warning
    assert "--system-prompt" in warning and "each env's instructions" in warning and "no agentgym.json" in warning
    assert f"agentgym eval: warning: {warning}" in capsys.readouterr().err


def test_replies_cut_at_max_tokens_are_named(short_context_model: Path, tmp_path: Path) -> None:
    summary = _eval(tmp_path, f"hf:{short_context_model}", "--system-prompt", "", "--max-tokens", "2")
    assert any("replies were cut at --max-tokens 2" in w for w in summary["warnings"]), summary


def test_a_healthy_run_has_no_warnings(tmp_path: Path) -> None:
    assert _eval(tmp_path, "reference")["warnings"] == []


def _episode(kinds: list[str], end: str = "max_turns", finish: str = "stop") -> Trajectory:
    turns = tuple(Turn(observation="o", action="a", info={"kind": k}, finish_reason=finish) for k in kinds)
    return Trajectory(env_id="e", task_id="t", seed=0, turns=turns, outcome={"success": False}, end_reason=end)


def test_mostly_void_episodes_point_at_the_prompt_and_a_minority_says_nothing() -> None:
    void = [_episode(["void", "void"]) for _ in range(3)] + [_episode(["tool_call"])]
    [warning] = run_warnings(void, max_tokens=24, system_prompt=None, defaults={"system_prompt": ""},
                             source="the server")
    assert warning.startswith("3/4 episodes had only void turns") and "the server says it was trained with " \
        "system prompt ''" in warning
    assert run_warnings(void[2:], max_tokens=24, system_prompt=None, defaults={}, source=None) == []
    assert run_warnings([], max_tokens=24, system_prompt=None, defaults={}, source=None) == []


def test_a_local_cpu_model_runs_with_the_thread_count_chosen_for_the_machine(
        short_context_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``eval`` with an ``hf:`` model on a CPU sets torch's threads as training does, and says what it chose."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("AGENTGYM_CPU_THREADS", "1")
    _eval(tmp_path, f"hf:{short_context_model}", "--system-prompt", "", "--max-tokens", "2")
    assert torch.get_num_threads() == 1
    assert "CPU: 1 torch thread (AGENTGYM_CPU_THREADS=1)" in " ".join(capsys.readouterr().out.split())
