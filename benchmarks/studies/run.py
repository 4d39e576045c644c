"""Run one learning study: a shared warm start, every method and the control for each seed, held-out curves with
standard errors, the goal stated as met or not, a result file and a plot.

    python benchmarks/studies/run.py --list                       # the studies, their goal scale and hours
    python benchmarks/studies/run.py grpo_sokoban --scale smoke   # the whole code path in seconds
    python benchmarks/studies/run.py gigpo_vs_grpo --agreement    # GRPO vs GiGPO advantages on its rollouts
    python benchmarks/studies/run.py gigpo_vs_grpo --seeds 3 --device cuda

(``agentgym study ...`` runs this script with the same arguments.) Before training, every study measures on its
task's rollouts how far GRPO's and GiGPO's advantages disagree (:func:`agentgym.trainers.gigpo.compare_with_grpo`):
credit that two methods share cannot separate them. Training is the trainers' own loop; the task definitions,
warm start and run config are ``benchmarks/credit_assignment.py``'s; the shuffled-advantage control is the
trainers' own ``advantage_control: shuffle``. Runs live in
``WORKDIR/NAME-SCALE/METHOD/seedN`` and are reused when finished with the same settings (an interrupted study
resumes). Writes ``OUT/study_NAME.json`` (config, git commit, machine with load average, per-seed curves, the
control, the goal) and ``OUT/study_NAME.png``; OUT is benchmarks/results for a full goal-scale run and
``WORKDIR/results`` for any other, unless ``--out`` names it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from studies import catalogue as cat  # noqa: E402
from studies import lr_tuning  # noqa: E402
from studies.catalogue import Scale, Study, credit  # noqa: E402

SMOKE_MODEL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)
"""The smoke scale's model: the smallest tiny model that runs every code path."""


# ---- setup -------------------------------------------------------------------------------------------------
def task_for(study: Study, scale_name: str) -> Any:
    """The study's task at a scale (its suite swapped for the smoke suite where there is one)."""
    task = cat.task_of(study.task)
    return dataclasses.replace(task, suite=cat.suite_of(study, scale_name))


eval_split = cat.eval_split_of


def run_args(study: Study, scale: Scale, scale_name: str, device: str, jobs: int,
             learning_rate: float = lr_tuning.DEFAULT_LEARNING_RATE) -> argparse.Namespace:
    """The credit-assignment benchmark's settings for this study (its checks apply), with packing on."""
    credit_task = study.task if study.task in credit.TASKS else "maze"  # parse_args knows only its own tasks
    args = credit.parse_args(["--tasks", credit_task, "--methods", "grpo", "--seeds", "1", "--steps", str(scale.steps),
                              "--tasks-per-step", str(scale.tasks_per_step), "--group-size", str(scale.group_size),
                              "--eval-every", str(scale.eval_every), "--eval-tasks", str(scale.eval_tasks),
                              "--device", device, "--jobs", str(jobs),
                              "--learning-rate", repr(learning_rate)])
    args.eval_split = eval_split(study, scale_name)
    args.packing = True  # the same loss, about 3x faster updates for the tiny model (benchmarks/train_step.py)
    return args


def start_model(study: Study, scale: Scale, scale_name: str, workdir: Path, device: str) -> tuple[Path, dict[str, Any]]:
    """Every method's and seed's shared starting checkpoint: the benchmark's BC warm start, or at the smoke scale
    a small tiny model cloned for a few steps (seconds; no success check)."""
    task = task_for(study, scale_name)
    if scale.warm_start == "bc":
        return credit.warm_start(task, workdir, target=scale.bc_target, max_bc_steps=scale.bc_steps, device=device)
    from agentgym.cli.quickstart import demonstration_texts
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model, load_tiny_model
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations

    out = workdir / f"smoke-start-{task.name}"
    info_path = out / "warm_start.json"
    if info_path.is_file():
        return out, json.loads(info_path.read_text())
    suite = load_suite(task.suite)
    demos = min(4, len(suite.split("train")))
    base = build_tiny_model(workdir / f"smoke-base-{task.name}", texts=demonstration_texts(task.suite, demos),
                            config=TinyModelConfig(**SMOKE_MODEL))
    model, tokenizer = load_tiny_model(base)
    demonstrations = collect_demonstrations(suite, "train", demos, tokenizer, system_prompt="")
    behaviour_clone(model, tokenizer, demonstrations, steps=scale.bc_steps, learning_rate=1e-3, batch_size=2, seed=0,
                    device="cpu", progress=False)
    info = {"bc_steps": scale.bc_steps, "demonstrations": len(demonstrations), "model": SMOKE_MODEL}
    credit._save_warm_start(model, tokenizer, out, info)
    return out, info


# ---- before training: do the methods' advantages disagree on this task? -------------------------------------
def agreement(study: Study, scale: Scale, scale_name: str, model: Path, args: argparse.Namespace,
              workdir: Path) -> dict[str, Any]:
    """GRPO vs GiGPO advantages on one batch of the task's rollouts at the starting policy (at most 32 tasks of
    the scale's group size): per-token correlation, sign disagreement, step-vs-episode correlation."""
    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict
    from agentgym.trainers.gigpo import compare_with_grpo

    task = task_for(study, scale_name)
    small = argparse.Namespace(**{**vars(args), "tasks_per_step": min(args.tasks_per_step, 32)})
    config = credit.run_config(task, "gigpo", 0, model, workdir / "agreement", small)
    trainer = make_trainer(config_from_dict(config))
    trainer.model, trainer.tokenizer = trainer._load(model)
    trainer.policy = trainer._generation_policy(trainer.model_dir)
    started = time.perf_counter()
    trajectories = trainer._sample(10_000)  # a step no run reaches: tasks and seeds no training step uses
    report = compare_with_grpo(trajectories, trainer.config)
    report.update(rollouts=len(trajectories), success=statistics.mean(float(t.success) for t in trajectories)
                  if trajectories else None, seconds=time.perf_counter() - started)
    return report


def cached_agreement(study: Study, scale: Scale, scale_name: str, model: Path, args: argparse.Namespace,
                     workdir: Path) -> dict[str, Any]:
    """:func:`agreement`, measured once per warm start and settings and kept in ``workdir/agreement.json``: a study
    resumed across sessions would otherwise sample its batch again at every start (minutes on a CPU) to print the
    same figures."""
    record = model / "warm_start.json"
    key = hashlib.sha256(json.dumps(
        [study.task, scale_name, dataclasses.asdict(scale), str(model.resolve()),
         record.read_text(encoding="utf-8") if record.is_file() else None,
         {k: v for k, v in vars(args).items() if k != "jobs"}], sort_keys=True, default=str).encode()).hexdigest()
    path = workdir / "agreement.json"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("key") == key and isinstance(stored.get("report"), dict):
            print(f"{study.name}: advantage agreement as measured before at this warm start and settings ({path})",
                  flush=True)
            return stored["report"]
    report = agreement(study, scale, scale_name, model, args, workdir)
    path.write_text(json.dumps({"key": key, "report": report}, default=str), encoding="utf-8")
    return report


