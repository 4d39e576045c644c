"""Tune a study's learning rate on tasks drawn like its training tasks, never on the held-out ones.

Why: one learning rate for every task is a hidden choice. On BabyAI at 1e-4, GRPO's training success fell
from 0.34 to 0.19 in five steps, exactly as fast as its shuffled-advantage control's: Adam moves every weight by
about the learning rate whatever the gradient says, so a rate too large for the task drifts the policy away from
its warm start faster than the signal can steer it. A study that picks its rate by looking at held-out success
would report a number chosen on its own test set, so the rate is chosen here on greedy success over a *tuning*
split drawn from the training distribution (:data:`TUNING_SPLITS`: rooms from the training half of the seed space,
none of them held out), the lead method only, seed 0, a few steps; the control then trains at the same rate, so
the comparison with it stays one of signal against none.

    python benchmarks/studies/run.py grpo_babyai --tune-learning-rate 1e-4,3e-5,1e-5 --jobs 3 --seeds 1

writes ``benchmarks/results/lr_tuning_NAME.json``; the study's goal scale then trains at the chosen rate
(:func:`studies.catalogue.learning_rate_of`) and its result file says where the rate came from.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from studies import catalogue as cat
from studies.catalogue import Scale, Study

TUNING_SPLITS = {"babyai": "tune", "maze": "tune"}
"""Each task's split for tuning: drawn like its training tasks, disjoint from every held-out split. A task not
listed cannot be tuned until its suite declares one (the trainer refuses to evaluate on the training split itself,
and the held-out split must not choose the rate); guess-the-number has none, as its held-out split already holds
every secret there is, and a Sokoban split from the training seeds would repeat training rooms (small rooms recur;
only the held-out half of the seeds is kept apart from them)."""


def tuning_split(study: Study) -> str:
    """The study's tuning split, or a ValueError that says how to add one."""
    split = TUNING_SPLITS.get(study.task)
    if split is None:
        suite = cat.task_of(study.task).suite
        raise ValueError(f"study {study.name!r}: task {study.task!r} has no tuning split; add a split drawn from the "
                         f"training distribution to tasks/suites/{suite}.yaml (as babyai-goto.yaml's 'tune') and "
                         f"name it in TUNING_SPLITS of benchmarks/studies/lr_tuning.py")
    return split


def parse_rates(text: str) -> list[float]:
    """``"1e-4,3e-5"`` -> ``[1e-4, 3e-5]``; a clear error for anything that is not a list of positive numbers."""
    rates: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"--tune-learning-rate takes comma-separated positive numbers such as 1e-4,3e-5,1e-5; "
                             f"{part!r} is not a number") from None
        if not rate > 0:
            raise ValueError(f"--tune-learning-rate: every rate must be > 0, got {rate:g}")
        rates.append(rate)
    if len(set(rates)) < 2:
        raise ValueError("--tune-learning-rate needs at least two different rates to choose between, "
                         f"got {text!r}")
    return sorted(set(rates), reverse=True)


def tuning_settings(settings: argparse.Namespace, rate: float, steps: int, eval_tasks: int,
                    split: str) -> argparse.Namespace:
    """The study's run settings for one tuning run: ``rate``, ``steps`` steps, greedy evaluations of ``eval_tasks``
    tasks of the tuning ``split`` before and after."""
    return argparse.Namespace(**{**vars(settings), "learning_rate": rate, "steps": steps, "eval_every": steps,
                                 "eval_tasks": eval_tasks, "eval_split": split})


