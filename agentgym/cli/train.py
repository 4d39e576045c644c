"""``agentgym train CONFIG``: train a policy with a trainer config, then report held-out success.

``agentgym train --help-config TRAINER`` prints every key that trainer's config takes, with default and meaning.
Ctrl-C stops within about a second, keeps a checkpoint and prints the command that resumes the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["add_parser", "config_field_names", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``train`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("train", help="train a policy with a trainer config (YAML; see configs/)",
                       description="Train a policy with a trainer config (YAML; see configs/). Fields are listed by "
                                   "--help-config TRAINER; override one with --set FIELD=VALUE. Ctrl-C saves a "
                                   "checkpoint; the same command resumes from it.")
    p.add_argument("config", nargs="?", help="trainer config file, e.g. configs/quickstart_calc.yaml")
    p.add_argument("--warmstart", choices=["none", "bc"], default=None, help="behaviour-cloning warm start first")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field (repeatable)")
    p.add_argument("--force", action="store_true",
                   help="resume the run in the output directory even though its stored config.json differs from "
                        "this config (the differences are listed, then recorded in resume_changes.jsonl)")
    p.add_argument("--help-config", metavar="TRAINER", default=None,
                   help="list every config field of TRAINER (grpo, gigpo, arpo, archer, filtered_bc) with its default "
                        "and meaning, then exit")
    p.set_defaults(func=run)


def config_field_names() -> frozenset[str]:
    """Every key some trainer's config file may set (for hints on mistyped flags such as ``--steps``)."""
    from agentgym.trainers.config_reference import config_class
    from agentgym.trainers.config import TRAINER_CONFIGS

    names: set[str] = set()
    for trainer in TRAINER_CONFIGS:
        names |= config_class(trainer).config_keys()
    return frozenset(names)


def _requires_gpu(config: Any, path: str) -> None:
    """A config meant for a GPU says so in its first line; on a machine without CUDA, stop with that line."""
    if not str(config.device).startswith("cuda"):
        return
    import torch

    if torch.cuda.is_available():
        return
    first = ""
    try:
        first = Path(path).read_text(encoding="utf-8").splitlines()[0].lstrip("#").strip()
    except (OSError, IndexError):
        pass
    raise ConfigError(f"{path}: {first or 'this config needs a CUDA GPU (device: cuda)'} This machine has no CUDA GPU "
                      "(torch.cuda.is_available() is false). To try the recipe on a CPU anyway, scale it down, e.g. "
                      "--set device=cpu --set dtype=float32 --set model=tiny:<suite> (see --help-config).")


def _quick_exit() -> None:
    """Spare the interpreter's final garbage collection, which walks every object a run created (seconds on a
    busy machine after training), so an interrupted run exits as soon as its checkpoint is written. gc.freeze()
    moves them to the permanent generation, which that collection skips; atexit handlers still run."""
    import gc

    gc.freeze()


def _resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run (the same one: a run resumes from its latest checkpoint)."""
    parts = ["agentgym", "train", args.config]
    for item in args.set or []:
        parts += ["--set", item]
    if args.warmstart is not None:
        parts += ["--warmstart", args.warmstart]
    if args.output_dir is not None:
        parts += ["--output-dir", args.output_dir]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    """Load the config, apply ``--set``/``--warmstart``/``--output-dir`` over it and train."""
    import yaml

    if args.help_config is not None:
        from agentgym.trainers.config_reference import format_help

        sys.stdout.write(format_help(args.help_config))
        return 0
    if args.config is None:
        raise ConfigError("train needs a config file, e.g. agentgym train configs/quickstart_calc.yaml "
                          "(--help-config TRAINER lists the fields).")

    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import load_config
    from agentgym.trainers.interrupt import TrainingInterrupted

    config = load_config(args.config)
    overrides: dict[str, Any] = {}
    for item in args.set or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects FIELD=VALUE (e.g. --set steps=10), got {item!r}.")
        overrides[key.strip()] = yaml.safe_load(raw)
    if args.warmstart is not None:
        overrides["warmstart"] = args.warmstart
    if args.output_dir is not None:
        overrides["output_dir"] = args.output_dir
    if overrides:
        config = type(config).from_dict({**config.to_dict(), **overrides})
    _requires_gpu(config, args.config)

    name = config.display_name
    logging.getLogger("agentgym").setLevel(logging.INFO)
    try:
        summary = make_trainer(config).train(force_resume=args.force)
    except TrainingInterrupted as stopped:
        sys.stderr.write(f"agentgym train: {stopped}\nresume with: {_resume_command(args)}\n")
        _quick_exit()
        return 130
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 evaluates and reports
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    sys.stdout.write(
        f"held-out success: {before.get('success_rate', float('nan')):.3f} before {name} -> "
        f"{after.get('success_rate', float('nan')):.3f} after ({config.output_dir})\n"
    )
    return 0
