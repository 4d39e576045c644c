"""Every config in configs/ loads, validates and trains through ``agentgym train`` as written, only scaled down
(the tiny model, two steps of a few episodes, two held-out tasks, one step of each update) and on the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.trainers.config import load_config  # noqa: E402
from agentgym.trainers.grpo_config import GrpoConfig  # noqa: E402
from agentgym.trainers.replay_actor import ReplayActorConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 60),
                            config=SMALL)


def test_every_trainer_has_a_shipped_config() -> None:
    trainers = {load_config(REPO / "configs" / name).trainer_name for name in CONFIGS}
    assert trainers == {"grpo", "gigpo", "arpo", "archer", "filtered_bc"}


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_config_trains_through_the_cli(name: str, model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli import main

    config = load_config(REPO / "configs" / name)
    scale: dict[str, object] = {"model": str(model_dir), "output_dir": str(tmp_path / "run"), "device": "cpu",
                                "steps": 2, "tasks_per_step": 2, "eval_tasks": 2, "eval_every": 1,
                                "checkpoint_every": 1, "bc_demos": 4, "bc_steps": 1, "tensorboard": False,
                                "max_tokens_per_turn": 12, "max_context_tokens": 1024, "progress": False}
    if isinstance(config, GrpoConfig):
        scale.update(group_size=2, micro_batch_size=2, mini_batches=1)
        if hasattr(config, "branching"):
            scale["initial_rollouts"] = 1
    if isinstance(config, ReplayActorConfig):
        scale.update(actor_warmup_steps=1, actor_steps=1, batch_size=2, grad_accum_steps=1)
        if hasattr(config, "critic_steps"):
            scale["critic_steps"] = 1
    args = ["train", str(REPO / "configs" / name)]
    for key, value in scale.items():
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    assert f"before {config.display_name}" in capsys.readouterr().out
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trainer"] == config.trainer_name and summary["episodes"] == 2 * 2 * int(scale.get("group_size", 1))
    for key in ("suite", "eval_split", "eval_suite", "warmstart"):
        assert summary["config"][key] == getattr(config, key)  # the config ran as written, only scaled
    assert (run / "checkpoints" / "step-000002").is_dir() and (run / "model" / "config.json").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    seen = [r["eval/episodes_seen"] for r in rows if "eval/episodes_seen" in r]
    assert seen == [0.0, summary["episodes"] / 2, float(summary["episodes"])]  # equal episodes per step
