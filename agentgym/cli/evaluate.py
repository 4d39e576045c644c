"""``agentgym eval``: run a policy on a task suite, write its trajectories, summary and HTML report.

A run directory holds one run: a non-empty ``--out`` is refused unless ``--resume`` or ``--overwrite`` says
what to do with what is there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from agentgym.cli.arguments import non_negative_float, positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]

#: A hidden file of disk space held during a run and freed just before summary.json is written (see SpaceReserve).
_RESERVE = ".space-reserve"
_RUN_FILES = ("trajectories.jsonl", "trajectories.errors.jsonl", "trajectories.corrupt.jsonl", "summary.json",
              "report.html", "run.json", _RESERVE)
#: Failed trajectory writes in a row after which a run stops: one can be a passing hiccup, several in a row mean
#: the disk stays full and every further episode would be computed only to be lost.
_STOP_AFTER_LOST_WRITES = 3


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``eval`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("eval", help="run a policy on a task suite and report success, turns, tokens and time")
    p.add_argument("--suite", required=True, help="suite name (see 'agentgym list') or path to a suite .yaml")
    p.add_argument("--policy", required=True, help="reference | hf:MODEL (a model directory or a cached Hub id such as "
                   "Qwen/Qwen2.5-0.5B-Instruct) | vllm:MODEL (GPU) | openai:BASE_URL[#MODEL]")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate only the first N tasks")
    p.add_argument("--group-size", type=positive_int, default=1, help="rollouts per task")
    p.add_argument("--max-in-flight", type=positive_int, default=64)
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help="tokens per turn (default: what the model was trained with, else 256)")
    p.add_argument("--system-prompt", default=None,
                   help="system prompt (default: the one the model was trained with, else the env's instructions)")
    p.add_argument("--constrain-actions", action=argparse.BooleanOptionalAction, default=None,
                   help="decode every reply as one of the env's valid actions (envs with a finite action set, hf: "
                        "policies); default: as the model was trained (its agentgym.json), else off")
    p.add_argument("--temperature", type=non_negative_float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default runs/eval-SUITE-TIME); must be new or "
                   "empty unless --resume or --overwrite")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue the run in --out: skip (task, sample) pairs it already holds")
    existing.add_argument("--overwrite", action="store_true", help="delete the results of the run in --out first")
    p.add_argument("--force", action="store_true",
                   help="with --resume: continue even though the settings differ from the run's run.json (the "
                        "differences are listed, then recorded in resume_changes.jsonl; its summary mixes both)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (by default one is drawn when stderr is a terminal)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate ``--policy`` on ``--suite``; model defaults (system prompt, max tokens) come from its training."""
    from rich.console import Console

    from agentgym.cli.report import render_summary_table, write_html_report
    from agentgym.policies import SamplingParams, make_policy
    from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite, summarize
    from agentgym.storage import TrajectoryWriter, errors_path
    from agentgym.utils.durable import SpaceReserve, atomic_write_text
    from agentgym.utils.terminal import terminal_safe

    suite = _load_suite(args.suite)
    if args.split not in suite.splits:
        raise ConfigError(f"Suite {suite.name!r} has no split {args.split!r}; choose one of {sorted(suite.splits)}.")
    defaults: dict[str, Any] = {}
    defaults_source: str | None = None
    if args.policy.startswith(("hf:", "vllm:")):
        from agentgym.policies.rollout_defaults import load_rollout_defaults

        defaults = load_rollout_defaults(args.policy.split(":", 1)[1])
        defaults_source = "its agentgym.json" if defaults else None
    threads_note = _choose_cpu_threads(args.policy)
    # The policy loads first: a bad --policy must not leave a half-made run directory behind.
    policy = make_policy(args.policy)
    if args.policy.startswith("openai:"):
        defaults, defaults_source = _server_defaults(policy, args)
    system_prompt = args.system_prompt if args.system_prompt is not None else defaults.get("system_prompt")
    max_tokens = args.max_tokens if args.max_tokens is not None else int(defaults.get("max_tokens", 256))
    sampling = SamplingParams(max_tokens=max_tokens, temperature=args.temperature, seed=args.seed)
    constrain = args.constrain_actions if args.constrain_actions is not None else bool(defaults.get("constrain_actions"))
    config = RolloutConfig(max_in_flight=args.max_in_flight, sampling=sampling,
                           progress=False if args.no_progress else "auto", system_prompt=system_prompt,
                           constrain_actions=constrain)
    out_dir = Path(args.out) if args.out else _new_default_out_dir(suite.name)
    if args.force and not args.resume:
        raise ConfigError("--force only applies to --resume (continue a run whose settings differ); drop it, or "
                          "add --resume.")
    # Everything that decides which episodes run and how they are sampled: a resume must match it (run.json).
    settings = {"suite": suite.name, "split": args.split, "policy": args.policy, "seed": args.seed,
                "group_size": args.group_size, "limit": args.limit,
                "sampling": {"temperature": args.temperature, "max_tokens": max_tokens,
                             "system_prompt": system_prompt, "constrain_actions": constrain}}
    started = time.perf_counter()
    console = Console()
    if threads_note is not None:
        console.print(terminal_safe(threads_note), highlight=False)
    finished: list[Any] = []  # every episode that ended, written or not
    stopped: _WritesKeepFailing | None = None
    reserve: SpaceReserve | None = None
    try:
        previous = _prepare_run_dir(out_dir, settings, resume=args.resume, overwrite=args.overwrite, force=args.force,
                                    console=console)
        done = {(t.task_id, t.seed) for t in previous}
        specs = [s for s in episodes_for_suite(suite, args.split, group_size=args.group_size, seed=args.seed,
                                               limit=args.limit)
                 if (s.task.id if s.task is not None else "", s.seed) not in done]
        if previous:
            console.print(f"resuming {out_dir}: {len(previous)} episodes already done, {len(specs)} to run")
        reserve = SpaceReserve(out_dir / _RESERVE)  # room for the summary when the disk fills during the run
        with TrajectoryWriter(out_dir / "trajectories.jsonl", raise_on_os_error=False) as writer:

            def on_trajectory(trajectory: Any) -> None:
                finished.append(trajectory)
                if writer.consecutive_lost >= _STOP_AFTER_LOST_WRITES:
                    raise _WritesKeepFailing(writer.consecutive_lost)

            try:
                RolloutEngine(policy, config).run(specs, writer=writer, on_trajectory=on_trajectory)
            except _WritesKeepFailing as exc:
                stopped = exc
    except OSError as exc:  # the run directory itself cannot be written
        raise ConfigError(f"Cannot write the run in {out_dir}: {exc}. Free space there (or fix its permissions), "
                          "or choose another --out directory.") from None
    finally:
        policy.close()
        if reserve is not None:
            reserve.release()  # before the summary and report, which it is there to make room for
    written = [t for t in finished if t.traj_id not in writer.unwritten]
    trajectories = previous + written
    summary = summarize(trajectories)  # over the episodes the file holds: what a --resume or 'view' will see
    summary["write_failures"] = writer.failed
    summary["lost_episodes"] = writer.lost
    summary["not_run"] = len(specs) - len(finished)
    summary["complete"] = not (writer.lost or writer.failed or stopped)
    summary["wall_s"] = time.perf_counter() - started
    summary.update({"suite": suite.name, "split": args.split, "policy": args.policy})
    from agentgym.cli.eval_warnings import run_warnings

    warnings = run_warnings(trajectories, max_tokens=max_tokens, system_prompt=system_prompt, defaults=defaults,
                            source=defaults_source, context=defaults.get("max_model_len"))
    summary["warnings"] = warnings
    problems: list[str] = []
    try:
        atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    except OSError as exc:
        problems.append(f"summary.json could not be written ({exc}); any earlier one is unchanged")
    title = f"{suite.name} [{args.split}] with {args.policy}"
    try:
        write_html_report(out_dir / "report.html", summary, trajectories, title)
    except OSError as exc:
        problems.append(f"report.html could not be written ({exc})")
    console.print(render_summary_table(summary, title=title))
    console.print(f"trajectories: {out_dir / 'trajectories.jsonl'}\nsummary: {out_dir / 'summary.json'}\n"
                  f"report: {out_dir / 'report.html'}")
    for warning in warnings:
        sys.stderr.write(terminal_safe(f"agentgym eval: warning: {warning}\n"))
    lost = writer.lost + writer.failed
    if stopped is not None or lost:
        missing = lost + summary["not_run"]
        what = (f"stopped early: the last {stopped.count} episodes in a row could not be written"
                if stopped is not None else f"{lost} episode(s) could not be written")
        cause = f" ({writer.last_error})" if writer.last_error is not None else ""
        problems.insert(0, (
            f"{what} to {out_dir / 'trajectories.jsonl'}{cause}. It holds {len(trajectories)} episodes; "
            f"{writer.lost} were lost to write errors, {writer.failed} could not be serialised (kept in "
            f"{errors_path(out_dir / 'trajectories.jsonl').name}) and {summary['not_run']} were not run. "
            f"Free space on that disk, then run the same command with --out {out_dir} --resume to run the "
            f"{missing} missing episode(s)."))
    for problem in problems:
        sys.stderr.write(terminal_safe(f"agentgym eval: error: {problem}\n"))
    return 1 if problems else 0