def format_agreement(report: dict[str, Any]) -> str:
    """One line of :func:`agreement`'s numbers, as the study prints it before training."""
    def f(key: str, spec: str = ".3f") -> str:
        value = report.get(key)
        return "-" if value is None else format(value, spec)

    return (f"GRPO vs GiGPO on {report.get('rollouts')} rollouts (success {f('success', '.2f')}): per-token "
            f"correlation {f('token_correlation')}, opposite signs on {f('sign_disagreement', '.2%')} of tokens, "
            f"credit only one gives on {f('zero_disagreement', '.2%')}, step-vs-episode correlation "
            f"{f('step_episode_correlation')}, steps in a shared anchor {f('steps_in_shared_anchor', '.2f')}, "
            f"mean |A| GRPO {f('mean_abs_episode_level')} vs GiGPO {f('mean_abs_gigpo')}; GRPO's net advantage on "
            f"the batch's tokens {f('grpo_drift_token_mean')} under token-mean, "
            f"{f('grpo_drift_seq_mean_token_mean')} under seq-mean-token-mean (tokens a solved rollout "
            f"{f('tokens_solved_mean', '.1f')}, a failed one {f('tokens_failed_mean', '.1f')})")


# ---- one run -----------------------------------------------------------------------------------------------
def _run_identity(config: dict[str, Any], method: str) -> str:
    """What makes two runs the same run wherever they live: the config without its output folder, and the method."""
    same = {k: v for k, v in config.items() if k != "output_dir"}
    return hashlib.sha256(json.dumps([same, method], sort_keys=True).encode()).hexdigest()


def finished_twin(root: Path, method: str, seed: int, config: dict[str, Any], out: Path,
                  start_steps: int | None = None) -> Path | None:
    """A finished run of another study under ``root`` (``ROOT/STUDY-SCALE/METHOD/seedN``) with this run's exact
    settings and warm start (its BC steps, ``start_steps``), or ``None``. Studies share methods (GRPO and its control on BabyAI are in two studies), and a run
    at the same settings is the same run: its curve is reused instead of hours of training again."""
    identity = _run_identity(config, method)
    for marker in sorted(root.glob(f"*/{method}/seed{seed}/study.json")):
        folder = marker.parent
        if folder.resolve() == out.resolve() or not (folder / "summary.json").is_file():
            continue
        try:
            stored = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if "seconds" in stored and isinstance(stored.get("config"), dict) \
                and stored.get("warm_start_bc_steps", start_steps) == start_steps \
                and _run_identity(stored["config"], method) == identity:
            return folder
    return None


def shorter_twin(root: Path, method: str, seed: int, config: dict[str, Any], out: Path,
                 start_steps: int | None = None) -> Path | None:
    """The longest finished run under ``root`` (this run's own folder included) with this run's settings and warm
    start but fewer steps, or ``None``: the trainer extends a finished run to more steps exactly (its learning rate
    is constant after warm-up, so no step depends on the total), so a longer study trains only the steps it adds."""
    steps = config["steps"]
    identity = _run_identity({**config, "steps": None}, method)
    found: tuple[int, Path] | None = None
    for marker in sorted(root.glob(f"*/{method}/seed{seed}/study.json")):
        folder = marker.parent
        if not (folder / "summary.json").is_file() or not (folder / "checkpoints" / "latest").is_file():
            continue
        try:
            stored = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        config_then = stored.get("config")
        if "seconds" not in stored or not isinstance(config_then, dict) \
                or stored.get("warm_start_bc_steps", start_steps) != start_steps:
            continue
        then = config_then.get("steps")
        if isinstance(then, int) and then < steps and _run_identity({**config_then, "steps": None}, method) == identity \
                and (found is None or then > found[0]):
            found = (then, folder)
    return found[1] if found else None


TIMED = ("time/step_s", "eval/wall_s", "time/prior_s", "time/critic_prior_s")
"""The metrics that time a run's parts: its steps, its evaluations, and the episodes and critic fit before its first
step (ArCHer and filtered BC's ``prior_episodes``)."""


def logged_seconds(out: Path, after_step: int = 0) -> float:
    """Seconds a run's steps and evaluations took after ``after_step`` up to its latest checkpoint, summed from its
    ``metrics.jsonl`` (:data:`TIMED`; the records at step 0 count from 0). What a run resumed
    across processes already spent: its own clock only sees the last process. Steps after the checkpoint are
    trained again on resume, so they do not count twice."""
    from agentgym.trainers.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(out / "checkpoints")
    if checkpoint is None or not (out / "metrics.jsonl").is_file():
        return 0.0
    up_to = int(json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))["step"])
    total = 0.0
    for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and step <= up_to and (step > after_step or step == after_step == 0):
            total += sum(float(record.get(key) or 0.0) for key in TIMED)
    return total


