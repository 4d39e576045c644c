"""Asynchronous training: the next steps' rollouts are generated while the current step trains, within a
staleness bound, nothing is dropped, and the update weights stale tokens by the truncated importance ratio."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.quickstart import demonstration_texts  # noqa: E402
from agentgym.trainers import make_trainer  # noqa: E402
from agentgym.trainers.algorithms import behaviour_weights  # noqa: E402
from agentgym.trainers.config import config_from_dict  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 60),
                            config=SMALL)


def _config(model_dir: Path, out: Path, **overrides: object) -> object:
    values: dict[str, object] = dict(trainer="grpo", model=str(model_dir), suite="games-calc", output_dir=str(out),
                                     steps=4, tasks_per_step=2, group_size=4, eval_tasks=2, eval_every=0,
                                     checkpoint_every=0, system_prompt="", max_tokens_per_turn=12,
                                     max_context_tokens=128, tensorboard=False, micro_batch_size=4, progress=False)
    values.update(overrides)
    return config_from_dict(values)


@pytest.mark.parametrize(("trainer", "staleness"), [("grpo", 1), ("gigpo", 2)])
def test_async_training_stays_within_its_staleness_and_drops_nothing(model_dir: Path, tmp_path: Path, trainer: str,
                                                                    staleness: int) -> None:
    summary = make_trainer(_config(model_dir, tmp_path, trainer=trainer, max_staleness=staleness)).train()
    assert summary["episodes"] == 4 * 2 * 4
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "async/staleness" in r]
    assert len(steps) == 4
    lags = [r["async/staleness"] for r in steps]
    assert all(0 <= lag <= staleness for lag in lags) and max(lags) >= 1, lags  # it did run ahead
    assert all(r["async/dropped_episodes"] == 0 for r in steps)
    assert all(r["async/episodes_per_task_min"] == r["async/episodes_per_task_max"] == 4 for r in steps)
    assert all(r["train/episodes"] == 8 for r in steps) and (tmp_path / "model" / "config.json").is_file()


def test_truncated_importance_weights() -> None:
    proximal = torch.tensor([[-1.0, -2.0, -0.1, -5.0]])
    behaviour = torch.tensor([[-1.0, -1.0, -3.0, -5.0]])
    weights = behaviour_weights(proximal, behaviour, cap=2.0)
    assert weights.tolist()[0] == pytest.approx([1.0, 0.36788, 2.0, 1.0], abs=1e-5)
    with pytest.raises(ConfigError, match="cap"):
        behaviour_weights(proximal, behaviour, cap=0.5)


def test_async_settings_that_cannot_work_fail_with_the_fix(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_staleness: must be >= 0"):
        _config(model_dir, tmp_path, max_staleness=-1)
    with pytest.raises(ConfigError, match="branching sampler runs synchronously"):
        _config(model_dir, tmp_path, trainer="arpo", max_staleness=1)
    with pytest.raises(ConfigError, match="generation_backend: hf"):
        _config(model_dir, tmp_path, max_staleness=1, generation_backend="vllm", device="cuda")
    assert _config(model_dir, tmp_path, max_staleness=1).corrects_off_policy
    assert not _config(model_dir, tmp_path).corrects_off_policy
