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

from agentgym.cli import (
    evaluate, list_envs, new_env, play, rescore, serve_env, serve_model, study, task_data, train, view,
)
from agentgym.errors import AgentGymError, did_you_mean
from agentgym.utils.log_setup import setup_logging
from agentgym.utils.terminal import terminal_safe

__all__ = ["build_parser", "main", "parse_args"]

# In the order ``agentgym --help`` lists them.
_COMMANDS = (list_envs, play, evaluate, train, serve_model, serve_env, task_data, view, new_env, study, rescore)


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


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``command``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def _unknown_hint(sub: argparse.ArgumentParser, unknown: str, argv: Sequence[str]) -> str:
    """Why ``unknown`` is not a flag of ``sub`` and what to write: a close flag, or ``--set`` for a config field."""
    flags = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
    name = unknown.split("=", 1)[0]
    key = name[2:].replace("-", "_")
    if name.startswith("--") and "--set" in flags:
        from agentgym.cli.train import config_field_names

        if key in config_field_names():
            rest = list(argv)
            at = rest.index(unknown) if unknown in rest else -1
            value = unknown.split("=", 1)[1] if "=" in unknown else (
                rest[at + 1] if 0 <= at < len(rest) - 1 and not rest[at + 1].startswith("-") else "VALUE")
            return f" {key} is a config field: override it with --set {key}={value}."
    return did_you_mean(name, flags)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; an unknown flag gets its subcommand's usage and a 'did you mean' (exit 2), not the
    top-level usage, which does not list it."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        sub = _subparser(parser, args.command)
        full = list(sys.argv[1:] if argv is None else argv)
        sub.error(f"unrecognized arguments: {' '.join(unknown)}.{_unknown_hint(sub, unknown[0], full)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``agentgym`` command and return its exit status: 2 for an AgentGymError, 130 when interrupted."""
    args = parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.WARNING)  # one format for every command
    try:
        return int(args.func(args) or 0)
    except AgentGymError as exc:
        sys.stderr.write(terminal_safe(f"agentgym {args.command}: error: {exc}\n"))
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


