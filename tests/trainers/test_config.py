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
        ({"judge_verdict_format": "xml"}, "judge_verdict_format", "one of"),
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
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml")):
        load_config(path)


def _trainer_configs() -> list[type]:
    """Every config class a ``trainer:`` key can select."""
    import importlib

    from agentgym.trainers.config import TRAINER_CONFIGS

    classes = []
    for target in TRAINER_CONFIGS.values():
        module, _, name = target.partition(":")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


def test_trainer_keys_name_their_config_classes() -> None:
    from agentgym.trainers.config import TRAINER_CONFIGS, TrainerConfig

    for key, cls in zip(TRAINER_CONFIGS, _trainer_configs(), strict=True):
        assert issubclass(cls, TrainerConfig)
        assert cls.trainer_name == key


@pytest.mark.parametrize("cls", _trainer_configs(), ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("overrides", "field", "hint"),
    [
        ({"eval_split": "train"}, "eval_split", "held-out"),
        ({"temperature": 0.0}, "temperature", "temperature > 0"),
        ({"max_context_tokens": 16, "max_tokens_per_turn": 32}, "max_context_tokens", "must exceed"),
        ({"bc_shortcut_fraction": 1.5}, "bc_shortcut_fraction", "[0, 1]"),
        ({"eval_tasks": 0}, "eval_tasks", ">= 1"),
        ({"seed": 1.5}, "seed", "expected int"),
        ({"warmstart": "sft"}, "warmstart", "one of"),
    ],
)
def test_shared_fields_are_checked_the_same_way_by_every_trainer(cls: type, overrides: dict, field: str,
                                                                 hint: str) -> None:
    with pytest.raises(ConfigError, match=f"{cls.__name__}.{field}") as info:
        cls(model="m", suite="games-calc", **overrides)
    assert hint in str(info.value)


@pytest.mark.parametrize("cls", _trainer_configs(), ids=lambda c: c.__name__)
def test_every_trainer_checks_suites_and_model_before_any_rollout(cls: type, tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=f"{cls.__name__}.suite: .*Did you mean 'games-calc'"):
        cls(model=str(model_dir), suite="games-calk").load_suites()
    with pytest.raises(ConfigError, match=f"{cls.__name__}.eval_split: .*no split 'dev'.*eval_suite"):
        cls(model=str(model_dir), suite="games-calc", eval_split="dev").load_suites()
    with pytest.raises(ConfigError, match=f"{cls.__name__}.model: .*does not exist"):
        cls(model=str(tmp_path / "missing"), suite="games-calc").check_model_dir()
    train, held_out = cls(model=str(model_dir), suite="code-train", eval_suite="code-test").load_suites()
    assert (train.name, held_out.name) == ("code-train", "code-test")


def test_env_kwargs_reach_every_env_of_the_run_and_bad_ones_fail_at_start(model_dir: Path) -> None:
    """``env_kwargs`` lays keyword arguments over the suite's for training and held-out envs alike; a name the env
    does not take, or a value its constructor refuses, fails before any rollout with the field's name."""
    config = GrpoConfig(model=str(model_dir), suite="sokoban", eval_split="validation",
                        env_kwargs={"reward": "gym-sokoban"})
    train, held_out = config.load_suites()
    assert train.env_kwargs["reward"] == held_out.env_kwargs["reward"] == "gym-sokoban"
    env = train.make_env()
    assert env.unwrapped.reward_scheme == "gym-sokoban"
    env.close()
    assert GrpoConfig(model=str(model_dir), suite="sokoban", eval_split="validation").load_suites()[0].env_kwargs == {}
    with pytest.raises(ConfigError, match="env_kwargs: agentgym/Sokoban-v0 takes no argument 'rewards'; it takes .*reward"):
        GrpoConfig(model=str(model_dir), suite="sokoban", eval_split="validation",
                   env_kwargs={"rewards": "gym-sokoban"}).load_suites()
    with pytest.raises(ConfigError, match="env_kwargs: agentgym/Sokoban-v0 rejects them: reward must be one of"):
        GrpoTrainer(GrpoConfig(model=str(model_dir), suite="sokoban", eval_split="validation",
                               env_kwargs={"reward": "dense"}))
    with pytest.raises(ConfigError, match="env_kwargs: expected Mapping"):
        GrpoConfig(model=str(model_dir), suite="sokoban", env_kwargs=["reward"])  # type: ignore[arg-type]
