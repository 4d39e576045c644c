"""``agentgym list``: the registered environments, multi-agent games and task suites, as tables."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``list`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("list", help="list registered environments and task suites")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the catalogue; summaries are read from source, so no env module is imported."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from agentgym.registration.catalogue import all_entries
    from agentgym.registration.env_docs import entry_point_summary
    from agentgym.registration.multi_agent import MULTI_AGENT_CATALOGUE
    from agentgym.registration.plugins import plugin_errors
    from agentgym.registration.suites import list_suites

    table = Table(title="agentgym environments")
    table.add_column("id")
    table.add_column("family")
    table.add_column("description")
    for entry in all_entries():  # ours, then those of installed plugins
        table.add_row(entry.id, entry.family, entry.summary)
    console = Console(width=max(100, Console().width))
    console.print(table)

    games = Table(title="multi-agent games (PettingZoo; agentgym.make_multi_agent)")
    for column in ("id", "forms", "description"):
        games.add_column(column)
    for game in MULTI_AGENT_CATALOGUE:
        games.add_row(game.id, "AEC + parallel" if game.parallel_entry_point else "AEC",
                      entry_point_summary(game.aec_entry_point))
    console.print(games)
    console.print("suites: " + ", ".join(list_suites()))
    for error in plugin_errors():
        console.print(f"[yellow]skipped a broken plugin:[/yellow] {escape(str(error))}", markup=True, highlight=False)
    return 0