def train_one(study_name: str, scale_name: str, method: str, seed: int, model: str, args: argparse.Namespace,
              workdir: str) -> dict[str, Any]:
    """Train one (method, seed) with the trainer's own loop, or reuse its finished directory."""
    import torch

    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict

    torch.set_num_threads(credit._threads_per_run(args.jobs))
    logging.basicConfig(level=logging.WARNING)
    study = cat.STUDIES[study_name]
    base, overrides = cat.METHODS[method]
    out = Path(workdir) / method / f"seed{seed}"
    config = {**credit.run_config(task_for(study, scale_name), base, seed, Path(model), out, args), **overrides}
    if base == "arpo":  # ARPO's own ratio (8 fresh rollouts of 16): half the group fresh, the rest branched
        config.setdefault("initial_rollouts", max(1, config["group_size"] // 2))
    if scale_name == "smoke":
        config.update({key: min(config[key], cap) for key, cap in cat.SMOKE_CAPS.items() if key in config})
    if config.get("actor_warmup_steps", 0) >= config["steps"]:  # a run shorter than the actor's warm-up (smoke)
        config["actor_warmup_steps"] = config["steps"] - 1  # still updates its actor once
    fingerprint = hashlib.sha256(json.dumps([config, method], sort_keys=True).encode()).hexdigest()[:16]
    marker = out / "study.json"
    previous = json.loads(marker.read_text()) if marker.is_file() else {}
    # a warm start cloned further in place keeps its path: a run begun from its earlier weights is not this run
    record = Path(model) / "warm_start.json"
    start_steps = json.loads(record.read_text()).get("bc_steps") if record.is_file() else None
    if previous.get("warm_start_bc_steps", start_steps) != start_steps:
        previous = {}
    finished = previous.get("fingerprint") == fingerprint and "seconds" in previous and (out / "summary.json").is_file()
    twin = None if finished else finished_twin(Path(workdir).parent, method, seed, config, out, start_steps)
    if twin is not None:  # the same run, finished for another study: copied, not trained again
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(twin, out)
        previous = {**json.loads((twin / "study.json").read_text()), "fingerprint": fingerprint, "config": config,
                    "shared_from": json.loads((twin / "study.json").read_text()).get("shared_from") or str(twin)}
        marker.write_text(json.dumps(previous))
        finished = True
    shorter = None if finished or previous.get("fingerprint") == fingerprint \
        else shorter_twin(Path(workdir).parent, method, seed, config, out, start_steps)
    if shorter is not None:  # the same run with fewer steps: copied and trained on, its time counted in this one's
        stored = json.loads((shorter / "study.json").read_text())
        if shorter.resolve() != out.resolve():
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(shorter, out)
        previous = {"fingerprint": fingerprint, "config": config, "warm_start_bc_steps": start_steps,
                    "extended_from": f"{shorter} ({stored['config']['steps']} steps)",
                    "extended_steps": int(stored["config"]["steps"]), "seconds_before": float(stored["seconds"])}
        marker.write_text(json.dumps(previous))
    extension = {k: previous[k] for k in ("extended_from", "extended_steps", "seconds_before") if k in previous}
    if finished:
        seconds, reused = float(previous["seconds"]), True
    else:
        if previous.get("fingerprint") != fingerprint:
            shutil.rmtree(out, ignore_errors=True)  # other settings: start over (same settings resume)
        # a resumed run: the time its earlier processes spent up to the checkpoint it resumes from
        spent = logged_seconds(out, after_step=extension.get("extended_steps", 0)) if out.is_dir() else 0.0
        out.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"fingerprint": fingerprint, "config": config,
                                      "warm_start_bc_steps": start_steps, **extension}))
        started = time.perf_counter()
        make_trainer(config_from_dict(config)).train()
        seconds, reused = time.perf_counter() - started + extension.get("seconds_before", 0.0) + spent, False
        previous = {"fingerprint": fingerprint, "config": config, "seconds": seconds,
                    "warm_start_bc_steps": start_steps, **extension}
        marker.write_text(json.dumps(previous))
    held_out_fit = previous.get("critic_held_out")
    # the goal's critic figure: held-out episodes, not its own batches (a stored one without its distance reference
    # or its move ranking is measured again)
    measured = {"distance_explained_variance", "move_explained_variance", "move_ranking"}
    if base == "archer" and (held_out_fit is None or not measured <= set(held_out_fit)):
        from studies.critic_fit import held_out_explained_variance

        held_out_fit = held_out_explained_variance(out, config, episodes=args.eval_tasks)
        marker.write_text(json.dumps({**previous, "critic_held_out": held_out_fit}))
    by_outcome = previous.get("tool_calls_by_outcome")
    if cat.counts_tool_calls(study) and by_outcome is None:  # the goal counts calls: where do they go?
        from studies.tool_calls import tool_calls_by_outcome

        by_outcome = tool_calls_by_outcome(out, config)
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "tool_calls_by_outcome": by_outcome}))
    return {"method": method, "seed": seed, "seconds": seconds, "reused": reused, "tool_calls_by_outcome": by_outcome,
            "shared_from": previous.get("shared_from"), "extended_from": previous.get("extended_from"),
            **credit.read_metrics(out / "metrics.jsonl", config),
            "critic_explained_variance_held_out": (held_out_fit or {}).get("explained_variance"),
            "critic_held_out": held_out_fit}


# ---- summary and goals -------------------------------------------------------------------------------------
def mean_se(values: list[float], eval_tasks: int) -> tuple[float, float]:
    """Mean over seeds and its standard error: between seeds when there are several (it holds the evaluation's
    own noise too), else one evaluation's binomial error."""
    mean = statistics.mean(values)
    if len(values) > 1:
        return mean, statistics.stdev(values) / len(values) ** 0.5
    return mean, cat.binomial_se(mean, eval_tasks)


def summarize(runs: list[dict[str, Any]], eval_tasks: int) -> dict[str, dict[str, Any]]:
    """Per method: start and final held-out success per seed, mean ± se, and the diagnostics the goals read."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        own = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        finals = [r["curve"][-1][1] for r in own]
        starts = [r["curve"][0][1] for r in own]
        mean, se = mean_se(finals, eval_tasks)
        start, start_se = mean_se(starts, eval_tasks)
        ev = [r["critic_explained_variance"] for r in own if r.get("critic_explained_variance") is not None]
        # per seed, None where the seed's held-out episodes gave nothing to explain (every return equal)
        held_per_seed = [r.get("critic_explained_variance_held_out") for r in own]
        held = [v for v in held_per_seed if v is not None]
        move_oracle = [r["critic_held_out"]["move_explained_variance"] for r in own
                       if (r.get("critic_held_out") or {}).get("move_explained_variance") is not None]
        ranking_per_seed = [(r.get("critic_held_out") or {}).get("move_ranking") for r in own]
        ranking = [v for v in ranking_per_seed if v is not None]
        distance = [r["critic_held_out"]["distance_explained_variance"] for r in own
                    if (r.get("critic_held_out") or {}).get("distance_explained_variance") is not None]
        calls = [r["eval_mean_tool_calls"] for r in own if r.get("eval_mean_tool_calls") is not None]
        calls_run = [r["train_tool_calls_run_mean"] for r in own if r.get("train_tool_calls_run_mean") is not None]
        offsets = [r["actor_advantage_offset"] for r in own if r.get("actor_advantage_offset") is not None]
        solved = [r["tool_calls_by_outcome"]["calls_solved"] for r in own
                  if (r.get("tool_calls_by_outcome") or {}).get("calls_solved") is not None]
        failed = [r["tool_calls_by_outcome"]["calls_failed"] for r in own
                  if (r.get("tool_calls_by_outcome") or {}).get("calls_failed") is not None]
        out[method] = {"seeds": [r["seed"] for r in own], "final": finals, "start": starts, "final_mean": mean,
                       "final_se": se, "start_mean": start, "start_se": start_se,
                       "critic_explained_variance": statistics.mean(ev) if ev else None,
                       "critic_explained_variance_held_out": statistics.mean(held) if held else None,
                       "critic_explained_variance_held_out_per_seed": held_per_seed if held else [],
                       "move_ranking_held_out": statistics.mean(ranking) if ranking else None,
                       "move_ranking_held_out_per_seed": ranking_per_seed if ranking else [],
                       "distance_explained_variance_held_out": statistics.mean(distance) if distance else None,
                       "move_explained_variance_held_out": statistics.mean(move_oracle) if move_oracle else None,
                       "actor_advantage_offset": statistics.mean(offsets) if offsets else None,
                       "eval_tool_calls": statistics.mean(calls) if calls else None,
                       "eval_tool_calls_per_seed": calls,
                       "eval_tool_calls_solved": statistics.mean(solved) if solved else None,
                       "eval_tool_calls_solved_per_seed": solved,
                       "eval_tool_calls_failed": statistics.mean(failed) if failed else None,
                       # None unless every seed logged it (a mean over some seeds would not compare)
                       "train_tool_calls_run": statistics.mean(calls_run) if len(calls_run) == len(own) else None,
                       "train_tool_calls_run_per_seed": calls_run}
    return out


def _gap(summary: dict[str, dict[str, Any]], a: str, b: str) -> tuple[float, float]:
    """Difference of two methods' final means and its standard error."""
    return (summary[a]["final_mean"] - summary[b]["final_mean"],
            (summary[a]["final_se"] ** 2 + summary[b]["final_se"] ** 2) ** 0.5)