def _choose_cpu_threads(policy_spec: str) -> str | None:
    """For a model sampled in this process on the CPU, set torch's thread count so that it does not fight the
    machine's other work (:mod:`agentgym.utils.cpu_threads`); returns the line that says what was chosen."""
    if not policy_spec.startswith("hf:"):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    from agentgym.utils.cpu_threads import apply_cpu_threads

    return f"CPU: {apply_cpu_threads().reason}"


def _load_suite(name: str) -> Any:
    """The suite ``--suite`` names: a suite name or YAML path, or an env id, whose suite is then the one that
    registers it (its YAML's ``entry_point``) or the one shipped suite that uses it; several are named to choose."""
    from agentgym.errors import TaskError
    from agentgym.registration.suites import load_suite

    try:
        return load_suite(name)
    except TaskError:
        if "/" not in name or name.endswith((".yaml", ".yml", ".jsonl")):
            raise
        from agentgym.cli.env_lookup import suite_registering, suites_using

        found = suite_registering(name)
        if found is not None:
            return load_suite(str(found))
        using = suites_using(name)
        if len(using) == 1:
            sys.stderr.write(f"agentgym eval: {name} is an env id; evaluating its suite {using[0]!r}\n")
            return load_suite(using[0])
        if using:
            raise ConfigError(f"{name!r} is an env id, not a suite; these suites run in it: {', '.join(using)}. "
                              f"Pass one of them as --suite.") from None
        from agentgym.cli.env_lookup import suite_env_ids
        from agentgym.errors import did_you_mean

        raise ConfigError(f"No suite runs in env {name!r}.{did_you_mean(name, suite_env_ids())} Pass a suite name "
                          "('agentgym list' shows them), a suite .yaml path, or an env id a suite runs in.") from None


