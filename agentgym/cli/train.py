"""``agentgym train CONFIG``: train a policy with a trainer config, then report held-out success."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``train`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("train", help="train a policy with a trainer config (YAML; see configs/)")
    p.add_argument("config", help="trainer config file, e.g. configs/quickstart_calc.yaml")
    p.add_argument("--warmstart", choices=["none", "bc"], default=None, help="behaviour-cloning warm start first")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the config, apply ``--set``/``--warmstart``/``--output-dir`` over it and train."""
    import yaml

    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import load_config

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

    name = config.display_name
    logging.getLogger("agentgym").setLevel(logging.INFO)
    summary = make_trainer(config).train()
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 evaluates and reports
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    sys.stdout.write(
        f"held-out success: {before.get('success_rate', float('nan')):.3f} before {name} -> "
        f"{after.get('success_rate', float('nan')):.3f} after ({config.output_dir})\n"
    )
    return 0