def _ratio_se(summary: dict[str, dict[str, Any]], a: str, b: str, key: str) -> float | None:
    """Standard error over seeds of method ``a``'s figure ``key`` over ``b``'s, seed by seed (both runs of a seed
    start from the one warm start); ``None`` with fewer than two seeds both methods ran."""
    per_a, per_b = summary[a].get(f"{key}_per_seed") or [], summary[b].get(f"{key}_per_seed") or []
    if summary[a]["seeds"] != summary[b]["seeds"] or len(per_a) != len(summary[a]["seeds"]) \
            or len(per_b) != len(per_a) or len(per_a) < 2 or not all(per_b):
        return None
    ratios = [x / y for x, y in zip(per_a, per_b)]
    return statistics.stdev(ratios) / len(ratios) ** 0.5


def _below(ratio: float | None, se: float | None, bar: float = 0.8) -> bool:
    """``ratio`` at most ``bar`` and, where seeds give a standard error, below it by more than 2 se."""
    return ratio is not None and ratio <= bar and (se is None or bar - ratio > 2 * se)


def _budget_note(run_a: float | None, run_g: float | None) -> str:
    """What the training-budget row compares, or why it has no ratio."""
    if run_a is None or run_g is None:
        return "not counted by these runs (ARPO logs arpo/tool_calls_run_per_episode since this row was added)"
    if not run_g:
        return f"no ratio: GRPO's training rollouts made no tool call (ARPO's ran {run_a:.2f} an episode)"
    return f"tool calls run per training episode: ARPO {run_a:.2f}, GRPO {run_g:.2f}"


def _calls_note(summary: dict[str, dict[str, Any]], arpo_method: str) -> str:
    """ARPO's (the method ``arpo_method``) and GRPO's held-out tool calls per episode, per solved episode and per
    failed one."""
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    parts = []
    for what, key in (("per episode", "eval_tool_calls"), ("per solved episode", "eval_tool_calls_solved"),
                      ("per failed episode", "eval_tool_calls_failed")):
        if summary[arpo_method].get(key) is not None or summary["grpo"].get(key) is not None:
            parts.append(f"{what}: ARPO {fmt(summary[arpo_method].get(key))}, GRPO {fmt(summary['grpo'].get(key))}")
    arpo, grpo = summary[arpo_method], summary["grpo"]
    success, failed = arpo["final_mean"], arpo.get("eval_tool_calls_failed")
    if failed is not None and grpo.get("eval_tool_calls") and success > 0:
        # failed episodes spend (1 - success) * failed calls of the mean: what is left for the solved ones
        need = (0.8 * grpo["eval_tool_calls"] - (1 - success) * failed) / success
        parts.append(f"0.8x at ARPO's success {success:.2f} needs solved episodes of <= {need:.2f} calls")
    return "tool calls " + "; ".join(parts)


