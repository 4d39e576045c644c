"""``agentgym study NAME``: run one learning study of the source checkout's ``benchmarks/studies``.

The studies train with the trainers' own loop but live with the benchmarks (their task definitions, warm start and
result files are the benchmarks'), which are not part of the installed package; this command finds them in the
checkout agentgym runs from (or the current directory) and runs ``benchmarks/studies/run.py`` with the same
arguments, in a child process, so its result file records the same command as a direct run.

A Ctrl-C in the terminal reaches the child and its training workers directly; this command then waits for the child
instead of stopping it, so the runs under way save their checkpoints and the child says where each stopped.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path

from agentgym.errors import ConfigError

__all__ = ["add_parser", "find_runner", "run", "wait_through_interrupts"]

RUNNER = Path("benchmarks") / "studies" / "run.py"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``study`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("study", help="run a learning study (methods vs baseline and shuffled control), or --list them")
    p.add_argument("name", nargs="?", help="the study; --list shows them")
    p.add_argument("--list", action="store_true", help="list the studies with their goal scale and expected hours")
    p.add_argument("--scale", choices=["smoke", "goal"], default="goal",
                   help="smoke: the whole code path in seconds; goal: sized by gradient noise and held-out error")
    p.add_argument("--seeds", type=int, default=3, help="seeds per method (default 3)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where BC, rollouts and training run")
    p.add_argument("--out", default=None, help="folder of study_NAME.json and .png (default benchmarks/results)")
    p.add_argument("--workdir", default=None, help="models and runs (default runs/studies)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (the CPU cores shared among them)")
    p.add_argument("--agreement", action="store_true",
                   help="only measure how far GRPO's and GiGPO's advantages disagree on the study's rollouts")
    p.add_argument("--steps", type=int, default=None, help="train this many steps instead of the scale's (labelled)")
    p.add_argument("--max-bc-steps", type=int, default=None, help="most BC steps of the warm start")
    p.add_argument("--learning-rate", default=None,
                   help="train every method at this rate (default: the study's tuned rate, else 1e-4)")
    p.add_argument("--tune-learning-rate", default=None, metavar="LR,LR,...",
                   help="tune the rate on the suite's tune split (never the held-out one) instead of running the study")
    p.add_argument("--tune-steps", type=int, default=None, help="steps of each --tune-learning-rate run (default 5)")
    p.add_argument("--held-out-again", action="store_true",
                   help="score the finished study's models again task by task, on its held-out split and further "
                        "ones, with errors over seeds and tasks (held_out_NAME.json)")
    p.set_defaults(func=run)


def find_runner(start: Path | None = None) -> Path:
    """``benchmarks/studies/run.py`` of the checkout agentgym is imported from, else of the current directory.

    Raises:
        ConfigError: neither has one (an installed wheel carries no benchmarks).
    """
    import agentgym

    for root in (Path(agentgym.__file__).resolve().parent.parent, (start or Path.cwd()).resolve()):
        if (root / RUNNER).is_file():
            return root / RUNNER
    raise ConfigError(f"agentgym study runs the studies of a source checkout ({RUNNER}), and none was found next to "
                      "the agentgym package or in the current directory; run it from a clone of the repository "
                      "(pip install -e . there).")


def run(args: argparse.Namespace) -> int:
    """Run the study script with these arguments; its exit status is the command's."""
    runner = find_runner()
    argv = [] if args.name is None else [args.name]
    if args.list:
        argv.append("--list")
    argv += ["--scale", args.scale, "--seeds", str(args.seeds), "--device", args.device, "--jobs", str(args.jobs)]
    for flag, number in (("--steps", args.steps), ("--max-bc-steps", args.max_bc_steps),
                         ("--learning-rate", args.learning_rate), ("--tune-learning-rate", args.tune_learning_rate),
                         ("--tune-steps", args.tune_steps)):
        if number is not None:
            argv += [flag, str(number)]
    for flag, value in (("--out", args.out), ("--workdir", args.workdir)):
        if value is not None:  # the child runs in the checkout: paths are the caller's, so made absolute here
            argv += [flag, str(Path(value).resolve())]
    for flag in ("agreement", "held_out_again"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    root = runner.parent.parent.parent
    process = subprocess.Popen([sys.executable, str(runner.relative_to(root)), *argv], cwd=root)
    return wait_through_interrupts(process)


def wait_through_interrupts(process: subprocess.Popen[bytes]) -> int:
    """The child's exit status. A terminal's Ctrl-C goes to every process of the foreground group, the child too,
    which saves its runs' checkpoints and exits; waiting on it (``subprocess.run`` would kill it a quarter of a
    second after a Ctrl-C) keeps that work and its report. A SIGTERM (``kill PID``, a scheduler's time limit) reaches
    this process only, so it is passed on to the child, which stops as on a Ctrl-C. Off the main thread no handler
    can be set: plain wait."""
    if threading.current_thread() is not threading.main_thread():
        return process.wait()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: process.send_signal(signal.SIGTERM))
    try:
        return process.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
