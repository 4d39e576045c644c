"""``agentgym view FILE``: print saved trajectories, and with ``--html`` write them as a report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.cli.arguments import positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``view`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("view", help="print saved trajectories")
    p.add_argument("path", help="a trajectories.jsonl file")
    p.add_argument("--limit", type=positive_int, default=None)
    p.add_argument("--html", default=None, help="also write these trajectories as an HTML report (observation "
                   "images inline, copied to images/ beside it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print each trajectory's turns; a file that is not a trajectories file is a ConfigError, not a traceback."""
    from rich.console import Console
    from rich.markup import escape

    from agentgym.storage import read_trajectories
    from agentgym.trajectory import utf8_safe
    from agentgym.utils.terminal import terminal_safe

    path = Path(args.path)
    if not path.is_file():
        raise ConfigError(f"No trajectory file at {path}; pass the trajectories.jsonl written by 'agentgym eval'.")
    console = Console()

    def shown(text: str) -> str:
        # model and env text is neither rich markup, nor always valid UTF-8, nor free of terminal escape sequences
        return escape(terminal_safe(utf8_safe(text)))

    # a corrupt line (a crash or full disk under an older writer) is skipped with a warning naming it
    records = read_trajectories(path, skip_corrupt=True)
    viewed = []
    for i in range(args.limit if args.limit is not None else sys.maxsize):
        try:
            traj = next(records, None)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not a trajectory record
            raise ConfigError(_not_a_trajectory_file(path, i + 1, exc)) from None
        if traj is None:
            if i == 0 and path.read_bytes().strip():
                raise ConfigError(_not_a_trajectory_file(path, 1, ValueError("no complete JSON line")))
            break
        viewed.append(traj)
        console.rule(shown(f"{traj.env_id} {traj.task_id} seed={traj.seed} success={traj.success} ({traj.end_reason})"))
        for turn in traj.turns:
            console.print(f"[cyan]observation[/cyan] {shown(turn.observation)}", markup=True, highlight=False)
            for image in turn.images:  # the PNG beside the JSONL; --html shows them inline
                console.print(f"[magenta]image[/magenta] {shown(str(path.parent / image.path))} "
                              f"({image.width}x{image.height})", markup=True, highlight=False)
            console.print(f"[yellow]action[/yellow] ({shown(turn.kind)}) {shown(turn.action)}", markup=True, highlight=False)
        if traj.final_observation is not None:
            console.print(f"[cyan]final observation[/cyan] {shown(traj.final_observation)}", markup=True, highlight=False)
            for image in traj.final_images:
                console.print(f"[magenta]image[/magenta] {shown(str(path.parent / image.path))} "
                              f"({image.width}x{image.height})", markup=True, highlight=False)
        if traj.error:
            console.print(f"[red]error[/red] {shown(traj.error)}", markup=True, highlight=False)
    if args.html:
        from agentgym.cli.report import write_html_report
        from agentgym.rollout import summarize

        report = write_html_report(args.html, summarize(viewed), viewed, title=str(path))
        console.print(f"report: {shown(str(report))}", markup=True, highlight=False)
    return 0


def _not_a_trajectory_file(path: Path, record: int, exc: Exception) -> str:
    """The message for a file ``view`` cannot read: where it failed, why, and what to pass instead."""
    why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
    return (f"{path} is not a trajectories file (record {record}: {why}). Pass the trajectories.jsonl that "
            "'agentgym eval' or a trainer wrote (one JSON trajectory per line).")