def goals(study: Study, summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal of the study as ``{goal, value, se, met, note}``; ``met`` needs the difference to exceed 2 se
    where the goal says one method beats another. Never a lowered bar: a goal whose numbers are missing is
    not met."""
    lead = study.methods[0]
    rows: list[dict[str, Any]] = []

    def row(goal: str, value: float | None, se: float | None, met: bool, note: str) -> None:
        rows.append({"goal": goal, "value": value, "se": se, "met": bool(met), "note": note})

    if study.control in summary:
        gap, se = _gap(summary, lead, study.control)
        row(f"{lead} beats the shuffled-advantage control (difference > 2 se)", gap, se, gap > 2 * se,
            f"{lead} {summary[lead]['final_mean']:.3f} vs control {summary[study.control]['final_mean']:.3f}")
    if study.baseline == "grpo_start":
        s = summary[lead]
        gain = s["final_mean"] - s["start_mean"]
        se = (s["final_se"] ** 2 + s["start_se"] ** 2) ** 0.5
        row("held-out success improves by >= 10 points", gain, se, gain >= 0.10 - 1e-9 and gain > 2 * se,
            f"start {s['start_mean']:.3f} -> final {s['final_mean']:.3f}")
    elif cat.counts_tool_calls(study):
        gap, se = _gap(summary, lead, "grpo")
        calls_a, calls_g = summary[lead]["eval_tool_calls"], summary["grpo"]["eval_tool_calls"]
        ratio = calls_a / calls_g if calls_a is not None and calls_g else None
        row("ARPO's held-out success is not below GRPO's by more than 2 se", gap, se, gap >= -2 * se,
            f"ARPO {summary[lead]['final_mean']:.3f} vs GRPO {summary['grpo']['final_mean']:.3f}")
        ratio_se = _ratio_se(summary, lead, "grpo", "eval_tool_calls")
        row("ARPO's held-out tool calls <= 0.8x GRPO's (by more than 2 se)", ratio, ratio_se, _below(ratio, ratio_se),
            _calls_note(summary, lead))
        # ARPO's own claim is about the training budget: a branch copies its prefix, whose calls are not run again
        run_a, run_g = summary[lead]["train_tool_calls_run"], summary["grpo"]["train_tool_calls_run"]
        budget = run_a / run_g if run_a is not None and run_g else None
        budget_se = _ratio_se(summary, lead, "grpo", "train_tool_calls_run")
        row("ARPO's training rollouts run <= 0.8x the tool calls GRPO's run (by more than 2 se)", budget, budget_se,
            _below(budget, budget_se),
            _budget_note(run_a, run_g))
    else:
        gap, se = _gap(summary, lead, study.baseline)
        need = study.margin
        row(f"{lead} beats {study.baseline}" + (f" by >= {need * 100:.0f} points" if need else "")
            + " (difference > 2 se)",
            gap, se, gap >= need - 1e-9 and gap > 2 * se,
            f"{lead} {summary[lead]['final_mean']:.3f} vs {study.baseline} {summary[study.baseline]['final_mean']:.3f}")
    if cat.METHODS[lead][0] == "archer":
        ev, own = summary[lead]["critic_explained_variance_held_out"], summary[lead]["critic_explained_variance"]
        distance = summary[lead].get("distance_explained_variance_held_out")
        move = summary[lead].get("move_explained_variance_held_out")
        offset = summary[lead].get("actor_advantage_offset")
        per_seed = ", ".join("-" if v is None else f"{v:.3f}"
                             for v in summary[lead].get("critic_explained_variance_held_out_per_seed", []))
        ranking = summary[lead].get("move_ranking_held_out")
        ranking_per_seed = ", ".join("-" if v is None else f"{v:.3f}"
                                     for v in summary[lead].get("move_ranking_held_out_per_seed", []))
        row(f"{lead}'s critic explains >= 50% of the return variance on held-out trajectories", ev, None,
            ev is not None and ev >= 0.5,
            f"explained variance of Monte-Carlo returns by the final critic's min(Q1, Q2) on fresh episodes of the "
            f"held-out split (per seed: {per_seed or '-'}); on its own last replay batches: "
            + ("-" if own is None else f"{own:.3f}")
            + ("" if distance is None else f"; the mean return at each state's distance to the exit explains "
               f"{distance:.3f} of the same returns"
               + ("" if move is None else f", and at that distance and whether the move heads for the exit "
                  f"{move:.3f}: a critic that knew these two would reach that much (the rest is mostly sampling "
                  "at temperature 1, which no critic can predict)"))
            + ("" if ranking is None else f"; at one held-out maze state its Q puts a move towards the exit above "
               f"one that is not in {ranking:.3f} of pairs (per seed: {ranking_per_seed}; 0.5 is chance): the "
               "actor's advantage carries that much of the one thing it needs")
            + ("" if offset is None else f"; each actor batch's mean advantage was {offset:.1f}x the advantages' "
               "spread around it (an offset shared by the batch adds only noise to the gradient)"))
    return rows


# ---- output ------------------------------------------------------------------------------------------------
def plot(study: Study, runs: list[dict[str, Any]], path: Path, title: str) -> None:
    """Held-out success against training episodes: each seed faint, the mean bold, the control grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    palette = ["tab:red", "tab:green", "tab:blue", "tab:orange", "tab:purple"]
    for k, method in enumerate(cat.runs_of(study)):
        own = [r for r in runs if r["method"] == method]
        if not own:
            continue
        color = "tab:gray" if method == study.control else palette[k % len(palette)]
        for r in own:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, color=color, alpha=0.25, linewidth=1)
        # the mean only where every seed was evaluated: a point averaged over fewer seeds would bend the line
        xs = sorted(set.intersection(*({x for x, _ in r["curve"]} for r in own)))
        mean = [statistics.mean(dict(r["curve"])[x] for r in own) for x in xs]
        ax.plot(xs, mean, color=color, marker="o", linewidth=2, label=f"{method} ({len(own)} seeds)")
    ax.set_xlabel("training episodes")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=9)  # one line would run off the figure
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


@contextlib.contextmanager
def _results_into(directory: Path) -> Any:
    """Point ``_results.write_results`` at ``directory`` (``--out``) for one call: the same schema, git commit and
    machine record as every benchmark, in a folder the caller chose."""
    import _results

    saved = _results.RESULTS_DIR
    _results.RESULTS_DIR = directory
    try:
        yield _results
    finally:
        _results.RESULTS_DIR = saved


def write(study: Study, scale_name: str, scale: Scale, sizing: dict[str, Any], seeds: list[int], device: str,
          warm: dict[str, Any], agreed: dict[str, Any] | None, runs: list[dict[str, Any]], failed: list[str],
          out: Path, wall: float) -> Path:
    """``OUT/study_NAME.json`` and ``OUT/study_NAME.png``."""
    summary = summarize(runs, scale.eval_tasks)
    checked = goals(study, summary) if not failed else []
    title = (f"{study.name} ({scale_name}): {scale.rollouts_per_step} rollouts a step x {scale.steps} steps, "
             f"{len(seeds)} seed(s), {scale.eval_tasks} held-out tasks ({eval_split(study, scale_name)})")
    plot(study, runs, out / f"study_{study.name}.png", title)
    with _results_into(out) as results:
        figures = [results.figure(f"{study.name} ({scale_name} scale, {len(seeds)} seed(s)): {g['goal']}", g["value"],
                                  None, unit="difference" if g["se"] is not None else "", goal=g["goal"], met=g["met"],
                                  note=g["note"] + (f"; se {g['se']:.3f}" if g["se"] is not None else ""))
                   for g in checked]
        if not figures:
            figures = [results.figure(f"{study.name}: no goal checked ({len(failed)} run(s) failed)", None)]
        details = {
            "study": dataclasses.asdict(study), "scale_name": scale_name, "scale": dataclasses.asdict(scale),
            "rollouts_per_step": scale.rollouts_per_step, "sizing": sizing, "seeds": seeds, "device": device,
            "eval_split": eval_split(study, scale_name), "suite": cat.suite_of(study, scale_name),
            "expected_hours_2_cores": cat.expected_hours(study, scale, len(seeds)), "warm_start": warm,
            "agreement": agreed, "control": study.control, "summary": summary, "goals": checked, "runs": runs,
            "failed": failed, "wall_s": wall,
        }
        note = ("smoke scale: checks the code path, measures nothing" if scale_name.startswith("smoke")
                else f"{scale_name}: fewer steps than the goal scale's {cat.goal_scale(study)[0].steps}"
                if scale_name.startswith("goal,") else None)
        return results.write_results(f"study_{study.name}", figures, details=details, note=note)