def choose(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rate whose final tuning-split success is highest; on a tie, the smaller rate (the gentler step).
    Each result holds ``learning_rate`` and ``curve`` (``[(episodes, success)]``, start and end)."""
    if not results:
        raise ValueError("no tuning run finished; nothing to choose from")
    return max(results, key=lambda r: (r["curve"][-1][1], -r["learning_rate"]))


def tune(study: Study, scale: Scale, rates: Sequence[float], steps: int, settings: argparse.Namespace,
         workdir: Path, run_all: Callable[[list[tuple[str, int, argparse.Namespace, str]]], list[dict[str, Any]]],
         ) -> dict[str, Any]:
    """Train the lead method (seed 0) at each rate for ``steps`` steps and pick one (:func:`choose`).

    ``run_all`` trains a list of ``(method, seed, settings, workdir)`` jobs (the study's own pool) and returns
    their results; each rate gets its own folder ``WORKDIR/lr-tuning/lrRATE`` so runs resume and never clobber
    one another."""
    eval_tasks, split = scale.eval_tasks, tuning_split(study)
    jobs = [(study.methods[0], 0, tuning_settings(settings, rate, steps, eval_tasks, split),
             str(workdir / "lr-tuning" / f"lr{rate:g}")) for rate in rates]
    runs = run_all(jobs)
    results = [{"learning_rate": job[2].learning_rate, "curve": run["curve"],
                "gain": run["curve"][-1][1] - run["curve"][0][1], "train_success": run.get("train_success"),
                "seconds": run.get("seconds")} for job, run in zip(jobs, runs) if run is not None]
    best = choose(results)
    return {"study": study.name, "method": study.methods[0], "seed": 0, "steps": steps,
            "rollouts_per_step": scale.rollouts_per_step, "split": split, "eval_tasks": eval_tasks,
            "candidates": results, "chosen": best["learning_rate"]}


def write(study: Study, report: dict[str, Any], out: Path, results_into: Callable[[Path], Any]) -> Path:
    """``OUT/lr_tuning_NAME.json``: one figure per rate (final tuning-split success) and the choice."""
    with results_into(out) as results:
        figures = [results.figure(f"{study.name}: {report['method']} at learning rate {r['learning_rate']:g}, greedy "
                                  f"success on {report['eval_tasks']} {report['split']}-split tasks after "
                                  f"{report['steps']} steps", r["curve"][-1][1], None,
                                  note=f"start {r['curve'][0][1]:.3f}; gain {r['gain']:+.3f}"
                                  + ("; chosen" if r["learning_rate"] == report["chosen"] else ""))
                   for r in report["candidates"]]
        return results.write_results(f"lr_tuning_{study.name}", figures, details=report)


def format_report(report: dict[str, Any]) -> str:
    """The tuning's table, one line per rate, as the command prints it."""
    lines = [f"{report['study']}: {report['method']} seed 0, {report['steps']} steps of "
             f"{report['rollouts_per_step']} rollouts, greedy success on {report['eval_tasks']} "
             f"{report['split']}-split tasks (the held-out split is not looked at)"]
    for r in report["candidates"]:
        mark = "  <- chosen" if r["learning_rate"] == report["chosen"] else ""
        lines.append(f"  lr {r['learning_rate']:<8g} start {r['curve'][0][1]:.3f} -> {r['curve'][-1][1]:.3f} "
                     f"({r['gain']:+.3f}){mark}")
    return "\n".join(lines)


def learning_rate_of(study: Study, results_dir: Path | None = None) -> tuple[float, str]:
    """``(learning rate, where it comes from)``: the committed tuning's choice (of the study it borrows its rate
    from, if any), else the benchmark's default."""
    path = (results_dir or cat.BENCHMARKS / "results") / f"lr_tuning_{cat.rate_source(study)}.json"
    if path.is_file():
        details = json.loads(path.read_text(encoding="utf-8")).get("details") or {}
        if details.get("chosen"):
            rates = len(details.get("candidates") or [])
            return float(details["chosen"]), (f"tuned on the {details.get('split')} split over {rates} rates: "
                                              f"benchmarks/results/{path.name}")
    return DEFAULT_LEARNING_RATE, "the benchmark's default, not tuned for this study"


DEFAULT_LEARNING_RATE = 1e-4
"""benchmarks/credit_assignment.py's rate for every method and task."""


def workdir_name(study: Study, scale_name: str, rate: float) -> str:
    """A study's run folder: ``NAME-SCALE``, with ``-lrRATE`` when the rate is not the default, so runs at two
    rates never share (and so never wipe) each other's directories."""
    base = f"{study.name}-{scale_name}"
    return base if rate == DEFAULT_LEARNING_RATE else f"{base}-lr{rate:g}"


__all__ = ["DEFAULT_LEARNING_RATE", "TUNING_SPLITS", "choose", "format_report", "learning_rate_of", "parse_rates",
           "tune", "tuning_settings", "tuning_split", "workdir_name", "write"]
