"""``agentgym view RUN_OR_FILE``: print saved trajectories; ``--serve`` opens them in the viewer app on a local
port, ``--html`` writes the same app as one static file.

RUN_OR_FILE is a trajectories JSONL, an eval directory or a training output directory (its ``rollouts/``, which
``save_rollouts: N`` keeps, its metrics and settings); see :mod:`agentgym.viewer`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.cli.arguments import positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``view`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("view", help="print saved trajectories, or browse them in the viewer app (--serve)")
    p.add_argument("path", help="a trajectories.jsonl file, or the output directory of 'agentgym eval' or "
                   "'agentgym train'")
    p.add_argument("--limit", type=positive_int, default=None, help="at most this many episodes")
    p.add_argument("--html", default=None, help="also write the viewer as one static HTML file (observation "
                   "images copied to images/ beside it)")
    p.add_argument("--serve", action="store_true", help="serve the viewer app at http://127.0.0.1:PORT/ (reload "
                   "the page to see new episodes of a run in progress; Ctrl-C stops it)")
    p.add_argument("--port", type=_port, default=8765, help="port for --serve (default 8765; 0 picks a free one)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print each trajectory's turns; a file that is not a trajectories file is a ConfigError, not a traceback."""
    from rich.console import Console
    from rich.markup import escape

    from agentgym.storage import read_trajectories
    from agentgym.trajectory import utf8_safe
    from agentgym.utils.terminal import terminal_safe
    from agentgym.viewer.run import check_trajectory_file

    path = Path(args.path)
    if not path.exists():
        raise ConfigError(f"No trajectory file or run directory at {path}; pass the trajectories.jsonl or the "
                          "output directory written by 'agentgym eval' or 'agentgym train'.")
    if args.serve:
        return _serve(path, args.port, args.limit)
    if path.is_dir():
        return _view_run(path, args)
    console = Console()

    def shown(text: str) -> str:
        # model and env text is neither rich markup, nor always valid UTF-8, nor free of terminal escape sequences
        return escape(terminal_safe(utf8_safe(text)))

    check_trajectory_file(path)  # a summary.json passed by mistake is one clear error, not a warning per line
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
        from agentgym.cli.report import write_viewer_page
        from agentgym.rollout import summarize
        from agentgym.viewer.run import load_run

        run = load_run(path, limit=args.limit)
        if not run.summary:
            run.summary = summarize(viewed)
        report = write_viewer_page(args.html, run)
        console.print(f"report: {shown(str(report))}", markup=True, highlight=False)
    return 0


def _view_run(path: Path, args: argparse.Namespace) -> int:
    """A run directory: one line per episode (open it with --serve or --html to read the episodes)."""
    from rich.console import Console
    from rich.markup import escape

    from agentgym.trajectory import utf8_safe
    from agentgym.utils.terminal import terminal_safe
    from agentgym.viewer.run import load_run

    def shown(text: str) -> str:
        return escape(terminal_safe(utf8_safe(text)))

    run = load_run(path, limit=args.limit)
    console = Console()
    for ep in run.episodes:
        t = ep.trajectory
        step = f"step {ep.train_step} " if ep.train_step is not None else ""
        console.print(shown(f"{ep.source}: {step}{t.task_id} seed={t.seed} success={t.success} ({t.end_reason}, "
                            f"{len(t.turns)} turns)"), markup=True, highlight=False)
    console.print(f"{len(run.episodes)} episodes, {len(run.metrics)} metrics records; browse them with: agentgym view "
                  f"{shown(str(path))} --serve", markup=True, highlight=False, soft_wrap=True)
    if args.html:
        from agentgym.cli.report import write_viewer_page

        report = write_viewer_page(args.html, run)
        console.print(f"report: {shown(str(report))}", markup=True, highlight=False)
    return 0


def _serve(path: Path, port: int, limit: int | None) -> int:
    from agentgym.viewer.server import ViewerServer

    server = ViewerServer(path, port=port, limit=limit)
    print(f"agentgym viewer of {path}: {server.url}  (Ctrl-C stops it)", flush=True)
    server.serve_forever()
    return 0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {port}")
    return port


def _not_a_trajectory_file(path: Path, record: int, exc: Exception) -> str:
    """The message for a file ``view`` cannot read: where it failed, why, and what to pass instead."""
    why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
    return (f"{path} is not a trajectories file (record {record}: {why}). Pass the trajectories.jsonl that "
            "'agentgym eval' or a trainer wrote (one JSON trajectory per line).")