def override(scale: Scale, scale_name: str, steps: int | None, bc_steps: int | None) -> tuple[Scale, str]:
    """The scale with ``--steps``/``--max-bc-steps`` applied, and its label: other steps make another scale, named
    ``"goal, N steps"`` so no result passes for the full goal scale (evaluations stay every ``eval_every`` steps
    where that divides the steps, else only before and after)."""
    if steps is not None and steps != scale.steps:
        scale = dataclasses.replace(scale, steps=steps,
                                    eval_every=scale.eval_every if steps % scale.eval_every == 0 else steps)
        scale_name = f"{scale_name}, {steps} steps"
    if bc_steps is not None:
        scale = dataclasses.replace(scale, bc_steps=bc_steps)
    return scale, scale_name


RESULTS = cat.BENCHMARKS / "results"
"""Where the committed result files live (benchmarks/results), which the research pages are built from."""


def results_folder(out: str | None, scale_name: str, workdir: Path, *, forced_rate: bool = False) -> Path:
    """Where a run writes its result files: ``--out`` when given; else :data:`RESULTS` for a run at the full goal
    scale and the study's own learning rate, and ``WORKDIR/results`` for any other. Why: a smoke run measures
    nothing, a shortened one less than the goal, and one at a forced rate (``--learning-rate``) answers another
    question; any of them written to benchmarks/results would replace the committed measurement its page shows."""
    if out is not None:
        return Path(out)
    return RESULTS if scale_name == "goal" and not forced_rate else workdir / "results"


