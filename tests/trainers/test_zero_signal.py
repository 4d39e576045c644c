"""``train/zero_signal_groups``: the share of a step's groups whose advantages are all zero, and the warning when most
groups carry no signal (why, and what to do)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from agentgym.trainers.grpo import zero_signal_groups


def test_groups_with_all_zero_advantages_are_counted_with_their_outcomes() -> None:
    adv = torch.tensor([[0.0, 0.0], [0.0, 0.0],     # group a: all failed
                        [0.0, 0.0], [0.0, 0.0],     # group b: all succeeded
                        [0.7, 0.7], [-0.7, -0.7],   # group c: a signal
                        [0.0, 0.5]])                # group d: its only non-zero token is not trained
    mask = torch.tensor([[1, 1]] * 6 + [[1, 0]], dtype=torch.float32)
    zero = zero_signal_groups(["a", "a", "b", "b", "c", "c", "d"], adv, mask,
                              [False, False, True, True, True, False, True])
    assert (zero.groups, zero.zero, zero.all_fail, zero.all_succeed, zero.other) == (4, 3, 1, 2, 0)
    assert zero.share == pytest.approx(0.75)
    assert zero_signal_groups([], torch.zeros(0, 0), torch.zeros(0, 0), []).share == 0.0


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.trainers.tiny_model import demonstration_texts

    shape = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 40),
                            config=shape)


def test_an_untrained_model_logs_the_metric_and_says_why_nothing_is_learned(
        small_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AGENTGYM_CPU_THREADS"):
        monkeypatch.delenv(name, raising=False)
    config = GrpoConfig(model=str(small_model), suite="games-calc", output_dir=str(tmp_path / "run"), steps=1,
                        tasks_per_step=2, group_size=2, eval_tasks=1, max_tokens_per_turn=8, max_context_tokens=256,
                        system_prompt="", tensorboard=False, progress=False, checkpoint_every=0, cpu_threads=1)
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING, logger="agentgym.trainers.grpo"):
            GrpoTrainer(config).train()
        assert torch.get_num_threads() == 1  # the config's cpu_threads reached torch
    finally:
        torch.set_num_threads(before)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["train/zero_signal_groups"] for r in rows if "train/zero_signal_groups" in r]
    assert shares == [1.0]  # a random model fails every rollout: no group compares anything
    warnings = [r.getMessage() for r in caplog.records if "carry no learning signal" in r.getMessage()]
    assert len(warnings) == 1
    assert "2 of 2 groups" in warnings[0] and "2 all fail" in warnings[0]
    assert "warm start" in warnings[0] and "group_size" in warnings[0] and "easier tasks" in warnings[0]
