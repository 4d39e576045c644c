"""ArCHer vs online filtered BC vs GRPO at an equal number of environment episodes.

All three start from the same behaviour-cloned tiny model (built once, offline) and train on a multi-turn
game of the games family, each for the same number of episodes and several seeds. Held-out success
(greedy) is measured along the way and plotted against episodes. Default: guess-the-number, where a
guess's worth shows only turns later; its held-out split is the test split's 10x wider range (the train
split uses up every secret of the training range), so it measures transfer. On the maze (``--suite
games-maze``) the default held-out split is ``validation``, new mazes of the training size, where training
gains can show; ``--eval-split test`` measures transfer to 7x7 mazes. Maze episodes are long (about 600
tokens), so its warm start alone takes about 20 minutes on one CPU core.

    python benchmarks/archer_vs_bc.py                 # 3 seeds x 96 episodes per method (~15 min on 2 CPU cores)
    python benchmarks/archer_vs_bc.py --quick         # a smoke run (1 seed, 32 episodes)
    python benchmarks/archer_vs_bc.py --suite games-maze --build-only   # the model configs/archer_maze.yaml uses

Each run lives in ``WORKDIR/SUITE/METHOD/seedN`` (ArCHer's replay buffer there is what
``benchmarks/archer_critic_fit.py`` reads). Writes the curves to ``--out`` (default
``runs/archer_vs_bc.png``, or ``runs/archer_vs_bc_maze.png`` for the maze), the raw points to ``--out``'s ``.json``,
and prints a table with each method's final held-out success, its ratio to filtered BC and, for ArCHer, the
critic's explained variance (how much of the spread of the buffer's returns the critic predicts).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

METHODS = ("archer", "filtered_bc", "grpo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="games-guess", help="multi-turn games suite (games-guess or games-maze)")
    p.add_argument("--eval-split", default=None,
                   help="held-out split (default: validation where the suite has one, else test)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per method")
    p.add_argument("--episodes", type=int, default=96, help="training episodes per run (equal for every method)")
    p.add_argument("--episodes-per-iteration", type=int, default=16, help="episodes per ArCHer/BC iteration and GRPO step")
    p.add_argument("--evals", type=int, default=2, help="held-out evaluations after the start (evenly spaced)")
    p.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks per evaluation")
    p.add_argument("--bc-steps", type=int, default=150, help="steps of the shared behaviour-cloning warm start")
    p.add_argument("--critic-steps", type=int, default=4,
                   help="ArCHer critic updates per iteration (16 transitions each; the reference runs 50 of 256)")
    p.add_argument("--workdir", default="runs/archer_vs_bc", help="where models and runs go")
    p.add_argument("--out", default=None,
                   help="PNG of the curves (default: runs/archer_vs_bc.png for games-guess, runs/archer_vs_bc_maze.png "
                        "for games-maze)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    p.add_argument("--quick", action="store_true", help="1 seed, 32 episodes, 8 eval tasks, 30 BC steps")
    p.add_argument("--build-only", action="store_true",
                   help="only build the tiny model (WORKDIR/base-SUITE) and its warm start, then exit")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.episodes, args.eval_tasks, args.bc_steps, args.episodes_per_iteration = 1, 32, 8, 30, 8
    for name in ("seeds", "episodes", "episodes_per_iteration", "eval_tasks", "bc_steps", "critic_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.evals < 0:
        p.error(f"--evals must be >= 0, got {args.evals}")
    if args.episodes % args.episodes_per_iteration:
        p.error("--episodes must be a multiple of --episodes-per-iteration")
    from agentgym.errors import TaskError
    from agentgym.registration.suites import load_suite

    try:
        splits = load_suite(args.suite).splits
    except TaskError as exc:
        p.error(str(exc))
    if args.out is None:
        short = args.suite.removeprefix("games-")
        args.out = "runs/archer_vs_bc.png" if short == "guess" else f"runs/archer_vs_bc_{short}.png"
    if args.eval_split is None:
        args.eval_split = "validation" if "validation" in splits else "test"
    if args.eval_split not in splits or args.eval_split == "train":
        p.error(f"--eval-split must be a held-out split of {args.suite}: one of {sorted(set(splits) - {'train'})}")
    return args


def warm_start(args: argparse.Namespace, workdir: Path) -> Path:
    """A tiny model with a tokenizer trained on the suite's text, behaviour-cloned on reference episodes."""
    from agentgym.models.tiny import build_tiny_model, load_tiny_model
    from agentgym.rollout import run_reference_episode
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations

    target = workdir / f"warm-{args.suite}-bc{args.bc_steps}"
    if (target / "config.json").is_file():
        return target
    suite = load_suite(args.suite)
    env = suite.make_env()
    texts: list[str] = []
    try:
        _, info = env.reset(seed=0)
        texts.append(str(info["instructions"]))
        for i, task in enumerate(suite.train[:100]):
            for turn in run_reference_episode(env, task, seed=i).turns:
                texts += [turn.observation, turn.action]
    finally:
        env.close()
    base = build_tiny_model(workdir / f"base-{args.suite}", texts=[t for t in texts if t])
    model, tokenizer = load_tiny_model(base)
    demos = collect_demonstrations(suite, "train", 200, tokenizer, system_prompt="")
    behaviour_clone(model, tokenizer, demos, steps=args.bc_steps, learning_rate=1e-3, batch_size=32, seed=0)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def run_one(method: str, seed: int, model: Path, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Train one method for ``args.episodes`` episodes; returns its held-out curve ``[(episodes, success)]``."""
    per_iter = args.episodes_per_iteration
    iterations = args.episodes // per_iter
    eval_every = max(1, iterations // max(args.evals, 1))
    out = workdir / args.suite / method / f"seed{seed}"
    shared = dict(model=str(model), suite=args.suite, eval_split=args.eval_split, output_dir=str(out),
                  system_prompt="", seed=seed,
                  eval_every=eval_every, eval_tasks=args.eval_tasks, checkpoint_every=0, tensorboard=False,
                  max_context_tokens=1024)
    started = time.perf_counter()
    if method == "grpo":
        from agentgym.trainers.config import GrpoConfig
        from agentgym.trainers.grpo import GrpoTrainer

        group = 4
        cfg = GrpoConfig(**shared, steps=iterations, tasks_per_step=per_iter // group, group_size=group,
                         learning_rate=1e-4, warmup_steps=1, max_tokens_per_turn=16)
        GrpoTrainer(cfg).train()
    else:
        actor = dict(steps=iterations, tasks_per_step=per_iter, actor_warmup_steps=min(1, iterations - 1),
                     learning_rate=1e-4, actor_steps=2, batch_size=16, max_tokens_per_turn=16)
        if method == "archer":
            from agentgym.trainers.archer import ArcherConfig, ArcherTrainer

            ArcherTrainer(ArcherConfig(**shared, **actor, critic_steps=args.critic_steps, critic_learning_rate=3e-4,
                                                     critic_max_tokens=128)).train()
        else:
            from agentgym.trainers.filtered_bc import FilteredBCConfig, FilteredBCTrainer

            FilteredBCTrainer(FilteredBCConfig(**shared, **actor)).train()
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = sorted({r["step"] * per_iter: r["eval/success_rate"] for r in records if "eval/success_rate" in r}.items())
    train = [r["train/success_rate"] for r in records if "train/success_rate" in r]
    # how much of the spread of the buffer's Monte-Carlo returns the critic explains, over the last third of
    # the run (ArCHer only): near 0 means its advantages carry no information about which utterance pays
    fits = [r["critic/explained_variance"] for r in records if isinstance(r.get("critic/explained_variance"), float)]
    late = fits[len(fits) * 2 // 3:]
    return {"method": method, "seed": seed, "curve": curve, "seconds": seconds,
            "train_success_last": train[-1] if train else float("nan"),
            "critic_explained_variance": statistics.mean(late) if late else None}


def plot(results: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"archer": "tab:blue", "filtered_bc": "tab:orange", "grpo": "tab:green"}
    for method in METHODS:
        runs = [r for r in results if r["method"] == method]
        if not runs:
            continue
        for r in runs:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, color=colors[method], alpha=0.25, linewidth=1)
        xs = [x for x, _ in runs[0]["curve"]]
        mean = [statistics.mean(dict(r["curve"]).get(x, float("nan")) for r in runs) for x in xs]
        ax.plot(xs, mean, color=colors[method], marker="o", linewidth=2, label=f"{method} (mean of {len(runs)})")
    ax.set_xlabel("training episodes")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| method | start | final (mean ± sd over seeds) | per seed | vs filtered BC | s/run | critic EV |",
            "|---|---|---|---|---|---|---|"]
    finals: dict[str, list[float]] = {}
    for method in METHODS:
        runs = [r for r in results if r["method"] == method]
        if runs:
            finals[method] = [r["curve"][-1][1] for r in runs]
    ref = statistics.mean(finals["filtered_bc"]) if "filtered_bc" in finals else float("nan")
    for method, values in finals.items():
        runs = [r for r in results if r["method"] == method]
        mean = statistics.mean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        start = statistics.mean(r["curve"][0][1] for r in runs)
        ratio = f"{mean / ref:.2f}x" if ref > 0 else "n/a"
        secs = statistics.mean(r["seconds"] for r in runs)
        fits = [r["critic_explained_variance"] for r in runs if r.get("critic_explained_variance") is not None]
        fit = f"{statistics.mean(fits):.3f}" if fits else "-"
        rows.append(f"| {method} | {start:.3f} | {mean:.3f} ± {sd:.3f} | {', '.join(f'{v:.3f}' for v in values)} "
                    f"| {ratio} | {secs:.0f} | {fit} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        sys.exit(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = warm_start(args, workdir)
    sys.stdout.write(f"warm start ready in {time.perf_counter() - t0:.0f} s: {model}\n")
    if args.build_only:
        return 0
    results = []
    for seed in range(args.seeds):
        for method in methods:
            import shutil

            shutil.rmtree(workdir / args.suite / method / f"seed{seed}", ignore_errors=True)
            r = run_one(method, seed, model, args, workdir)
            results.append(r)
            sys.stdout.write(f"{method:12s} seed {seed}: {r['curve']} ({r['seconds']:.0f} s)\n")
            sys.stdout.flush()
    out = Path(args.out)
    title = f"{args.suite} ({args.eval_split}): tiny model, {args.episodes} episodes/run, {args.seeds} seed(s)"
    plot(results, out, title)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    sys.stdout.write(f"\n{title}; held-out = {args.eval_tasks} {args.eval_split} tasks, greedy\n{table(results)}\n")
    sys.stdout.write(f"curves: {out}; total {time.perf_counter() - t0:.0f} s\n")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        record(results, args, title)
    return 0


def record(results: list[dict[str, Any]], args: argparse.Namespace, title: str) -> None:
    """The table's final held-out success to ``benchmarks/results/archer_vs_bc.json``, filtered BC as the baseline
    (the same ``vs filtered BC`` ratio the table prints)."""
    from _results import figure, write_results

    finals = {m: statistics.mean(r["curve"][-1][1] for r in results if r["method"] == m)
              for m in METHODS if any(r["method"] == m for r in results)}
    ref = finals.get("filtered_bc", float("nan"))
    figures = []
    for method, mean in finals.items():
        if method == "filtered_bc":
            continue
        fits = [r["critic_explained_variance"] for r in results
                if r["method"] == method and r.get("critic_explained_variance") is not None]
        figures.append(figure(f"{title}: {method}, final greedy held-out success ({args.eval_tasks} {args.eval_split} "
                              "tasks); baseline: online filtered BC", mean, ref, unit="success rate",
                              ratio=mean / ref if ref > 0 else None,
                              note=f"critic explained variance {statistics.mean(fits):.3f}" if fits else None))
    write_results("archer_vs_bc", figures, details={"runs": results},
                  note="--quick: 1 seed, 32 episodes, 8 eval tasks, 30 BC steps" if args.quick else None)


if __name__ == "__main__":
    raise SystemExit(main())
