"""Score a finished study's models again, task by task, on its held-out split and on further held-out splits.

A study's goal reads one number per seed, the final model's success on the task's held-out split, with the
standard error between seeds. That error holds the seeds' spread on one fixed set of tasks, not the draw of the
tasks themselves: another 400 BabyAI rooms could put a gain measured at 0.101 on either side of 0.10, and every
choice a study makes after seeing its curves (how many steps, which weighting) is made on that one set. This
script measures both:

- **paired over tasks**: the warm start and every final model play the same tasks greedily, so each task gives
  each comparison a difference (the mean over seeds of one side minus the other). The standard error of the mean
  difference over tasks is the task-sampling error; added to the between-seed error (in quadrature, which
  counts the seed-by-task part twice, so it errs on the large side) it is the error of the claim for new rooms
  and new seeds alike.
- **replicated**: the same models on further held-out splits (BabyAI's ``test_replica`` and ``test_fresh``: 400
  rooms each from the held-out seed half, none of them in ``test_large``, in each other or in the training split)
  that no choice of the study saw.

Before it trusts the per-task outcomes, it checks that replaying the study's own split gives every model the
success its run logged (the same greedy episodes).

    python benchmarks/studies/held_out_replica.py gigpo_vs_grpo_babyai_mini_batches_30_steps --jobs 2

Writes ``benchmarks/results/held_out_NAME.json`` (a goal-scale study; ``--out`` chooses another folder). Each
model's outcomes on each split are cached in ``WORKDIR/held_out_cache``, keyed by the weights' hash and the
evaluation's settings, so a second call, one after an interruption, or another study holding the same runs plays
only what is missing (after changing an env's code, delete that folder: the key does not hold the code).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from studies import catalogue as cat  # noqa: E402
from studies import lr_tuning  # noqa: E402
from studies.catalogue import Study, credit  # noqa: E402


@dataclass(frozen=True)
class Model:
    """One model a study holds: the warm start (``method`` ``start``) or a run's final weights."""

    method: str
    seed: int
    directory: Path
    config: dict[str, Any]
    logged: float
    """Held-out success its run logged on the study's split: the final evaluation's, or the first for the warm
    start."""


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` on the same tasks; met when the difference is at least ``bar`` and more than 2 se."""

    a: str
    b: str
    bar: float
    goal: str
    is_goal: bool = True
    """One of the study's goals (else a figure shown beside them: another method against the warm start)."""


def study_models(study: Study, scale_name: str, workdir: Path, seeds: int,
                 learning_rate: float | None = None) -> list[Model]:
    """The warm start and every finished run of the study, in ``workdir`` as ``run.py`` left them (trained at
    ``learning_rate``; ``None``: the rate the study trains at by default, which names its folder).

    Raises:
        FileNotFoundError: a run of the study has no final model yet (the message names the command that trains it).
    """
    rate = learning_rate if learning_rate is not None else (
        lr_tuning.learning_rate_of(study)[0] if scale_name == "goal" else lr_tuning.DEFAULT_LEARNING_RATE)
    root = workdir / lr_tuning.workdir_name(study, scale_name, rate)
    models: list[Model] = []
    for method in cat.runs_of(study):
        for seed in range(seeds):
            run = root / method / f"seed{seed}"
            if not (run / "model" / "config.json").is_file() or not (run / "metrics.jsonl").is_file():
                again = f" --learning-rate {learning_rate:g}" if learning_rate is not None else ""
                raise FileNotFoundError(
                    f"{run}: no finished run; train the study first: agentgym study {study.name} --scale {scale_name} "
                    f"--seeds {seeds} --workdir {workdir}{again}")
            config = json.loads((run / "config.json").read_text(encoding="utf-8"))
            curve = credit.read_metrics(run / "metrics.jsonl", config)["curve"]
            if not models:
                start = Path(config["model"])
                start = start if start.is_absolute() else cat.BENCHMARKS.parent / start
                models.append(Model("start", 0, start, config, curve[0][1]))
            models.append(Model(method, seed, run / "model", config, curve[-1][1]))
    return models


def comparisons(study: Study) -> list[Comparison]:
    """What the study's goals compare: its lead method against the control, and against the warm start (the
    10-point gain) or its baseline (by the study's margin); every other method against the warm start."""
    lead = study.methods[0]
    rows = [Comparison(lead, study.control, 0.0, f"{lead} beats the shuffled-advantage control")]
    if study.baseline == "grpo_start":
        rows.append(Comparison(lead, "start", 0.10, f"{lead} improves held-out success by >= 10 points"))
    else:
        rows.append(Comparison(lead, study.baseline, study.margin,
                               f"{lead} beats {study.baseline}" + (f" by >= {study.margin * 100:.0f} points"
                                                                   if study.margin else "")))
    rows += [Comparison(m, "start", 0.0, f"{m} against the warm start", is_goal=False) for m in cat.runs_of(study)
             if m != lead or study.baseline != "grpo_start"]
    return rows


EVALUATION_FIELDS = ("suite", "eval_suite", "env_kwargs", "max_tokens_per_turn", "max_context_tokens", "context",
                     "max_turn_tokens", "max_episode_tokens", "system_prompt", "constrain_actions", "eval_temperature",
                     "seed", "dtype")
"""The run config's fields that decide how a model plays the held-out tasks (the seed only matters to sampling
above temperature 0): two runs that agree on them and hold the same weights score the same outcomes."""


def cache_key(model: Model, split: str, tasks: int) -> str:
    """The weights' hash, the evaluation's settings and the suite files that define the tasks: the same model
    copied into another study's folder (a shared or extended run) is scored once. The env's code is not in the key:
    after changing an env, delete ``WORKDIR/held_out_cache``."""
    weights = hashlib.sha256()
    for path in sorted(model.directory.glob("*.safetensors")):
        weights.update(path.read_bytes())
    suites = [cat.BENCHMARKS.parent / "tasks" / "suites" / f"{model.config.get(k)}.yaml"
              for k in ("suite", "eval_suite")]
    tasks_defined = [hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None for p in suites]
    settings = json.dumps([{k: model.config.get(k) for k in EVALUATION_FIELDS}, tasks_defined, split, tasks],
                          sort_keys=True)
    return f"{weights.hexdigest()[:16]}-{hashlib.sha256(settings.encode()).hexdigest()[:16]}"


def outcomes(model: Model, split: str, tasks: int, threads: int, cache: Path) -> dict[str, Any]:
    """``{task_ids, success}`` of ``model`` playing the first ``tasks`` tasks of ``split`` as its run's
    evaluations play them (the trainer's own :meth:`evaluation_episodes`), cached in ``cache``."""
    path = cache / f"{cache_key(model, split, tasks)}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    import torch

    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict

    torch.set_num_threads(threads)
    trainer = make_trainer(config_from_dict({**model.config, "model": str(model.directory), "eval_split": split,
                                             "eval_tasks": tasks}))
    trainer.model, trainer.tokenizer = trainer._load(model.directory)
    trainer.policy = trainer._generation_policy(model.directory)
    try:
        played = {t.task_id: t for t in trainer.evaluation_episodes()}
    finally:
        trainer.policy.close()
    ids = [t.id for t in trainer.eval_tasks]
    result = {"split": split, "model": str(model.directory), "task_ids": ids,
              "success": "".join("1" if played[i].success else "0" for i in ids)}
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result), encoding="utf-8")
    return result


def paired(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """Mean success of ``a`` minus ``b`` (each: one list of 0/1 outcomes per seed, the same tasks in the same
    order), with its standard error between seeds, over tasks, and both together."""
    def seeds_se(side: list[list[int]]) -> float:
        rates = [statistics.mean(s) for s in side]
        return statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else 0.0

    per_task = [statistics.mean(col_a) - statistics.mean(col_b) for col_a, col_b in zip(zip(*a), zip(*b))]
    se_seeds = math.hypot(seeds_se(a), seeds_se(b))
    se_tasks = statistics.stdev(per_task) / math.sqrt(len(per_task)) if len(per_task) > 1 else float("nan")
    return {"a_mean": statistics.mean(statistics.mean(s) for s in a),
            "b_mean": statistics.mean(statistics.mean(s) for s in b),
            "a_per_seed": [statistics.mean(s) for s in a], "b_per_seed": [statistics.mean(s) for s in b],
            "difference": statistics.mean(per_task), "se_seeds": se_seeds, "se_tasks": se_tasks,
            "se": math.hypot(se_seeds, se_tasks), "tasks": len(per_task)}


def judge(comparison: Comparison, numbers: dict[str, Any]) -> bool:
    """The study's rule with the error of new tasks included: at least the bar, and more than 2 se."""
    return numbers["difference"] >= comparison.bar - 1e-9 and numbers["difference"] > 2 * numbers["se"]


def table(study: Study, splits: list[str], played: dict[tuple[str, int, str], list[int]],
          seeds: int) -> list[dict[str, Any]]:
    """Every comparison on each split and on all of them pooled."""
    def side(method: str, chosen: list[str]) -> list[list[int]]:
        runs = [0] if method == "start" else list(range(seeds))
        return [[o for split in chosen for o in played[(method, seed, split)]] for seed in runs]

    rows = []
    for comparison in comparisons(study):
        for label, chosen in [*((s, [s]) for s in splits), *([("pooled", splits)] if len(splits) > 1 else [])]:
            numbers = paired(side(comparison.a, chosen), side(comparison.b, chosen))
            rows.append({"comparison": comparison.goal, "a": comparison.a, "b": comparison.b, "bar": comparison.bar,
                         "is_goal": comparison.is_goal, "split": label, **numbers, "met": judge(comparison, numbers)})
    return rows


def format_row(row: dict[str, Any]) -> str:
    """One comparison on one split, as printed."""
    return (f"{row['split']:>12}  {row['a']} - {row['b']}: {row['difference']:+.3f} "
            f"(se seeds {row['se_seeds']:.3f}, tasks {row['se_tasks']:.3f}, both {row['se']:.3f}; "
            f"{row['tasks']} tasks) -> {'MET' if row['met'] else 'not met'} (bar {row['bar']:.2f}, > 2 se)")


def note_of(row: dict[str, Any]) -> str:
    """A comparison's sides per seed and its three errors, for the result file."""
    per_seed = ", ".join(f"{v:.3f}" for v in row["a_per_seed"])
    return (f"{row['a']} {row['a_mean']:.3f} (per seed {per_seed}) vs {row['b']} {row['b_mean']:.3f}; se seeds "
            f"{row['se_seeds']:.3f}, tasks {row['se_tasks']:.3f}, both {row['se']:.3f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a study of benchmarks/studies/catalogue.py whose runs have finished")
    p.add_argument("--scale", default="goal", choices=["smoke", "goal"], help="the scale the study ran at (default goal)")
    p.add_argument("--seeds", type=int, default=3, help="seeds the study ran (default 3)")
    p.add_argument("--split", action="append", default=None,
                   help="held-out split to score (repeatable; default: the study's own, then its task's further "
                        "held-out splits at the goal scale)")
    p.add_argument("--tasks", type=int, default=None, help="tasks per split (default: the study's evaluation size)")
    p.add_argument("--jobs", type=int, default=2, help="models scored at once (default 2)")
    p.add_argument("--workdir", default="runs/studies", help="where the study's runs are (default runs/studies)")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="the rate the study was trained at when it was not its default (--learning-rate of the study)")
    p.add_argument("--out", default=None, help="result folder (default benchmarks/results at the goal scale, "
                   "else WORKDIR/results)")
    args = p.parse_args(argv)
    if args.name not in cat.STUDIES:
        p.error(f"unknown study {args.name!r}; the studies: python benchmarks/studies/run.py --list")
    for field in ("seeds", "jobs", "tasks"):
        if getattr(args, field) is not None and getattr(args, field) < 1:
            p.error(f"--{field} must be at least 1")
    if args.learning_rate is not None and not args.learning_rate > 0:
        p.error(f"--learning-rate must be > 0, got {args.learning_rate:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    study = cat.STUDIES[args.name]
    own = cat.eval_split_of(study, args.scale)
    splits = args.split or [own, *(cat.FURTHER_HELD_OUT_SPLITS.get(study.task, ()) if args.scale == "goal" else ())]
    suite = cat.suite_of(study, args.scale)
    for split in splits:
        if cat.split_size(suite, split) is None:
            print(f"--split {split}: suite {suite} has no such split; see tasks/suites/{suite}.yaml", file=sys.stderr)
            return 2
    try:
        models = study_models(study, args.scale, Path(args.workdir), args.seeds, args.learning_rate)
    except FileNotFoundError as missing:
        print(missing, file=sys.stderr)
        return 2
    tasks = args.tasks or int(models[0].config["eval_tasks"])
    jobs = [(m, s) for s in splits for m in models]
    print(f"{study.name}: scoring {len(models)} models (the warm start and {len(models) - 1} runs) on "
          f"{', '.join(splits)}, {tasks} tasks each, {args.jobs} at a time", flush=True)
    started = time.perf_counter()
    played: dict[tuple[str, int, str], list[int]] = {}
    mismatches: list[str] = []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {pool.submit(outcomes, m, s, tasks, credit._threads_per_run(args.jobs),
                               Path(args.workdir) / "held_out_cache"): (m, s) for m, s in jobs}
        for future in concurrent.futures.as_completed(futures):
            model, split = futures[future]
            result = future.result()
            success = [int(c) for c in result["success"]]
            played[(model.method, model.seed, split)] = success
            rate = statistics.mean(success)
            check = ""
            if split == own and tasks == int(model.config["eval_tasks"]):
                same = abs(rate - model.logged) < 1e-9
                check = f" (its run logged {model.logged:.4f}{'' if same else ': DIFFERENT'})"
                if not same:
                    mismatches.append(f"{model.method} seed {model.seed}: {rate:.4f} replayed, "
                                      f"{model.logged:.4f} logged")
            print(f"  {model.method} seed {model.seed} on {split}: {rate:.4f}{check}", flush=True)
    rows = table(study, splits, played, args.seeds)
    for row in rows:
        print(format_row(row))
    if mismatches:
        print(f"{len(mismatches)} model(s) replayed the study's split differently from their runs: "
              + "; ".join(mismatches), file=sys.stderr)
    from studies.run import _results_into, results_folder

    forced = args.learning_rate is not None and args.learning_rate != (
        lr_tuning.learning_rate_of(study)[0] if args.scale == "goal" else lr_tuning.DEFAULT_LEARNING_RATE)
    out = results_folder(args.out, args.scale, Path(args.workdir), forced_rate=forced)
    out.mkdir(parents=True, exist_ok=True)
    with _results_into(out) as results:
        figures = [results.figure(f"{study.name}: {r['comparison']}, {r['split']} ({r['tasks']} tasks, "
                                  f"{args.seeds} seeds, paired)", r["difference"], None, unit="difference",
                                  goal=f"difference >= {r['bar']:.2f} and > 2 se (seeds and tasks)", met=r["met"],
                                  note=note_of(r))
                   for r in rows if r["is_goal"]]  # every method against the warm start: in details only
        details = {"study": study.name, "scale": args.scale, "suite": suite, "splits": splits, "tasks": tasks,
                   "seeds": args.seeds, "own_split": own, "replayed_equal_logged": not mismatches,
                   "mismatches": mismatches, "comparisons": rows,
                   "models": [{"method": m.method, "seed": m.seed, "directory": str(m.directory),
                               "logged": m.logged,
                               "success": {s: statistics.mean(played[(m.method, m.seed, s)]) for s in splits}}
                              for m in models],
                   "outcomes": {f"{m}/seed{seed}/{split}": "".join(map(str, o))
                                for (m, seed, split), o in sorted(played.items())},
                   "wall_s": time.perf_counter() - started}
        path = results.write_results(f"held_out_{study.name}", figures, details=details,
                                     note=None if args.scale == "goal" else f"{args.scale} scale: measures nothing")
    print(f"result: {path}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
