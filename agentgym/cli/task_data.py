"""``agentgym tasks build|verify FAMILY``: generate task data, or re-check that its tasks still hold.

The family builders live in :mod:`agentgym.tasks`; this command only parses arguments and reports.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.cli.arguments import positive_int
from agentgym.errors import AgentGymError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``tasks`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("tasks", help="build or verify generated task data (e.g. 'agentgym tasks build swe')")
    p.add_argument("action", choices=["build", "verify"])
    p.add_argument("family", help="task family; 'swe' builds SWE tasks from pinned PyPI libraries")
    p.add_argument("--libraries", nargs="+", default=None, help="only these libraries (default: all pinned)")
    p.add_argument("--library-file", action="append", default=None,
                   help="TOML file declaring more libraries ([[library]] tables; also $AGENTGYM_SWE_LIBRARIES)")
    p.add_argument("--per-library", type=positive_int, default=45, help="tasks to keep per library")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=positive_int, default=2, help="sandboxes running tests at once")
    p.add_argument("--limit", type=positive_int, default=None, help="verify only the first N tasks")
    p.add_argument("--out", default=None, help="task file (default: the shipped tasks/data/swe_tasks.jsonl)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build or verify; ``verify`` exits 1 when any task fails its check."""
    if args.family != "swe":
        raise AgentGymError(f"No task builder for {args.family!r}; available: swe.")
    from agentgym.tasks.swe import builder
    from agentgym.tasks.swe.libraries import load_library_file

    for declared in args.library_file or ():  # libraries a user declares, see agentgym.tasks.swe.libraries
        load_library_file(declared)

    if args.action == "build":
        out = Path(args.out or builder.DATA_FILE)
        progress = out.with_name(out.name + ".partial")  # survives a crash; a rerun resumes from it
        specs = builder.build_tasks(args.libraries or list(builder.LIBRARIES), per_library=args.per_library,
                                    seed=args.seed, workers=args.workers, progress_file=progress)
        path = builder.write_specs(specs, out)
        progress.unlink(missing_ok=True)
        sys.stdout.write(f"wrote {len(specs)} tasks to {path}\n")
        return 0
    specs = builder.load_specs(args.out or builder.DATA_FILE)
    if args.libraries:
        specs = [s for s in specs if s.library in args.libraries]
    checked = specs[: args.limit] if args.limit else specs
    problems = builder.verify_tasks(checked)
    for task_id, why in problems:
        sys.stdout.write(f"FAILED {task_id}: {why}\n")
    sys.stdout.write(f"{len(problems)} problem(s) in {len(checked)} tasks\n")
    return 1 if problems else 0