# ---- command line ------------------------------------------------------------------------------------------
def list_text(workdir: str = "runs/studies") -> str:
    """One line per study: task, methods, control, goal scale (rollouts a step, held-out size and se), hours, and
    for a goal-scale run under way in ``workdir``, how far it is and the hours it still needs at its own pace."""
    width = max(len(name) for name in cat.STUDIES)
    methods_width = max(len(f"{','.join(s.methods)} ({s.control})") for s in cat.STUDIES.values())
    lines = [f"{'study':{width}s} {'task':10s} {'methods (control)':{methods_width}s} goal scale"]
    ours, reference = cat.sampler_rates_per_core()
    for study in cat.STUDIES.values():
        scale, sizing = cat.goal_scale(study)
        hours = cat.expected_hours(study, scale, cat.GOAL_SEEDS)
        se = sizing["held_out_se_at_p_0.5"]
        last = cat.measured_hours(study)
        took = (f"last run took {last['hours']:.1f} h ({last['date']}, --jobs {last['jobs']})" if last
                else "never run to the end")
        folder = lr_tuning.workdir_name(study, "goal", lr_tuning.learning_rate_of(study)[0])
        now = cat.progress_on_disk(study, scale, 3, Path(workdir) / folder)
        if now and now["steps_done"] < now["steps"]:  # the hours a run under way still needs, at its own pace
            left = (now["steps"] - now["steps_done"]) * now["step_s"] / 2 / 3600
            took += (f"; under way in {workdir}: {now['steps_done']}/{now['steps']} training steps, "
                     f"{now['step_s']:.0f} s a step (2 at once) -> ~{left:.1f} h more on 2 cores")
        flags = []
        if not sizing["noise_measured"]:
            flags.append("noise scale not measured on this task")
        if not sizing["se_bound_met"]:
            flags.append(f"held-out split has {sizing['held_out_available']} tasks: se {se:.3f} > {cat.SE_TARGET}")
        if cat.shared_runs(study):
            flags.append(f"{', '.join(cat.shared_runs(study))} runs copied from {study.learning_rate_from}'s, not "
                         "counted in the hours")
        if (shorter := cat.extended_study(study)) is not None:
            flags.append(f"runs extended from {shorter.name}'s {shorter.steps} steps where that study ran them (the "
                         "hours count each run whole)")
        methods = f"{','.join(study.methods)} ({study.control})"
        lines.append(f"{study.name:{width}s} {study.task:10s} {methods:{methods_width}s} "
                     f"{scale.rollouts_per_step} rollouts/step x {scale.steps} steps, {scale.eval_tasks} held-out (se {se:.3f}), {cat.GOAL_SEEDS} seeds: sampling ~"
                     f"{hours:.1f} h on 2 cores (~{hours * ours / (10 * reference):.1f} h at the 10x sampler goal); "
                     f"{took}"
                     + (f" [{'; '.join(flags)}]" if flags else ""))
    lines.append(f"sampling: rollouts sampled / ({ours:.2f} rollouts/s a core x 2 cores), today's default sampler on "
                 f"Sokoban (benchmarks/results/sampler.json; the sampler before continuous batching: {reference:.2f}; "
                 "the goal: 10x that): "
                 "updates and evaluations come on top, and a task's episodes run longer or shorter than Sokoban's. "
                 "last run: the warm start plus the study's own runs, as its committed result measured "
                 "them on 2 cores (what a rerun on a like machine takes)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="agentgym study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="the study (--list shows them)")
    p.add_argument("--list", action="store_true", help="list the studies with their goal scale and expected hours")
    p.add_argument("--scale", default="goal", choices=["smoke", "goal"],
                   help="smoke: the whole code path in seconds; goal: sized by gradient noise and held-out error")
    p.add_argument("--seeds", type=int, default=cat.GOAL_SEEDS, help="seeds per method (0..N-1)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N): where BC, rollouts and training run")
    p.add_argument("--out", default=None,
                   help="folder of study_NAME.json and study_NAME.png (default: benchmarks/results at the full goal "
                        "scale, WORKDIR/results at any other, so a smoke run never replaces a measured result)")
    p.add_argument("--workdir", default="runs/studies", help="models and runs (reused when the settings match)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel, the CPU cores shared evenly among them")
    p.add_argument("--agreement", action="store_true",
                   help="only measure GRPO vs GiGPO advantage agreement on the study's rollouts, then exit")
    p.add_argument("--steps", type=int, default=None,
                   help="train this many steps instead of the scale's (the result says so: 'goal, N steps')")
    p.add_argument("--max-bc-steps", type=int, default=None, help="most BC steps of the warm start (goal scale: 400)")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="train every method at this rate (default: the study's tuned rate from "
                        "benchmarks/results/lr_tuning_NAME.json at the goal scale, else 1e-4)")
    p.add_argument("--tune-learning-rate", default=None, metavar="LR,LR,...",
                   help="instead of the study: train its lead method (seed 0) at each rate for --tune-steps steps, "
                        "pick the best greedy success on a split drawn like the training tasks (never the held-out "
                        "one) and write lr_tuning_NAME.json, which the study then uses")
    p.add_argument("--tune-steps", type=int, default=5, help="steps of each --tune-learning-rate run (default 5)")
    p.add_argument("--held-out-again", action="store_true",
                   help="instead of training: score the finished study's models again task by task on its held-out "
                        "split and its task's further ones (benchmarks/studies/held_out_replica.py), writing "
                        "held_out_NAME.json")
    args = p.parse_args(argv)
    if args.list:
        return args
    if args.name is None:
        p.error("name a study (one of: " + ", ".join(cat.STUDIES) + "), or pass --list")
    if args.name not in cat.STUDIES:
        from difflib import get_close_matches

        close = get_close_matches(args.name, list(cat.STUDIES), n=1)
        p.error(f"unknown study {args.name!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                + " (studies: " + ", ".join(cat.STUDIES) + ")")
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.learning_rate is not None and not args.learning_rate > 0:
        p.error(f"--learning-rate must be > 0 (1e-4 is the benchmark's default), got {args.learning_rate:g}")
    if args.tune_learning_rate is not None:
        try:
            args.tune_learning_rate = lr_tuning.parse_rates(args.tune_learning_rate)
        except ValueError as exc:
            p.error(str(exc))
        try:
            lr_tuning.tuning_split(cat.STUDIES[args.name])
        except ValueError as exc:
            p.error(str(exc))
        source = cat.rate_source(cat.STUDIES[args.name])
        if source != args.name:
            p.error(f"{args.name} trains at {source}'s tuned rate (its methods share one advantage scale); tune that "
                    f"one: agentgym study {source} --tune-learning-rate ...")
        if args.learning_rate is not None:
            p.error("--learning-rate and --tune-learning-rate exclude each other: tune first, then the study uses the "
                    "chosen rate (or pass --learning-rate alone to force one)")
    if args.held_out_again:
        clash = [f"--{f.replace('_', '-')}" for f in ("agreement", "tune_learning_rate", "steps", "max_bc_steps")
                 if getattr(args, f) not in (None, False)]
        if clash:
            p.error(f"--held-out-again scores the study's finished runs as they are; drop {', '.join(clash)} (train "
                    "first with them, then score with --held-out-again alone)")
    for flag in ("steps", "max_bc_steps", "tune_steps"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        p.error(f"--device must be cpu or cuda (cuda:N for one GPU of several), got {args.device!r}")
    return args


def run_jobs(jobs: list[tuple[str, int, argparse.Namespace, str]], call: tuple[str, str], model: str, n_jobs: int,
             failed: list[str], train: Callable[..., dict[str, Any]] = train_one) -> list[dict[str, Any] | None]:
    """Train ``(method, seed, settings, workdir)`` jobs with ``train`` (:func:`train_one`), ``n_jobs`` at a time in
    fresh processes, printing each curve as it finishes. A run that fails is recorded in ``failed`` (its result
    ``None``) and does not lose the others'; it resumes next time. Runs are handed to the pool one free worker at a
    time: a process pool starts the runs queued in it even after a Ctrl-C, and a run started then would train on."""
    results: list[dict[str, Any] | None] = [None] * len(jobs)

    def keep(i: int, result: Any) -> None:
        method, seed = jobs[i][:2]
        try:
            run = result()
        except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others'
            failed.append(f"{method} seed {seed}: {type(exc).__name__}: {exc}")
            print(f"{method} seed {seed}: FAILED ({type(exc).__name__}: {exc})", flush=True)
            return
        results[i] = run
        print(f"{run['method']} seed {run['seed']} (lr {jobs[i][2].learning_rate:g}): {run['curve']} "
              f"({run['seconds']:.0f} s" + (f", copied from {run['shared_from']}" if run.get("shared_from") else
                                           ", reused" if run["reused"] else "")
              + (f", extending {run['extended_from']}" if run.get("extended_from") else "") + ")", flush=True)

    if n_jobs == 1:
        for i, (method, seed, settings, workdir) in enumerate(jobs):
            keep(i, lambda m=method, s=seed, a=settings, w=workdir: train(*call, m, s, model, a, w))
        return results
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    waiting = list(range(len(jobs)))
    running: dict[Any, int] = {}
    with ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1,
                             initializer=start_worker) as pool:
        try:
            while waiting or running:
                while waiting and len(running) < n_jobs:
                    i = waiting.pop(0)
                    method, seed, settings, workdir = jobs[i]
                    running[pool.submit(train, *call, method, seed, model, settings, workdir)] = i
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    keep(running.pop(future), future.result)
        except KeyboardInterrupt:
            stop_runs(pool, {future: jobs[i][:2] for future, i in running.items()})
            raise
    return results


def start_worker() -> None:
    """A pool worker's first act: a process group of its own, and Python's Ctrl-C handler.

    Why: the runner alone tells a run to stop, with exactly one SIGINT (:func:`stop_runs`). A terminal's Ctrl-C
    reaches every process of its foreground group, but ``kill PID``, a scheduler's SIGTERM, or a Ctrl-C aimed at a
    runner started in the background reach the runner only; out of the terminal's group, every worker hears the
    same one signal whichever way the runner was stopped (a second one would cut the update under way). A runner
    started from a shell's background job has SIGINT ignored, which its workers inherit, so the default handler is
    put back for the forwarded signal to be heard.
    """
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While inside: SIGTERM (``kill PID``, a job scheduler's time limit) stops the study as a Ctrl-C does, so the
    runs under way save a checkpoint and the runner says where each stopped, instead of the process vanishing with
    its workers left training. Off the main thread no handler can be set, and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: Any) -> None:
        ctrl_c = signal.getsignal(signal.SIGINT)
        if callable(ctrl_c):  # Python's or a trainer's own Ctrl-C handler
            ctrl_c(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_runs(pool: Any, runs: dict[Any, tuple[str, int]]) -> None:
    """After a Ctrl-C (or a SIGTERM, :func:`sigterm_as_ctrl_c`): drop the runs (``future: (method, seed)``) not
    started yet, send each worker one SIGINT (:func:`start_worker` keeps the terminal's from them), wait while the
    runs under way save a checkpoint (each finishes the update under way, saves and stops), and say where each
    stopped. A second Ctrl-C ends the workers at once, losing the steps under way; their last checkpoints stay."""
    from agentgym.trainers.interrupt import BCInterrupted, TrainingInterrupted

    running = {future: run for future, run in runs.items() if not future.cancel()}  # cancel: one not started yet
    for process in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGINT)
    print(f"interrupted: waiting for {len(running)} run(s) under way to finish their update and save a checkpoint "
          "(Ctrl-C again to stop them at once)", flush=True)
    try:
        for future, (method, seed) in running.items():
            try:
                future.result()
                print(f"{method} seed {seed}: finished before it stopped", flush=True)
            except (TrainingInterrupted, BCInterrupted) as stopped:
                print(f"{method} seed {seed}: {stopped}", flush=True)
            except BaseException as exc:  # noqa: BLE001 - one run's end must not hide the others'
                print(f"{method} seed {seed}: stopped ({type(exc).__name__}: {exc})", flush=True)
    except KeyboardInterrupt:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        print("stopped at once: each run resumes from its last checkpoint", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(list_text(args.workdir))
        return 0
    if args.held_out_again:
        from studies import held_out_replica

        return held_out_replica.main([args.name, "--scale", args.scale, "--seeds", str(args.seeds), "--jobs",
                                      str(args.jobs), "--workdir", args.workdir,
                                      *(["--out", args.out] if args.out else []),
                                      *(["--learning-rate", str(args.learning_rate)] if args.learning_rate else [])])
    with sigterm_as_ctrl_c():
        return run_study(args)


def run_study(args: argparse.Namespace) -> int:
    """The study (or its learning-rate tuning) of checked arguments: warm start, runs, result file and plot."""
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: torch sees no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    torch.set_num_threads(credit._threads_per_run(args.jobs))
    logging.basicConfig(level=logging.WARNING)
    study = cat.STUDIES[args.name]
    scale, sizing = cat.scale_of(study, args.scale)
    scale, scale_name = override(scale, args.scale, args.steps, args.max_bc_steps)
    own_rate = lr_tuning.learning_rate_of(study)[0] if args.scale == "goal" else lr_tuning.DEFAULT_LEARNING_RATE
    if args.learning_rate is not None:
        rate, rate_source = args.learning_rate, "--learning-rate"
    elif args.scale == "goal":
        rate, rate_source = lr_tuning.learning_rate_of(study)
    else:
        rate, rate_source = lr_tuning.DEFAULT_LEARNING_RATE, "the benchmark's default: the smoke scale is never tuned"
    workdir = Path(args.workdir) / lr_tuning.workdir_name(study, args.scale, rate)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    forced = rate != own_rate
    out = results_folder(args.out, scale_name, Path(args.workdir), forced_rate=forced).resolve()  # printed whole:
    # `agentgym study` runs this script in the checkout's root, which need not be the caller's directory
    out.mkdir(parents=True, exist_ok=True)
    if args.out is None and out != RESULTS:
        why = (f"learning rate {rate:g} forced, not the study's {own_rate:g}" if forced and scale_name == "goal"
               else f"{scale_name} scale")
        print(f"{study.name}: {why}: results go to {out} (only a full goal-scale run at the study's own rate writes "
              "benchmarks/results; --out chooses another folder)", flush=True)
    t0 = time.perf_counter()
    model, warm = start_model(study, scale, args.scale, Path(args.workdir), args.device)
    settings = run_args(study, scale, args.scale, args.device, args.jobs, learning_rate=rate)
    others = run_args(study, scale, args.scale, args.device, args.jobs) if study.lead_rate_only else settings
    call = (study.name, args.scale)
    failed: list[str] = []
    if args.tune_learning_rate:
        print(f"{study.name}: tuning the learning rate over {', '.join(f'{r:g}' for r in args.tune_learning_rate)} on "
              f"the {lr_tuning.tuning_split(study)} split ({args.tune_steps} steps each)", flush=True)
        report = lr_tuning.tune(study, scale, args.tune_learning_rate, args.tune_steps, settings,
                                Path(args.workdir) / f"{study.name}-{args.scale}",
                                lambda jobs: run_jobs(jobs, call, str(model), args.jobs, failed))
        path = lr_tuning.write(study, report, out, _results_into)
        print(lr_tuning.format_report(report))
        print(f"result: {path}" + (f"; {len(failed)} run(s) failed: {'; '.join(failed)}" if failed else ""))
        return 1 if failed else 0
    if study.lead_rate_only:
        rate_source += (f"; {study.methods[0]}'s alone: every other run trains at the benchmark's default, "
                        f"{others.learning_rate:g}")
    print(f"{study.name}: learning rate {rate:g} ({rate_source})", flush=True)
    workdir.mkdir(parents=True, exist_ok=True)
    agreed = cached_agreement(study, scale, args.scale, Path(model), settings, workdir)
    print(f"{study.name}: {format_agreement(agreed)}", flush=True)
    if args.agreement:
        return 0
    seeds = list(range(args.seeds))
    jobs = [(m, s) for s in seeds for m in cat.runs_of(study)]  # the order the result records them in
    # started with the runs copied from another study: they take a moment, where queued behind a training run they
    # would wait hours for a free worker
    shared = set(cat.shared_runs(study))
    started = sorted(range(len(jobs)), key=lambda i: jobs[i][0] not in shared)
    try:
        done = run_jobs([(*jobs[i], settings if jobs[i][0] == study.methods[0] else others, str(workdir))
                         for i in started], call, str(model), args.jobs, failed)
        results = [done[started.index(i)] for i in range(len(jobs))]
    except KeyboardInterrupt as stopped:
        print(f"{study.name}: interrupted{f' ({stopped})' if str(stopped) else ''}; run the same command again to "
              f"resume each run from its last checkpoint in {workdir}", file=sys.stderr, flush=True)
        return 130
    runs = [r for r in results if r is not None]
    if failed and out == RESULTS:  # a partial record must not replace the committed measurement its page shows
        out = (Path(args.workdir) / "results").resolve()
        out.mkdir(parents=True, exist_ok=True)
        print(f"{study.name}: {len(failed)} run(s) failed or were interrupted, so the result goes to {out}, not "
              "benchmarks/results; the same command again resumes them from their checkpoints", flush=True)
    path = write(study, scale_name, scale, {**sizing, "learning_rate": rate, "learning_rate_source": rate_source},
                 seeds, args.device, warm, agreed, runs, failed, out, time.perf_counter() - t0)
    for g in goals(study, summarize(runs, scale.eval_tasks)) if runs and not failed else []:
        print(f"goal: {g['goal']}: {'MET' if g['met'] else 'NOT met'} ({g['note']})")
    print(f"result: {path}; plot: {path.with_suffix('.png')}")
    further = cat.FURTHER_HELD_OUT_SPLITS.get(study.task, ())
    if further and scale_name == "goal" and not failed:
        again = f" --learning-rate {rate:g}" if forced else ""
        print(f"next: agentgym study {study.name} --held-out-again{again} scores these models on "
              f"{', '.join(further)} too, rooms none of the study's choices saw, with errors over seeds and tasks")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
