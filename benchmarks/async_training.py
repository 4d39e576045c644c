"""Asynchronous vs synchronous training at the same budget, with realistic tool latency, side by side in one run.

GRPO on the calculator (games-calc, the quickstart task) from one shared behaviour-cloned tiny model, where every
env step waits a lognormal time (median ``--latency-median`` s, sigma ``--latency-sigma``), as real tools do. Three
settings train for the same steps, tasks and group size from the same warm start and seeds:

* synchronous (``max_staleness: 0``): sample a step's episodes, then learn from them;
* one-step-off (``max_staleness: 1``): the next step's episodes are generated while this step trains;
* staleness 2 (``max_staleness: 2``);

each asynchronous setting with its rollout worker in a thread of the trainer (``async_worker: thread``) and in a
process of its own (``async_worker: process``; ``--workers`` picks which).

Reports wall time per training step (the goal: asynchronous at least 1.5x faster on 2 CPU cores) and final greedy
held-out success per seed (the goal: within the seed spread of synchronous), plus the measured lag.

    python benchmarks/async_training.py            # 3 seeds x 5 settings
    python benchmarks/async_training.py --workers thread   # only the thread worker's rows
    python benchmarks/async_training.py --quick    # 1 seed, 3 steps: a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

SLOW_ID = "agentgym-bench/SlowCalculator-v0"
SETTINGS = (("synchronous", 0), ("one-step-off", 1), ("staleness 2", 2))
WORKERS = ("thread", "process")


class ToolLatency(gym.Wrapper):
    """Every step (a tool call or an answer) takes a lognormal time, seeded per episode, like a real tool."""

    def __init__(self, env: gym.Env, median_s: float, sigma: float) -> None:
        super().__init__(env)
        self.median_s, self.sigma = median_s, sigma
        self.env.unwrapped.cheap_steps = False  # the engine must run these steps on worker threads
        self._rng = np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._rng = np.random.default_rng(seed)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        time.sleep(min(10.0, self.median_s * float(np.exp(self.sigma * self._rng.standard_normal()))))
        return self.env.step(action)


def slow_calculator(median_s: float, sigma: float, **kwargs: Any) -> gym.Env:
    """The calculator behind tool latency (a module-level factory, so a rollout worker process can build it)."""
    from agentgym.envs.games.calculator import CalculatorEnv

    return ToolLatency(CalculatorEnv(**kwargs), median_s, sigma)


def register(median_s: float, sigma: float) -> None:
    if SLOW_ID not in gym.registry:
        gym.register(id=SLOW_ID, entry_point=slow_calculator, kwargs={"median_s": median_s, "sigma": sigma})


def slow_suite(workdir: Path) -> Path:
    """games-calc's tasks behind the slow env (a suite file the trainer loads like any other)."""
    import yaml

    import agentgym.tasks

    spec = yaml.safe_load((Path(agentgym.tasks.__file__).parent / "suites" / "games-calc.yaml").read_text())
    spec.update(name="slow-calc", env=SLOW_ID)
    path = workdir / "slow-calc.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def warm_start(workdir: Path, bc_steps: int) -> Path:
    """The quickstart's tiny model after a BC warm start on half-shortcut demonstrations (built once)."""
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model, load_tiny_model
    from agentgym.cli.quickstart import demonstration_texts
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations

    target = workdir / "warm"
    if (target / "config.json").is_file():
        return target
    base = build_tiny_model(workdir / "base", texts=demonstration_texts("games-calc", 500), config=TinyModelConfig())
    model, tokenizer = load_tiny_model(base)
    demos = collect_demonstrations(load_suite("games-calc"), "train", 200, tokenizer, shortcut_fraction=0.5, seed=0,
                                   system_prompt="")
    behaviour_clone(model, tokenizer, demos, steps=bc_steps, learning_rate=1e-3, batch_size=32, seed=0, progress=False)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def run_one(model: Path, suite: Path, staleness: int, worker: str, seed: int, args: argparse.Namespace,
            out: Path) -> dict[str, Any]:
    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict

    config = config_from_dict({
        "trainer": "grpo", "model": str(model), "suite": str(suite), "eval_suite": "games-calc", "eval_split": "test",
        "output_dir": str(out), "seed": seed, "system_prompt": "", "steps": args.steps, "tasks_per_step": 8,
        "group_size": 8, "learning_rate": 3e-4, "warmup_steps": 2, "eval_every": 0, "eval_tasks": args.eval_tasks,
        "checkpoint_every": 0, "max_tokens_per_turn": 24, "max_context_tokens": 256, "tensorboard": False,
        "progress": False, "max_staleness": staleness, "max_in_flight": 64,
        "async_worker": worker if staleness else "thread",
    })
    started = time.perf_counter()
    summary = make_trainer(config).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/episodes" in r]
    return {"staleness": staleness, "worker": worker if staleness else "-", "seed": seed,
            "wall_s": time.perf_counter() - started,
            "step_s": statistics.mean(r["time/step_s"] for r in steps) if steps else float("nan"),
            "train_wall_s": sum(r["time/step_s"] for r in steps),
            "before": summary["eval_before"]["success_rate"], "after": summary["eval_after"]["success_rate"],
            "lag": statistics.mean(r.get("async/staleness", 0.0) for r in steps) if steps else 0.0,
            "token_lag": statistics.mean(r.get("async/token_staleness_mean", 0.0) for r in steps) if steps else 0.0,
            "first_wait_s": steps[0].get("async/wait_s", 0.0) if steps else 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eval-tasks", type=int, default=100)
    p.add_argument("--latency-median", type=float, default=0.3, help="median seconds per env step")
    p.add_argument("--latency-sigma", type=float, default=1.0)
    p.add_argument("--bc-steps", type=int, default=600)
    p.add_argument("--workdir", default="runs/async_training")
    p.add_argument("--quick", action="store_true", help="1 seed, 3 steps, 20 eval tasks, 100 BC steps")
    p.add_argument("--workers", default=",".join(WORKERS), help="rollout workers of the asynchronous rows, "
                   "comma-separated (thread, process)")
    args = p.parse_args(argv)
    from _results import figure

    workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    if not workers or set(workers) - set(WORKERS):
        p.error(f"--workers takes a comma-separated subset of {', '.join(WORKERS)}, got {args.workers!r}")
    if args.quick:
        args.seeds, args.steps, args.eval_tasks, args.bc_steps = 1, 3, 20, 100
        args.workdir += "-quick"
    for name in ("seeds", "steps", "eval_tasks", "bc_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.latency_median < 0 or args.latency_sigma < 0:
        p.error("--latency-median and --latency-sigma must be >= 0")
    import logging

    logging.basicConfig(level=logging.WARNING)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    register(args.latency_median, args.latency_sigma)
    model, suite = warm_start(workdir, args.bc_steps), slow_suite(workdir)
    rows = [(name, staleness, "-") for name, staleness in SETTINGS if not staleness]
    rows += [(name, staleness, worker) for worker in workers for name, staleness in SETTINGS if staleness]
    results = []
    for seed in range(args.seeds):
        for name, staleness, worker in rows:
            out = workdir / (f"k{staleness}-{worker}" if staleness else "k0") / f"seed{seed}"
            r = run_one(model, suite, staleness, worker, seed, args, out)
            results.append(r)
            print(f"{name} ({worker}) seed {seed}: {r['step_s']:.2f} s/step, held-out {r['before']:.3f} -> "
                  f"{r['after']:.3f}, mean lag {r['lag']:.2f} (per token {r['token_lag']:.2f}), first wait "
                  f"{r['first_wait_s']:.1f} s", flush=True)
    sync_step = statistics.mean(r["step_s"] for r in results if r["staleness"] == 0)
    print(f"\nGRPO on games-calc, {args.steps} steps x 8 tasks x 8 rollouts, env step latency lognormal(median "
          f"{args.latency_median} s, sigma {args.latency_sigma})")
    print("| setting | worker | s / step (mean) | speed-up | held-out after (mean ± sd) | per seed | mean lag "
          "(per token) |")
    print("|---|---|---|---|---|---|---|")
    sync_after = [r["after"] for r in results if r["staleness"] == 0]
    sync_sd = statistics.stdev(sync_after) if len(sync_after) > 1 else None
    figures = []
    for name, staleness, worker in rows:
        rs = [r for r in results if r["staleness"] == staleness and r["worker"] == worker]
        after = [r["after"] for r in rs]
        sd = statistics.stdev(after) if len(after) > 1 else 0.0
        step_s = statistics.mean(r["step_s"] for r in rs)
        print(f"| {name} | {worker} | {step_s:.2f} | {sync_step / step_s:.2f}x | {statistics.mean(after):.3f} ± "
              f"{sd:.3f} | {', '.join(f'{a:.3f}' for a in after)} | {statistics.mean(r['lag'] for r in rs):.2f} "
              f"({statistics.mean(r['token_lag'] for r in rs):.2f}) |")
        if staleness:
            workload = (f"GRPO on games-calc, {args.steps} steps x 8 tasks x 8 rollouts, {args.seeds} seed(s), env step "
                        f"latency lognormal(median {args.latency_median} s, sigma {args.latency_sigma}): {name}, "
                        f"{worker} worker; baseline: synchronous")
            gap = abs(statistics.mean(after) - statistics.mean(sync_after))
            figures += [
                figure(workload, step_s, sync_step, unit="s/step", ratio=sync_step / step_s, goal=">= 1.5x faster",
                       met=sync_step / step_s >= 1.5, note="ratio is baseline / agentgym time (higher is better)"),
                figure(workload + " (greedy held-out success after training)", statistics.mean(after),
                       statistics.mean(sync_after), unit="success rate", goal="within the seed spread of synchronous",
                       met=None if sync_sd is None else gap <= sync_sd,
                       note=f"per seed {', '.join(f'{a:.3f}' for a in after)}" + (
                           "; one seed: no spread to judge against" if sync_sd is None else "")),
            ]
    (workdir / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        from _results import write_results

        write_results("async_training", figures, details={"results": results},
                      note="--quick: 1 seed, 3 steps, 20 eval tasks, 100 BC steps" if args.quick else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
