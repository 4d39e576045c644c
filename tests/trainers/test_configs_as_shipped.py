"""Every shipped config runs as shipped: its ``model`` is one that can be had (``tiny:<suite>``, built and cached on
first use from a clean cache, or a cached Hub model on a GPU), and a config that needs a GPU says so in its first
line and stops with that line on a CPU.

The fast tests validate every config, build the tiny models of the cheap suites and run one step of the cheapest
configs; the slow one trains every config, scaled down, from an empty cache."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from agentgym.trainers.config import load_config
from agentgym.trainers.grpo_config import GrpoConfig
from agentgym.trainers.replay_actor import ReplayActorConfig
from agentgym.trainers.tiny_model import is_tiny_spec

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
CHEAP = ("quickstart_calc.yaml", "gigpo_maze.yaml")


def _needs_gpu(name: str) -> bool:
    return str(load_config(REPO / "configs" / name).device).startswith("cuda")


@pytest.fixture()
def clean_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(cache))
    monkeypatch.setenv("AGENTGYM_CPU_THREADS", "1")
    return cache


@pytest.mark.parametrize("name", CONFIGS)
def test_each_config_names_a_model_it_can_get(name: str) -> None:
    path = REPO / "configs" / name
    config = load_config(path)
    first = path.read_text(encoding="utf-8").splitlines()[0]
    if _needs_gpu(name):
        assert first.startswith("# Needs a CUDA GPU"), first
        assert "/" in config.model and not config.model.startswith(("runs/", "./")), config.model  # a Hub id
    else:
        assert is_tiny_spec(config.model), f"{name}: model {config.model!r} is built nowhere; name tiny:<suite>"
        assert "GPU" not in first


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("name", [n for n in CONFIGS if _needs_gpu(n)])
def test_a_gpu_config_refuses_on_a_cpu_with_its_first_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli import main

    path = REPO / "configs" / name
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    first = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip()
    assert first in err and "no CUDA GPU" in err and "--set device=cpu" in err


def _scaled(name: str, out: Path) -> dict[str, object]:
    """The config's own fields, scaled down to seconds on a CPU (the tiny model of its suite for GPU configs)."""
    config = load_config(REPO / "configs" / name)
    scale: dict[str, object] = {"output_dir": str(out), "steps": 1, "tasks_per_step": 2, "eval_tasks": 2,
                                "eval_every": 1, "checkpoint_every": 1, "bc_demos": 4, "bc_steps": 1,
                                "tensorboard": False, "max_tokens_per_turn": 12, "max_context_tokens": 1024,
                                "progress": False}
    if _needs_gpu(name):
        scale.update(device="cpu", dtype="float32", model=f"tiny:{config.suite}", load_in_4bit=False,
                     generation_backend="hf", gradient_checkpointing=False)
    if isinstance(config, GrpoConfig):
        scale.update(group_size=2, micro_batch_size=2, mini_batches=1)
        if hasattr(config, "branching"):
            scale["initial_rollouts"] = 1
    if isinstance(config, ReplayActorConfig):
        scale.update(steps=2, actor_warmup_steps=1, actor_steps=1, batch_size=2, grad_accum_steps=1)
        if hasattr(config, "critic_steps"):
            scale["critic_steps"] = 1
    return scale


def _train(name: str, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    from agentgym.cli import main

    args = ["train", str(REPO / "configs" / name)]
    for key, value in _scaled(name, out).items():
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0, capsys.readouterr().err[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("name", CHEAP)
def test_a_cheap_config_builds_its_model_from_a_clean_cache_and_trains_a_step(
        name: str, clean_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(REPO / "configs" / name)
    with caplog.at_level(logging.INFO, logger="agentgym.trainers.tiny_model"):
        summary = _train(name, tmp_path / "run", capsys)
    built = [p for p in (clean_cache / "tiny-models").iterdir() if not p.name.startswith(".")]  # not its lock
    assert len(built) == 1 and built[0].name.startswith(config.suite + "-")
    tokenizer = json.loads((built[0] / "tokenizer.json").read_text())
    stages = [r.getMessage() for r in caplog.records if r.name == "agentgym.trainers.tiny_model"]
    assert any("building " + config.model in s for s in stages) and any("built in" in s for s in stages)
    assert summary["config"]["model"] == config.model and summary["config"]["suite"] == config.suite
    assert tokenizer["model"]["type"] == "BPE"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agentgym.trainers.tiny_model"):  # the second run reuses the cache
        _train(name, tmp_path / "again", capsys)
    assert not [r for r in caplog.records if r.name == "agentgym.trainers.tiny_model"]


def test_a_tiny_model_of_an_unknown_suite_fails_with_a_hint(clean_cache: Path) -> None:
    from agentgym.errors import ConfigError
    from agentgym.trainers.config import GrpoConfig as Config

    config = Config(model="tiny:games-mazee", suite="games-maze", eval_split="validation")
    with pytest.raises(ConfigError, match="Did you mean 'games-maze'"):
        config.check_model_dir()
    with pytest.raises(ConfigError, match="write model: tiny:games-maze"):
        Config(model="runs/nowhere/model", suite="games-maze", eval_split="validation").check_model_dir()


@pytest.mark.slow
def test_every_config_trains_scaled_down_from_a_clean_cache(clean_cache: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    for name in CONFIGS:
        config = load_config(REPO / "configs" / name)
        summary = _train(name, tmp_path / name, capsys)
        assert summary["trainer"] == config.trainer_name and summary["config"]["suite"] == config.suite
        assert (tmp_path / name / "model" / "config.json").is_file()
