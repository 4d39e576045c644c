"""ARPO vs GRPO at an equal rollout budget, on the tiny model and a tool env (the calculator games suite).

Both methods start from the same tiny model and the same behaviour-cloning warm start (the quickstart
recipe: half of the demonstrations skip the calculator and answer wrongly, so RL has a tool decision to
fix), and train for the same steps on the same tasks with the same number of trajectories per task (M):
GRPO samples M independent rollouts, ARPO starts N = M/2 and grows them to M by entropy-guided
branching after tool results. After training each model is evaluated greedily on held-out tasks.

    python benchmarks/arpo_vs_grpo.py            # 3 seeds x 2 methods (~15 min on 2 CPU cores)
    python benchmarks/arpo_vs_grpo.py --quick    # 1 seed, 3 steps: a smoke run

Prints, per method: held-out success before and after (mean ± sd over seeds), tool calls per solved
task, trained tokens per step, and ARPO's branching statistics; writes the raw numbers to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

METHODS = ("grpo", "arpo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="games-calc", help="tool-use suite to train and evaluate on")
    p.add_argument("--seeds", type=int, default=3, help="seeds per method")
    p.add_argument("--steps", type=int, default=10, help="training steps per run")
    p.add_argument("--tasks-per-step", type=int, default=8, help="tasks per step")
    p.add_argument("--budget", type=int, default=8, help="trajectories per task (M) for both methods")
    p.add_argument("--initial", type=int, default=4, help="ARPO's initial rollouts per task (N)")
    p.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks for the final evaluation")
    p.add_argument("--bc-steps", type=int, default=600, help="behaviour-cloning warm-start steps")
    p.add_argument("--workdir", default="runs/arpo_vs_grpo", help="where models and runs go")
    p.add_argument("--out", default="runs/arpo_vs_grpo.json", help="raw results")
    p.add_argument("--quick", action="store_true", help="1 seed, 3 steps, 50 eval tasks, 100 BC steps")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_tasks, args.bc_steps = 1, 3, 50, 100
    if not 1 <= args.initial <= args.budget:
        p.error("--initial must be between 1 and --budget")
    return args


def base_model(args: argparse.Namespace, workdir: Path) -> Path:
    """The quickstart's tiny model: a BPE tokenizer and random weights, built offline once."""
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.cli.quickstart import demonstration_texts

    target = workdir / f"base-{args.suite}"
    if not (target / "config.json").is_file():
        build_tiny_model(target, texts=demonstration_texts(args.suite, 500), config=TinyModelConfig())
    return target


