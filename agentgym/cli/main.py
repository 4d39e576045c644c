"""The ``agentgym`` command line: the parser of every command and the dispatch that runs one.

Each command lives in its own module of :mod:`agentgym.cli` with an ``add_parser`` and a ``run`` function.
Every argument is validated before work starts, and a bad one exits with status 2 and a message that says how
to fix it (never a traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from agentgym.cli import evaluate, list_envs, new_env, play, serve_env, serve_model, task_data, train, view
from agentgym.errors import AgentGymError

__all__ = ["build_parser", "main"]

# In the order ``agentgym --help`` lists them.
_COMMANDS = (list_envs, play, evaluate, train, serve_model, serve_env, task_data, view, new_env)


def _version() -> str:
    """The installed distribution's version (importlib.metadata), else the source tree's ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentgym")
    except PackageNotFoundError:
        import agentgym

        return agentgym.__version__


def build_parser() -> argparse.ArgumentParser:
    """The ``agentgym`` parser: global flags, then one subcommand per command module."""
    parser = argparse.ArgumentParser(prog="agentgym", description="Environments, policies and trainers for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"agentgym {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``agentgym`` command and return its exit status: 2 for an AgentGymError, 130 when interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except AgentGymError as exc:
        sys.stderr.write(f"agentgym {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


