"""``reward: rubric``: a trainer's episodes are scored by a rubric and a judge before it learns from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.rewards import Check, JudgeCriterion, Rubric  # noqa: E402
from agentgym.trainers.config import GrpoConfig  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)
#: A checker criterion and a judge criterion; named by the configs below.
RUBRIC = Rubric("calc", (Check("correct", lambda s: float(s.outcome.get("success", False))),
                         JudgeCriterion("uses_calc", "Did the agent call the [calc] tool?",
                                        fields=("answer", "transcript"))))


def _config(tmp_path: Path, **overrides: object) -> GrpoConfig:
    model = build_tiny_model(tmp_path / "model", texts=demonstration_texts("games-calc", 40), config=SMALL)
    values = dict(model=str(model), suite="games-calc", output_dir=str(tmp_path / "run"), steps=1, tasks_per_step=2,
                  group_size=3, eval_tasks=2, eval_every=0, checkpoint_every=0, system_prompt="",
                  max_tokens_per_turn=8, max_context_tokens=96, tensorboard=False, seed=0, reward="rubric",
                  rubric="tests.trainers.test_rubric_reward:RUBRIC", judge="scripted-naive", judge_mode="group")
    values.update(overrides)
    return GrpoConfig(**values)  # type: ignore[arg-type]


def test_grpo_step_learns_from_group_judged_scores(tmp_path: Path) -> None:
    GrpoTrainer(_config(tmp_path)).train()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    judged = [m for m in metrics if "judge/judged" in m]
    assert judged and judged[0]["judge/judged"] == 6 and judged[0]["judge/judge_errors"] == 0
    assert judged[0]["judge/judge_calls"] == 2  # group mode: one call per task group
    assert (tmp_path / "run" / "judge_cache.jsonl").is_file()


def test_rubric_config_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rubric"):
        GrpoConfig(model="m", suite="games-calc", reward="rubric")
    with pytest.raises(ConfigError, match="reward: rubric"):
        GrpoConfig(model="m", suite="games-calc", rubric="x:y")
    with pytest.raises(ConfigError, match="judge_mode"):
        GrpoConfig(model="m", suite="games-calc", reward="rubric", rubric="x:y", judge_mode="pairs")  # type: ignore[arg-type]