def held_out(model_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Greedy success and tool calls per solved task on the suite's test split."""
    from agentgym.policies import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite
    from agentgym.registration.suites import load_suite

    suite = load_suite(args.suite)
    policy = HFPolicy.from_pretrained(model_dir, max_batch_size=256)
    config = RolloutConfig(sampling=SamplingParams(max_tokens=24, temperature=0.0), system_prompt="",
                           max_context_tokens=256, deterministic=True)
    trajectories = RolloutEngine(policy, config).run(episodes_for_suite(suite, "test", limit=args.eval_tasks))
    solved = [t for t in trajectories if t.success]
    return {"success": len(solved) / max(len(trajectories), 1),
            "tool_calls_per_solved": statistics.mean(t.num_tool_calls for t in solved) if solved else float("nan"),
            "tool_calls_per_episode": statistics.mean(t.num_tool_calls for t in trajectories)}


def run_one(method: str, seed: int, model: Path, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / method / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    shared = dict(model=str(model), suite=args.suite, output_dir=str(out), system_prompt="", seed=seed,
                  warmstart="bc", bc_demos=200, bc_shortcut_fraction=0.5, bc_steps=args.bc_steps, bc_learning_rate=1e-3,
                  bc_batch_size=32, steps=args.steps, tasks_per_step=args.tasks_per_step, group_size=args.budget,
                  learning_rate=3e-4, warmup_steps=min(10, args.steps), max_tokens_per_turn=24, max_context_tokens=256,
                  eval_every=0, eval_tasks=args.eval_tasks, checkpoint_every=0, tensorboard=False,
                  clip_eps_high=0.2)
    started = time.perf_counter()
    if method == "grpo":
        from agentgym.trainers.config import GrpoConfig
        from agentgym.trainers.grpo import GrpoTrainer

        summary = GrpoTrainer(GrpoConfig(**shared)).train()
    else:
        from agentgym.trainers.arpo import ArpoConfig, ArpoTrainer

        summary = ArpoTrainer(ArpoConfig.from_dict({**shared, "initial_rollouts": args.initial})).train()
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r or "train/tokens" in r]
    result: dict[str, Any] = {
        "method": method, "seed": seed, "seconds": seconds,
        "before": summary.get("eval_before", {}).get("success_rate", float("nan")),
        "after": held_out(out / "model", args),
        "trained_tokens_per_step": statistics.mean(r.get("train/tokens", 0.0) for r in steps) if steps else 0.0,
        "rollouts_per_step": statistics.mean(r.get("train/episodes", 0.0) for r in steps) if steps else 0.0,
    }
    if method == "arpo":
        keys = ("arpo/branches_per_task", "arpo/restarts_per_task", "arpo/entropy_after_tool", "arpo/entropy_initial",
                "arpo/tool_calls_per_episode")
        result["branching"] = {k.split("/", 1)[1]: statistics.mean(r[k] for r in steps if k in r and r[k] == r[k])
                               for k in keys if any(k in r and r[k] == r[k] for r in steps)}
    return result


def _mean_sd(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| method | held-out success before | after (mean ± sd) | per seed | tool calls / solved | "
            "trained tokens / step | rollouts / step | s/run |", "|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        runs = [r for r in results if r["method"] == method]
        if not runs:
            continue
        after = [r["after"]["success"] for r in runs]
        rows.append(
            f"| {method} | {_mean_sd([r['before'] for r in runs])} | {_mean_sd(after)} | "
            f"{', '.join(f'{v:.3f}' for v in after)} | {_mean_sd([r['after']['tool_calls_per_solved'] for r in runs])} | "
            f"{statistics.mean(r['trained_tokens_per_step'] for r in runs):.0f} | "
            f"{statistics.mean(r['rollouts_per_step'] for r in runs):.0f} | {statistics.mean(r['seconds'] for r in runs):.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = base_model(args, workdir)
    results: list[dict[str, Any]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for seed in range(args.seeds):
        for method in METHODS:
            torch.manual_seed(seed)
            r = run_one(method, seed, model, args, workdir)
            results.append(r)
            out.write_text(json.dumps(results, indent=2), encoding="utf-8")  # progress survives an interruption
            sys.stdout.write(f"{method} seed {seed}: before {r['before']:.3f} after {r['after']['success']:.3f} "
                             f"tool calls/solved {r['after']['tool_calls_per_solved']:.2f} ({r['seconds']:.0f} s) "
                             f"{r.get('branching', '')}\n")
            sys.stdout.flush()
    sys.stdout.write(f"\n{args.suite}: M={args.budget} trajectories per task for both (ARPO N={args.initial}), "
                     f"{args.steps} steps x {args.tasks_per_step} tasks, {args.seeds} seed(s)\n{table(results)}\n")
    for r in results:
        if r["method"] == "arpo":
            sys.stdout.write(f"ARPO seed {r['seed']} branching: {json.dumps(r.get('branching', {}))}\n")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        record(results, args)
    return 0


def record(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The table's means to ``benchmarks/results/arpo_vs_grpo.json``: ARPO is agentgym's row, GRPO the baseline."""
    from _results import figure, write_results

    def mean(method: str, key: Any) -> float:
        values = [key(r) for r in results if r["method"] == method]
        values = [v for v in values if v == v]
        return statistics.mean(values) if values else float("nan")

    workload = (f"{args.suite}, M={args.budget} trajectories per task (ARPO N={args.initial}), {args.steps} steps x "
                f"{args.tasks_per_step} tasks, {args.seeds} seed(s); ARPO; baseline: GRPO at the same budget")
    write_results("arpo_vs_grpo", [
        figure(f"{workload}: greedy held-out success after training ({args.eval_tasks} tasks)",
               mean("arpo", lambda r: r["after"]["success"]), mean("grpo", lambda r: r["after"]["success"]),
               unit="success rate", note="before training: "
               f"{mean('arpo', lambda r: r['before']):.3f} vs {mean('grpo', lambda r: r['before']):.3f}"),
        figure(f"{workload}: tool calls per solved task", mean("arpo", lambda r: r["after"]["tool_calls_per_solved"]),
               mean("grpo", lambda r: r["after"]["tool_calls_per_solved"]), unit="calls"),
        figure(f"{workload}: trained tokens per step", mean("arpo", lambda r: r["trained_tokens_per_step"]),
               mean("grpo", lambda r: r["trained_tokens_per_step"]), unit="tokens"),
    ], details={"runs": results}, note="--quick: 1 seed, 3 steps, 50 eval tasks, 100 BC steps" if args.quick else None)


if __name__ == "__main__":
    raise SystemExit(main())
