"""``agentgym rescore TRAJECTORIES --rubric RUBRIC --out NEW``: score stored episodes again, envs not re-run.

Reads a trajectories JSONL (``agentgym eval`` or a training run wrote it), scores every healthy episode with the
rubric (and the judge given by ``--judge``, else the rubric's own), writes the rescored trajectories, and prints
how the new scores agree with the stored ones and, where the env had a checker, the judge's accuracy against it.
Judge replies are cached in ``--cache-dir`` (default: the output's folder), so running it again costs no call.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentgym.cli.arguments import positive_int
from agentgym.errors import ConfigError

__all__ = ["add_parser", "run"]

def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``rescore`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("rescore", help="score stored trajectories again with a rubric (no env is re-run)")
    p.add_argument("trajectories", help="a trajectories.jsonl file")
    p.add_argument("--rubric", required=True, help="the rubric: 'module:name' or 'path/to/file.py:name' naming a "
                   "Rubric (or a function returning one)")
    p.add_argument("--out", required=True, help="where to write the rescored trajectories (JSONL)")
    p.add_argument("--judge", default=None, help="the judge policy: openai:BASE_URL[#MODEL], hf:MODEL, vllm:MODEL, "
                   "or scripted-naive (a scripted stand-in for tests); default: the rubric's own judge")
    p.add_argument("--judge-mode", choices=("independent", "group"), default="independent",
                   help="one judge call per episode, or one per task group scoring its episodes against each other")
    p.add_argument("--verdict-format", choices=("line", "json"), default="line",
                   help="how --judge answers: line (a closing 'VERDICT: x' line) or json (decoded under a JSON schema, "
                        "so a small judge model always gives a verdict in the scale)")
    p.add_argument("--cache-dir", default=None, help="judge cache folder (default: the folder of --out)")
    p.add_argument("--judge-timeout", type=float, default=120.0, help="seconds per judge call before a retry")
    p.add_argument("--judge-retries", type=int, default=2, help="retries of a failed judge call")
    p.add_argument("--limit", type=positive_int, default=None, help="at most this many episodes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Rescore, write, and print the agreement summary as JSON."""
    from agentgym.rewards.agreement import agreement
    from agentgym.rewards.rubric import load_rubric
    from agentgym.rollout.judging import NAIVE_JUDGE, PolicyJudge, judge_policy, judge_trajectories
    from agentgym.storage import read_trajectories, write_trajectories

    source, out = Path(args.trajectories), Path(args.out)
    if not source.is_file():
        raise ConfigError(f"No trajectories file at {source}; pass the trajectories.jsonl that 'agentgym eval' wrote.")
    if out.resolve() == source.resolve():
        raise ConfigError("--out must differ from the input: the stored scores are what the new ones are compared with.")
    if args.judge_timeout <= 0 or args.judge_retries < 0:
        raise ConfigError("--judge-timeout must be > 0 and --judge-retries >= 0.")
    rubric = load_rubric(args.rubric)
    try:
        old = list(read_trajectories(source))
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{source} is not a trajectories file ({exc}).") from exc
    if args.limit is not None:
        old = old[: args.limit]
    judge = None
    if args.judge is not None or rubric.needs_judge:
        if args.judge is None and rubric.judge is not None:
            judge = rubric.judge
        else:
            if args.judge is None:
                raise ConfigError(f"Rubric {rubric.name!r} has judge criteria and no judge: pass --judge "
                                  f"openai:BASE_URL[#MODEL] (or {NAIVE_JUDGE} for a scripted stand-in).")
            judge = PolicyJudge(judge_policy(args.judge), cache_dir=args.cache_dir or out.parent,
                                timeout_s=args.judge_timeout, retries=args.judge_retries,
                                verdict_format=args.verdict_format)
    new, stats = judge_trajectories(old, rubric, judge, mode=args.judge_mode)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    write_trajectories(out, new)
    summary = {**agreement(old, new), **stats, "out": str(out)}
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0
