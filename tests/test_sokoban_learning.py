"""The Sokoban learning smoke run (configs/gigpo_sokoban.yaml, ``benchmarks/credit_assignment.py --tasks sokoban``):
the shipped config validates as GiGPO, matches the benchmark's settings, and its held-out split is held out."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from agentgym.suite import load_suite
from agentgym.trainers.config import load_config
from agentgym.trainers.gigpo import GigpoConfig

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "gigpo_sokoban.yaml"
# the README's command for the Sokoban learning result (benchmark flags that differ from its defaults)
README_FLAGS = ["--tasks", "sokoban", "--methods", "gigpo", "--jobs", "1", "--eval-every", "8",
                "--max-bc-steps", "150", "--bc-check-every", "50"]


def _benchmark():
    spec = importlib.util.spec_from_file_location("credit_assignment", REPO / "benchmarks" / "credit_assignment.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_config_validates_as_gigpo_on_sokoban() -> None:
    config = load_config(CONFIG)
    assert isinstance(config, GigpoConfig) and config.trainer_name == "gigpo"
    assert (config.suite, config.eval_split, config.warmstart) == ("sokoban", "test", "bc")
    assert config.system_prompt == "" and config.max_context_tokens > config.max_tokens_per_turn


def test_config_matches_the_benchmark_run(tmp_path: Path) -> None:
    """The config reproduces a benchmark run: same split, sizes, learning rate and turn budget (only the warm
    start differs in form: the config runs BC itself, the benchmark shares one BC checkpoint across seeds)."""
    bench = _benchmark()
    args = bench.parse_args(README_FLAGS)
    run = bench.run_config(bench.TASKS["sokoban"], "gigpo", 0, tmp_path / "model", tmp_path / "out", args)
    config = load_config(CONFIG).to_dict()
    for key in ("suite", "eval_split", "steps", "tasks_per_step", "group_size", "learning_rate", "warmup_steps",
                "eval_every", "eval_tasks", "max_tokens_per_turn", "max_context_tokens", "temperature", "system_prompt"):
        assert config[key] == run[key], key
    assert config["model"] == f"{args.workdir}/base-sokoban"  # what --build-only writes


def test_held_out_puzzles_never_occur_in_training() -> None:
    """The test split (the smoke run's held-out split) shares no puzzle and no puzzle seed with training. The
    validation split shares seeds with neither, but 7 of its 100 small rooms repeat a training room by chance."""
    suite = load_suite("sokoban")
    train = {tuple(t.metadata["rows"]) for t in suite.train}
    test = suite.split("test")
    assert len(test) == 100 and not train & {tuple(t.metadata["rows"]) for t in test}
    train_seeds = {t.metadata["seed"] for t in suite.train}
    for split in ("test", "validation"):
        assert not train_seeds & {t.metadata["seed"] for t in suite.split(split)}