def _server_defaults(policy: Any, args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """What the server says its model was trained with (``agentgym serve`` publishes it), said on stderr; flags the
    user set win. A server that publishes nothing (vLLM, hosted APIs) leaves the usual defaults."""
    from agentgym.utils.terminal import terminal_safe

    published = policy.fetch_server_defaults()
    used = {k: published[k] for k in ("system_prompt", "max_tokens") if k in published
            and getattr(args, k) is None}
    if used:
        shown = ", ".join(f"{k.replace('_', ' ')} {v!r}" for k, v in used.items())
        sys.stderr.write(terminal_safe(f"agentgym eval: using the server's defaults for {policy.model}: {shown} "
                                       "(pass --system-prompt / --max-tokens to override)\n"))
    return published, ("the server" if published else None)


class _WritesKeepFailing(Exception):
    """Raised from the engine's per-episode callback to stop a run whose writes keep failing (a disk that stays full):
    running the rest would only lose them too."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} trajectory writes in a row failed")
        self.count = count


def _new_default_out_dir(suite_name: str) -> Path:
    """``runs/eval-SUITE-TIME``, with ``-2``, ``-3``... when runs started in the same second already made it."""
    base = Path(f"runs/eval-{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _limit_grows(run_file: Path, limit: int | None) -> bool:
    """Whether ``--limit`` keeps or raises the stored run's: its episodes are then a prefix of the new run's (the
    first N tasks, the same seeds), so resuming extends it to exactly what a fresh run would hold. A lower limit is
    a change like any other: the stored episodes past it would count in a summary that claims fewer tasks."""
    try:
        stored = json.loads(run_file.read_text(encoding="utf-8")).get("limit", None)
    except (OSError, ValueError, AttributeError):
        return False
    if stored is None:
        return limit is None
    return isinstance(stored, int) and (limit is None or limit >= stored)


def _prepare_run_dir(out_dir: Path, run: dict[str, Any], *, resume: bool, overwrite: bool, console: Any,
                     force: bool = False) -> list[Any]:
    """Make ``out_dir`` ready for an eval run and return the trajectories a resumed run already has.

    Appending to an existing run silently duplicated its episodes, so a non-empty directory is refused unless
    the user says what they want: ``--resume`` (keep what is there, run the rest; only with the same suite,
    split, policy, seed, group size, limit and sampling settings, unless ``--force``, which records the change)
    or ``--overwrite`` (delete the previous run's files, nothing else).
    A resumed file that holds a torn or corrupt line (a crash, a full disk) is repaired first: the line is moved to
    ``trajectories.corrupt.jsonl`` with a warning naming it, and its episode runs again.
    """
    from agentgym.storage import quarantine_path, repair_trajectories
    from agentgym.utils.run_settings import check_resume_settings, format_changes, write_settings

    existing = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if existing and not (resume or overwrite):
        shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
        raise ConfigError(
            f"{out_dir} is not empty ({shown}). Pass --resume to run only the episodes missing from its "
            "trajectories.jsonl, --overwrite to replace its results, or choose a new --out directory."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file = out_dir / "run.json"
    if overwrite:
        for name in _RUN_FILES:
            (out_dir / name).unlink(missing_ok=True)
    elif resume and run_file.is_file():
        changes = check_resume_settings(run_file, run, force=force, what=f"the evaluation in {out_dir}",
                                        new_dir_hint="choose a new --out directory (or --overwrite to start this "
                                                     "one again)",
                                        ignore=("limit",) if _limit_grows(run_file, run.get("limit")) else ())
        if changes:
            console.print(f"resuming {out_dir} with changed settings (--force; recorded in resume_changes.jsonl):\n"
                          f"{format_changes(changes)}", markup=False, highlight=False)
    write_settings(run_file, run)
    trajectories = out_dir / "trajectories.jsonl"
    if not (resume and trajectories.is_file()):
        return []
    try:
        repair = repair_trajectories(trajectories)
    except OSError as exc:
        raise ConfigError(f"Cannot repair {trajectories} before resuming: {exc}. Free space on that disk and run "
                          "the same command again.") from None
    if repair.corrupt_lines:
        shown = ", ".join(map(str, repair.corrupt_lines[:10])) + (", ..." if len(repair.corrupt_lines) > 10 else "")
        console.print(f"{trajectories}: moved {len(repair.corrupt_lines)} unreadable line(s) (line {shown}) to "
                      f"{quarantine_path(trajectories)}; their episodes run again", markup=False, highlight=False)
    return repair.trajectories
