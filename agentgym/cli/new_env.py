"""``agentgym new-env NAME``: write the skeleton of an env plugin package (see :mod:`agentgym.cli.scaffold`)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``new-env`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("new-env", help="write the skeleton of an env plugin package (env, suite, passing tests)")
    p.add_argument("name", help="package name, e.g. word-game (env id word_game/WordGame-v0)")
    p.add_argument("--dir", default=None, help="where to write it (default ./NAME); must be new or empty")
    p.add_argument("--force", action="store_true", help="overwrite the skeleton's files in a non-empty --dir")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the skeleton and say how to run its tests."""
    from agentgym.cli.scaffold import write_env_package

    root = write_env_package(args.name, args.dir, force=args.force)
    sys.stdout.write(f"wrote {root}: cd {root} && python -m pytest -q (then pip install -e . to register it)\n")
    return 0
