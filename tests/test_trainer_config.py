"""Bad trainer configuration fails at start, before any rollout, naming the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.errors import ConfigError
from agentgym.trainers.config import GrpoConfig, load_config

pytest.importorskip("torch")

from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A directory that looks like an HF model (the trainer checks it before loading anything)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize(
    ("overrides", "field", "hint"),
    [
        ({"learning_rate": 0.0}, "learning_rate", "must be > 0"),
        ({"learning_rate": -1e-4}, "learning_rate", "must be > 0"),
        ({"group_size": 1}, "group_size", "group_size >= 2"),
        ({"kl_coef": 0.1}, "kl_coef", "reference_model"),
        ({"mask_void_turns": True, "void_turn_kinds": ("void", "tool_call", "answer")}, "void_turn_kinds",
         "no token to train on"),
        ({"eval_split": "train"}, "eval_split", "held-out"),
        ({"temperature": 0.0}, "temperature", "temperature > 0"),
        ({"steps": "10"}, "steps", "expected int"),
        ({"advantage": "ppo"}, "advantage", "one of"),
    ],
)
def test_invalid_values_name_the_field(overrides: dict, field: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=f"GrpoConfig.{field}") as info:
        GrpoConfig(model="m", suite="games-calc", **overrides)
    assert hint in str(info.value)


def test_unknown_suite_model_and_env_fail_before_any_rollout(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'games-calc'"):
        GrpoTrainer(GrpoConfig(model=str(model_dir), suite="games-calk"))
    with pytest.raises(ConfigError, match="does not exist"):
        GrpoTrainer(GrpoConfig(model=str(tmp_path / "missing"), suite="games-calc"))
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        GrpoTrainer(GrpoConfig(model=str(not_a_model), suite="games-calc"))
    suite = tmp_path / "bad.yaml"
    suite.write_text("name: bad\nversion: 1\nenv: agentgym/Calculater-v0\ngenerator: "
                     "agentgym.envs.games.calculator:generate_tasks\nsplits:\n  train: {count: 5}\n  test: {count: 5}\n")
    with pytest.raises(ConfigError, match="not registered.*Calculator-v0"):
        GrpoTrainer(GrpoConfig(model=str(model_dir), suite=str(suite)))
    with pytest.raises(ConfigError, match="reference_model.*does not exist"):
        GrpoTrainer(GrpoConfig(model=str(model_dir), suite="games-calc", kl_coef=0.1, reference_model="/nope"))


def test_yaml_unknown_keys_and_trainers(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nsuite: games-calc\nlearning_rat: 0.1\n")
    with pytest.raises(ConfigError, match="Did you mean 'learning_rate'"):
        load_config(path)
    path.write_text("trainer: ppo\nmodel: m\nsuite: games-calc\n")
    with pytest.raises(ConfigError, match="unknown trainer"):
        load_config(path)
    path.write_text("suite: games-calc\n")
    with pytest.raises(ConfigError, match="needs \\['model'\\]"):
        load_config(path)


def test_shipped_configs_are_valid() -> None:
    for path in sorted(Path(__file__).resolve().parent.parent.joinpath("configs").glob("*.yaml")):
        load_config(path)
