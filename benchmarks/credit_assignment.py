"""Turn-level credit assignment on a CPU: GRPO, GiGPO, ARPO, ArCHer and filtered BC at an equal episode budget.

Two tasks are built so that which action is taken at an intermediate turn decides the episode, and a tiny model
can learn it within minutes:

* ``maze`` (suite ``credit-maze``): 4x4 text mazes, exit 4-6 moves away, 8 turns in all. One move into a dead
  end (out and back: 2 turns) or two wall bumps doom the longer mazes. Every rollout of a task starts in the same
  cell and rollouts cross the same cells, so GiGPO's anchor groups (the cell) compare moves made from one cell.
* ``guess`` (suite ``credit-guess``): guess a secret in 1-100 in at most 8 guesses (binary search needs 7), so
  one guess that does not halve the interval usually dooms the episode; the number of tool calls is free (ARPO),
  and the interval the feedback leaves (the anchor) recurs across a group.
* ``sokoban`` (suite ``sokoban``, the learning smoke test; not in the default ``--tasks``): 6x6 rooms with 1-2
  boxes to train on, held out = the ``test`` split (7x7 rooms, 2 boxes, puzzle seeds from the other half of the
  seed space). A box pushed into a corner is stuck for good, and the (player, boxes) position is the anchor.
* ``babyai`` (suite ``babyai-goto``, the other learning smoke test; not in the default ``--tasks``): BabyAI
  GoToLocal seen as text, held out = the ``test`` split (the same level, rooms from held-out seeds). The
  (position, direction, carried object) is the anchor.

Per task a tiny model (BPE tokenizer trained on the suite's text) is built once and behaviour-cloned on
reference demonstrations until its greedy success on 64 *training* tasks first reaches ``--bc-target``
(checked every 25 BC steps), so RL starts with room to move; the held-out split is never used to pick it.
Every method and seed then starts from that same checkpoint (``warmstart: none``) and trains for the same
number of episodes: GRPO, GiGPO and ARPO take ``tasks_per_step x group_size`` (4 x 8) episodes per step,
ArCHer and filtered BC ``tasks_per_step x 1`` (32 x 1); same learning rate, same turn length. Held-out success
(greedy, the ``validation`` split, 64 tasks) is measured before, along and after.

    python benchmarks/credit_assignment.py                # 2 tasks x 5 methods x 3 seeds
    python benchmarks/credit_assignment.py --quick        # smoke run: 1 seed, 2 steps, 16 eval tasks
    python benchmarks/credit_assignment.py --tasks maze --methods grpo,gigpo --seeds 0,1,2
    python benchmarks/credit_assignment.py --tasks sokoban --methods gigpo --jobs 1   # BC -> GiGPO on Sokoban
    python benchmarks/credit_assignment.py --tasks sokoban --build-only   # the model configs/gigpo_sokoban.yaml uses
    python benchmarks/credit_assignment.py --tasks babyai --methods gigpo,grpo --seeds 3   # BC -> RL on BabyAI

Runs live in ``WORKDIR/TASK/METHOD/seedN`` and are reused when their ``summary.json`` exists with the same
settings (an interrupted benchmark resumes; a half-finished run restarts from its last checkpoint). Writes the
curves (success vs episodes, mean over seeds, one panel per task) to ``--out`` (default
``runs/credit_assignment.png``), the raw numbers to its ``.json``, and prints a table per task and whether each
goal (GiGPO >= GRPO + 0.10; ArCHer > filtered BC) was met.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import shutil
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METHODS = ("grpo", "gigpo", "arpo", "archer", "filtered_bc")
# a control, not a method (never in the default --methods): GRPO whose advantages are dealt out at random among
# the batch's trajectories, so an update has GRPO's size and noise and no information about what worked. A method
# that ends no better than its control has learned nothing one can measure
CONTROLS = ("grpo_shuffled",)
GROUP_METHODS = ("grpo", "gigpo", "arpo", "grpo_shuffled")


@dataclass(frozen=True)
class CreditTask:
    """One benchmark task: its suite, held-out split and the turn length its actions need."""

    name: str
    suite: str
    eval_split: str
    max_tokens_per_turn: int
    max_context_tokens: int
    context: Mapping[str, Any] | None = None
    """The rollouts' context strategy (``RolloutConfig.context``) in training, evaluation and the warm start's
    demonstrations alike; ``None``: the whole history, up to ``max_context_tokens``."""


TASKS = {
    "maze": CreditTask("maze", "credit-maze", "validation", max_tokens_per_turn=16, max_context_tokens=1536),
    "guess": CreditTask("guess", "credit-guess", "validation", max_tokens_per_turn=16, max_context_tokens=512),
    # 1024 tokens hold about 18 turns (a 7x7 grid and its feedback are ~50 tokens); episodes that run longer end
    # unsolved, which caps the cost of the failures on a CPU (solved ones take 4-12 moves)
    "sokoban": CreditTask("sokoban", "sokoban", "test", max_tokens_per_turn=16, max_context_tokens=1024),
    # BabyAI GoToLocal: a text view of what the agent sees is about 60 tokens, so 1536 tokens hold about 15 turns
    # (the reference solver needs 5 on average)
    "babyai": CreditTask("babyai", "babyai-goto", "test", max_tokens_per_turn=16, max_context_tokens=1536),
}
DEFAULT_TASKS = ("maze", "guess")
GPU_IN_FLIGHT = 1024
"""Episodes in flight for a run on a GPU, where the tiny model leaves the device mostly idle and more rows a decode
step pay: on an H200 the continuous sampler drew 60.8 Sokoban rollouts/s with 1,024 in flight against 41.9 with 256
(benchmarks/results/sampler_gpu*.json). Each episode samples with its own seed, so the rollouts do not depend on it
(up to float rounding)."""


# ---- warm start --------------------------------------------------------------------------------------------
def greedy_success(model: Any, tokenizer: Any, suite: Any, split: str, count: int, max_tokens: int,
                   max_context_tokens: int, context: Mapping[str, Any] | None = None) -> float:
    """Greedy success of ``model`` on the first ``count`` tasks of ``split`` (no system prompt, as in training)."""
    from agentgym.policies import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize

    specs = [EpisodeSpec(suite.env_id, task=t, seed=i, env_kwargs=dict(suite.env_kwargs))
             for i, t in enumerate(suite.split(split)[:count])]
    config = RolloutConfig(max_in_flight=256, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                           system_prompt="", max_context_tokens=max_context_tokens, deterministic=True,
                           context=context)
    model.eval()
    policy = HFPolicy(model, tokenizer, max_batch_size=64, device=str(next(model.parameters()).device))
    return float(summarize(RolloutEngine(policy, config).run(specs))["success_rate"])


DEFAULT_DEMOS = 200
"""Demonstrations of a warm start when none are asked for (fewer where the suite has fewer training tasks)."""


def warm_start(task: CreditTask, workdir: Path, *, target: float, max_bc_steps: int, chunk: int = 25,
               demos: int | None = None, batch_size: int = 32, device: str = "cpu",
               log: Any = None) -> tuple[Path, dict[str, Any]]:
    """The task's shared starting checkpoint: a tiny model behaviour-cloned until its greedy success on 64
    training tasks first reaches ``target`` (or ``max_bc_steps``). Cached in ``WORKDIR/warm-TASK``; a cached one
    that stopped short of a higher ``target`` or ``max_bc_steps`` given later is cloned further from where it
    stopped (every chunk of BC starts a fresh optimizer, so with the same ``--bc-check-every`` this equals one
    uninterrupted run). ``demos`` reference-solver demonstrations of distinct training tasks are cloned, ``batch_size``
    at a time (``None``: :data:`DEFAULT_DEMOS`, or every training task of a suite that has fewer, as guess-the-number's
    100 secrets); a count given explicitly or a batch other than 32 gets its own cache (``warm-TASK-dN-bB``).

    Raises:
        ValueError: ``demos`` asks for more demonstrations than the suite has training tasks."""
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model, load_tiny_model
    from agentgym.cli.quickstart import demonstration_texts

    log = log or functools.partial(print, flush=True)  # each stage takes minutes: show it as it starts
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations

    default = demos is None or demos == DEFAULT_DEMOS
    name = f"warm-{task.name}" if default and batch_size == 32 else f"warm-{task.name}-d{demos}-b{batch_size}"
    out = workdir / name
    info_path = out / "warm_start.json"
    cached = json.loads(info_path.read_text()) if info_path.is_file() and (out / "config.json").is_file() else None
    if cached is not None and cached.get("context") != (dict(task.context) if task.context else None):
        log(f"  warm start {task.name}: the cached one in {out} was cloned with another context strategy "
            f"({cached.get('context')}); building it again")
        cached = None
    if cached is not None:
        reached = max((s for _, s in cached["train_success_curve"]), default=0.0)
        if reached >= target or cached["bc_steps"] >= max_bc_steps:
            return out, cached
    started = time.perf_counter()
    suite = load_suite(task.suite)
    if cached is None:
        log(f"  warm start {task.name}: building the tiny model in {workdir / f'base-{task.name}'} (its tokenizer "
            f"trained on 200 reference episodes of {task.suite})")
        base = build_tiny_model(workdir / f"base-{task.name}", texts=demonstration_texts(task.suite, 200),
                                config=TinyModelConfig())
        model, tokenizer = load_tiny_model(base)
        model.to(device)
        curve: list[tuple[int, float]] = []
        steps, earlier_s = 0, 0.0
    else:
        model, tokenizer = load_tiny_model(out)
        model.to(device)
        curve = [tuple(point) for point in cached["train_success_curve"]]
        steps, earlier_s = int(cached["bc_steps"]), float(cached["seconds"])
        log(f"  warm start {task.name}: continuing from {steps} BC steps (cached train success {curve[-1][1]:.3f})")
    available = len(suite.split("train"))
    if demos is None:
        demos = min(DEFAULT_DEMOS, available)
    elif demos > available:
        raise ValueError(f"demos={demos}: suite {task.suite!r} has only {available} training tasks; ask for at most "
                         "that many (or leave it unset: every training task up to 200)")
    log(f"  warm start {task.name}: playing {demos} reference demonstrations, then behaviour cloning {chunk} steps "
        f"at a time until greedy success on 64 training tasks reaches {target:g} (at most {max_bc_steps} steps; "
        f"cached in {out})")
    demonstrations = collect_demonstrations(suite, "train", demos, tokenizer, system_prompt="",
                                            max_context_tokens=task.max_context_tokens, context=task.context,
                                            max_action_tokens=task.max_tokens_per_turn)
    info = cached
    while steps < max_bc_steps or info is None:
        behaviour_clone(model, tokenizer, demonstrations, steps=chunk, learning_rate=1e-3, batch_size=batch_size,
                        seed=steps, device=device, progress=False)
        steps += chunk
        success = greedy_success(model, tokenizer, suite, "train", 64, task.max_tokens_per_turn, task.max_context_tokens,
                                 task.context)
        curve.append((steps, success))
        log(f"  warm start {task.name}: {steps} BC steps -> train success {success:.3f} "
            f"({time.perf_counter() - started:.0f} s)")
        # saved after every chunk, so an interrupted warm start resumes from its last check, not from scratch
        info = _save_warm_start(model, tokenizer, out, {
            "bc_steps": steps, "train_success_curve": curve, "target": target,
            "seconds": earlier_s + time.perf_counter() - started, "demonstrations": len(demonstrations),
            "batch_size": batch_size, "device": device, "context": dict(task.context) if task.context else None})
        if success >= target:
            break
    return out, info


def _save_warm_start(model: Any, tokenizer: Any, out: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Write the checkpoint, then its record (the record last: a record on disk always names a whole checkpoint)."""
    from agentgym.models.tiny import quiet_progress_bars

    out.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    with quiet_progress_bars():  # a one-file write every chunk: its bar is only noise in the study's output
        model.to("cpu").save_pretrained(out)
        model.to(device)
        tokenizer.save_pretrained(out)
    (out / "warm_start.json").write_text(json.dumps(info, indent=2))
    return info


def _threads_per_run(jobs: int) -> int:
    """CPU threads per run: the cores shared evenly by the runs in parallel (1 each on 2 cores with 2 jobs)."""
    import os

    return max(1, (os.cpu_count() or 1) // jobs)


# ---- one run -----------------------------------------------------------------------------------------------
def run_config(task: CreditTask, method: str, seed: int, model: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The trainer config of one run, in the shared vocabulary. Hyperparameters are fixed once for every method
    (see ``--help``); only the episode layout differs: groups of ``group_size`` for GRPO/GiGPO/ARPO, one episode
    per task (``group_size`` times more tasks) for ArCHer and filtered BC, so episodes per step are equal."""
    grouped = method in GROUP_METHODS
    config: dict[str, Any] = {
        "trainer": "grpo" if method in CONTROLS else method, "model": str(model), "suite": task.suite, "eval_split": args.eval_split or task.eval_split,
        "output_dir": str(out), "steps": args.steps,
        "tasks_per_step": args.tasks_per_step if grouped else args.tasks_per_step * args.group_size,
        "group_size": args.group_size if grouped else 1,
        "learning_rate": args.learning_rate, "warmup_steps": args.warmup_steps, "eval_every": args.eval_every,
        "eval_tasks": args.eval_tasks, "checkpoint_every": args.eval_every, "seed": seed, "warmstart": "none",
        "max_tokens_per_turn": task.max_tokens_per_turn, "max_context_tokens": args.max_context_tokens or task.max_context_tokens,
        "system_prompt": "", "temperature": args.temperature, "progress": False, "tensorboard": False,
    }
    if method in CONTROLS:  # the trainer's own shuffled-advantage control (GrpoConfig.advantage_control)
        config["advantage_control"] = "shuffle"
    if args.device != "cpu":  # left out on a CPU: fingerprints of earlier CPU runs stay valid
        config["device"] = args.device
        config["max_in_flight"] = GPU_IN_FLIGHT
    if grouped:
        config["micro_batch_size"] = 16
        if args.loss_agg is not None:
            config["loss_agg"] = args.loss_agg
        if args.constrain_actions:  # only when set: fingerprints of earlier free-text runs stay valid
            config["constrain_actions"] = True
        if args.mask_over_turn:
            config["mask_over_turn"] = True
        if args.packing:
            config["packing"] = True
    else:
        config.update(actor_steps=3, batch_size=16, actor_warmup_steps=1)
    if task.context:  # only when set, likewise
        config["context"] = dict(task.context)
    if args.env_kwargs:  # only when set, likewise
        config["env_kwargs"] = args.env_kwargs
    if method == "archer":
        config.update(critic_steps=10, critic_max_tokens=256)
    return config


def run_one(task_name: str, method: str, seed: int, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train one (task, method, seed) run, or reuse its finished directory; returns its curve and statistics."""
    import torch

    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict

    torch.set_num_threads(_threads_per_run(args.jobs))
    logging.basicConfig(level=logging.WARNING)
    task = TASKS[task_name]
    out = Path(args.workdir) / task.name / method / f"seed{seed}"
    config = run_config(task, method, seed, Path(model), out, args)
    # the warm start's record too: a warm start cloned further keeps its path but is another starting point
    warm_info = Path(model) / "warm_start.json"
    warm = json.loads(warm_info.read_text()) if warm_info.is_file() else None
    fingerprint = hashlib.sha256(json.dumps([config, warm], sort_keys=True).encode()).hexdigest()[:16]
    marker = out / "bench.json"
    previous = json.loads(marker.read_text()) if marker.is_file() else {}
    if previous.get("fingerprint") != fingerprint or not any((out / "checkpoints").glob("*")):
        shutil.rmtree(out, ignore_errors=True)  # other settings, or nothing to resume from: start over
        previous = {}
    if previous.get("fingerprint") == fingerprint and "seconds" in previous and (out / "summary.json").is_file():
        seconds, reused = float(previous["seconds"]), True
    else:
        out.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"fingerprint": fingerprint, "config": config}))
        started = time.perf_counter()
        trainer = make_trainer(config_from_dict(config))
        trainer.train()  # resumes from a checkpoint left by an interrupted run
        seconds, reused = time.perf_counter() - started, False
        marker.write_text(json.dumps({"fingerprint": fingerprint, "config": config, "seconds": seconds}))
    return {"task": task.name, "method": method, "seed": seed, "seconds": seconds, "reused": reused,
            "episodes_per_step": config["tasks_per_step"] * config["group_size"], **read_metrics(out / "metrics.jsonl",
                                                                                               config)}


def read_metrics(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Held-out curve ``[(episodes, success)]`` plus the method's diagnostics from a run's metrics.jsonl."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    per_step = config["tasks_per_step"] * config["group_size"]
    evals = {int(r["step"]): r for r in records if "eval/success_rate" in r}
    curve = [(step * per_step, float(r["eval/success_rate"])) for step, r in sorted(evals.items())]
    final = evals[max(evals)] if evals else {}

    def mean_of(key: str) -> float | None:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return statistics.mean(values) if values else None

    def last_of(key: str) -> float | None:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return values[-1] if values else None

    offsets = [abs(float(r["actor/advantage_mean"])) / float(r["actor/advantage_std"]) for r in records
               if isinstance(r.get("actor/advantage_mean"), (int, float)) and r.get("actor/advantage_std")]
    return {
        "curve": curve,
        # an advantage offset shared by the whole batch only adds noise to the policy gradient (a sampled action's
        # score has mean zero); ArCHer's min(Q) - min(V) carries one when V lags the Q of fresh samples
        "actor_advantage_offset": statistics.mean(offsets) if offsets else None,
        "eval_mean_turns": final.get("eval/mean_turns"), "eval_mean_tool_calls": final.get("eval/mean_tool_calls"),
        "train_success": [float(r["train/success_rate"]) for r in records if "train/success_rate" in r],
        "train_tool_calls_mean": mean_of("train/mean_tool_calls"),
        # the calls its envs ran per training episode: ARPO's branches copy their prefix's (None from a run logged
        # before ARPO counted them); independent rollouts run every call they hold
        "train_tool_calls_run_mean": (mean_of("arpo/tool_calls_run_per_episode") if config.get("trainer") == "arpo"
                                      else mean_of("train/mean_tool_calls")),
        "gigpo_steps_in_shared_anchor": mean_of("gigpo/steps_in_shared_anchor"),
        "gigpo_anchor_group_size_mean": mean_of("gigpo/anchor_group_size_mean"),
        "critic_explained_variance": last_of("critic/explained_variance"),
        "arpo_branches_per_task": mean_of("arpo/branches_per_task"),
        # the share of a step's groups whose rollouts all scored alike, so no group advantage: what branching from
        # few roots costs in signal (its branches share prefixes and end alike more often)
        "zero_signal_groups_mean": mean_of("train/zero_signal_groups"),
    }


# ---- report ------------------------------------------------------------------------------------------------
def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def finals_by_method(results: list[dict[str, Any]], task: str) -> dict[str, list[float]]:
    """Final held-out success per seed, by method, in METHODS order (controls last)."""
    out: dict[str, list[float]] = {}
    for method in METHODS + CONTROLS:
        runs = sorted((r for r in results if r["task"] == task and r["method"] == method), key=lambda r: r["seed"])
        if runs:
            out[method] = [r["curve"][-1][1] for r in runs]
    return out


def table(results: list[dict[str, Any]], task: str) -> str:
    """Markdown table of one task: start, final mean ± sd, every seed, the two comparisons, cost, diagnostics."""
    finals = finals_by_method(results, task)
    grpo = statistics.mean(finals["grpo"]) if "grpo" in finals else None
    fbc = statistics.mean(finals["filtered_bc"]) if "filtered_bc" in finals else None
    rows = ["| method | start | final (mean ± sd) | per seed | vs GRPO | vs filtered BC | episodes | s/run | diagnostics |",
            "|---|---|---|---|---|---|---|---|---|"]
    for method, values in finals.items():
        runs = sorted((r for r in results if r["task"] == task and r["method"] == method), key=lambda r: r["seed"])
        mean, sd = _mean_sd(values)
        start = statistics.mean(r["curve"][0][1] for r in runs)
        episodes = runs[0]["curve"][-1][0]
        notes = []
        shared = [r["gigpo_steps_in_shared_anchor"] for r in runs if r.get("gigpo_steps_in_shared_anchor") is not None]
        if shared:
            size = [r["gigpo_anchor_group_size_mean"] for r in runs if r.get("gigpo_anchor_group_size_mean") is not None]
            notes.append(f"steps in shared anchor {statistics.mean(shared):.2f}, anchor group size "
                         f"{statistics.mean(size):.2f}")
        ev = [r["critic_explained_variance"] for r in runs if r.get("critic_explained_variance") is not None]
        if ev:
            notes.append(f"critic EV (final) {', '.join(f'{v:.3f}' for v in ev)}")
        branches = [r["arpo_branches_per_task"] for r in runs if r.get("arpo_branches_per_task") is not None]
        if branches:
            notes.append(f"branches/task {statistics.mean(branches):.2f}")
        calls = [r["eval_mean_tool_calls"] for r in runs if r.get("eval_mean_tool_calls") is not None]
        if calls:
            notes.append(f"held-out tool calls/episode {statistics.mean(calls):.2f}")
        rows.append(
            f"| {method} | {start:.3f} | {mean:.3f} ± {sd:.3f} | {', '.join(f'{v:.3f}' for v in values)} "
            f"| {_fmt(None if grpo is None or method == 'grpo' else mean - grpo, '+.3f')} "
            f"| {_fmt(None if fbc is None or method == 'filtered_bc' else mean - fbc, '+.3f')} "
            f"| {episodes} | {statistics.mean(r['seconds'] for r in runs):.0f} | {'; '.join(notes) or '-'} |")
    return "\n".join(rows)


def goals(results: list[dict[str, Any]], task: str) -> list[str]:
    """Whether GiGPO >= GRPO + 0.10 and ArCHer > filtered BC (means over seeds) on ``task``."""
    finals = finals_by_method(results, task)
    lines = []
    if "gigpo" in finals and "grpo" in finals:
        gap = statistics.mean(finals["gigpo"]) - statistics.mean(finals["grpo"])
        lines.append(f"{task}: GiGPO - GRPO = {gap:+.3f} -> goal (>= +0.10) {'MET' if gap >= 0.10 - 1e-9 else 'NOT met'}")
    if "archer" in finals and "filtered_bc" in finals:
        gap = statistics.mean(finals["archer"]) - statistics.mean(finals["filtered_bc"])
        lines.append(f"{task}: ArCHer - filtered BC = {gap:+.3f} -> goal (> 0) {'MET' if gap > 0 else 'NOT met'}")
    return lines


def plot(results: list[dict[str, Any]], tasks: list[str], out: Path, title: str, eval_split: str | None = None) -> None:
    """Held-out success vs training episodes, mean over seeds (seeds faint), one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"grpo": "tab:green", "gigpo": "tab:red", "arpo": "tab:purple", "archer": "tab:blue",
              "filtered_bc": "tab:orange", "grpo_shuffled": "tab:gray"}
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for method in METHODS + CONTROLS:
            runs = [r for r in results if r["task"] == task and r["method"] == method]
            if not runs:
                continue
            for r in runs:
                xs, ys = zip(*r["curve"])
                ax.plot(xs, ys, color=colors[method], alpha=0.2, linewidth=1)
            xs = [x for x, _ in runs[0]["curve"]]
            mean = [statistics.mean(dict(r["curve"]).get(x, float("nan")) for r in runs) for x in xs]
            ax.plot(xs, mean, color=colors[method], marker="o", linewidth=2, label=f"{method} ({len(runs)} seeds)")
        ax.set_title(f"{TASKS[task].suite} ({eval_split or TASKS[task].eval_split})")
        ax.set_xlabel("training episodes")
        ax.set_ylabel("held-out success (greedy)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


# ---- command line ------------------------------------------------------------------------------------------
def _names(text: str, allowed: tuple[str, ...], flag: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        parser.error(f"{flag}: unknown {unknown or 'empty list'}; choose a comma-separated subset of {','.join(allowed)}")
    return list(dict.fromkeys(names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma-separated subset of " + ",".join(TASKS))
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated subset of " + ",".join(METHODS) + ", or the control grpo_shuffled (GRPO "
                        "with each trajectory's advantage given to another one of the batch: a method that ends "
                        "no better than it learned nothing measurable)")
    p.add_argument("--seeds", default="3", help="a count (3: seeds 0,1,2) or a comma-separated list (0,2)")
    p.add_argument("--steps", type=int, default=8, help="training steps per run")
    p.add_argument("--tasks-per-step", type=int, default=4,
                   help="tasks per step for GRPO/GiGPO/ARPO (ArCHer and filtered BC take this x --group-size tasks "
                        "of one episode each)")
    p.add_argument("--group-size", type=int, default=8, help="episodes per task for GRPO/GiGPO/ARPO")
    p.add_argument("--learning-rate", type=float, default=1e-4,
                   help="policy learning rate, every method (3e-4 made GRPO's training success on guess fall from 0.56 to 0.06)")
    p.add_argument("--warmup-steps", type=int, default=2, help="learning-rate warm-up in optimizer steps, every method")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the training rollouts, every method (evaluation is greedy)")
    p.add_argument("--loss-agg", default=None,
                   choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
                   help="loss aggregation of GRPO/GiGPO/ARPO (default: the trainer's, token-mean); a row is one "
                        "trajectory, so seq-mean-token-mean weighs every episode equally however many turns it took")
    p.add_argument("--constrain-actions", action="store_true",
                   help="GRPO/GiGPO/ARPO decode every reply as one of the env's valid actions (training and "
                        "held-out evaluation alike) and leave the tokens a choice forces out of the loss")
    p.add_argument("--mask-over-turn", action="store_true",
                   help="GRPO/GiGPO/ARPO leave episodes cut by the turn or context limit out of the loss (Mini-o3 "
                        "over-turn masking): their many tokens no longer push every frequent action down")
    p.add_argument("--env-kwargs", default=None,
                   help="a JSON object of keyword arguments for every env of the RL runs, training and held-out "
                        "alike (the warm start keeps the suite's), e.g. '{\"reward\": \"gym-sokoban\"}' trains Sokoban on "
                        "gym-sokoban's shaped reward (held-out success is still a solved room)")
    p.add_argument("--packing", action="store_true",
                   help="GRPO/GiGPO/ARPO pack trajectories into full rows for the update instead of padding each "
                        "(the same loss; about 3x faster for the tiny model on a CPU, see benchmarks/train_step.py)")
    p.add_argument("--max-context-tokens", type=int, default=None,
                   help="context cap of every RL run's episodes, training and held-out alike (default: the task's: "
                        "1536 on babyai, about 15 turns); the warm start's checks keep the task's cap")
    p.add_argument("--eval-every", type=int, default=2, help="held-out evaluation every N steps (and before, after)")
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks per evaluation (greedy)")
    p.add_argument("--eval-split", default=None,
                   help="the suite split RL runs are evaluated on (default: the task's, test on sokoban and babyai, "
                        "validation on maze and guess); on sokoban, validation holds out 6x6 rooms of the training "
                        "distribution, test bigger 7x7 rooms")
    p.add_argument("--bc-target", type=float, default=0.25,
                   help="stop the shared BC warm start once greedy success on 64 training tasks reaches this")
    p.add_argument("--max-bc-steps", type=int, default=400, help="most BC steps of the warm start")
    p.add_argument("--bc-check-every", type=int, default=25,
                   help="BC steps between the warm start's checks of its training success (each check runs 64 "
                        "greedy episodes: a long one on Sokoban)")
    p.add_argument("--demos", type=int, default=None,
                   help="reference-solver demonstrations of the warm start, one per training task (default: 200, or "
                        "every training task of a suite that has fewer)")
    p.add_argument("--bc-batch-size", type=int, default=32, help="demonstrations per BC step of the warm start")
    p.add_argument("--device", default="cpu", help="torch device of BC, rollouts and training: cpu (default) or cuda")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (the CPU cores shared evenly among them)")
    p.add_argument("--workdir", default="runs/credit_assignment", help="where models and runs go")
    p.add_argument("--out", default=None,
                   help="curves PNG (raw numbers go to its .json; default runs/credit_assignment.png, or "
                        "runs/credit_assignment_TASK.png when --tasks names sokoban or babyai alone)")
    p.add_argument("--build-only", action="store_true",
                   help="only build each task's tiny model (WORKDIR/base-TASK) and its BC warm start, then exit")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 seed, 2 steps of 2 tasks x 4, 16 eval tasks, in WORKDIR-quick")
    args = p.parse_args(argv)
    args.tasks = _names(args.tasks, tuple(TASKS), "--tasks", p)
    if args.out is None:  # a Sokoban-only run does not overwrite the maze/guess figures
        alone = args.tasks[0] if len(args.tasks) == 1 and args.tasks[0] in ("sokoban", "babyai") else None
        args.out = f"runs/credit_assignment_{alone}.png" if alone else "runs/credit_assignment.png"
    args.methods = _names(args.methods, METHODS + CONTROLS, "--methods", p)
    if args.env_kwargs is not None:
        try:
            args.env_kwargs = json.loads(args.env_kwargs)
        except json.JSONDecodeError as exc:
            p.error(f"--env-kwargs must be a JSON object such as '{{\"reward\": \"gym-sokoban\"}}': {exc}")
        if not isinstance(args.env_kwargs, dict):
            p.error(f"--env-kwargs must be a JSON object (name: value), got {args.env_kwargs!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be a count or a comma-separated list of integers, got {args.seeds!r}")
    if "," not in args.seeds:
        seeds = list(range(seeds[0])) if seeds else []
    if not seeds or min(seeds) < 0:
        hint = " (a lone number is a count of seeds: to run seed 0 alone write --seeds 1 or --seeds 0,)" \
            if args.seeds.strip() == "0" else ""
        p.error(f"--seeds must name at least one seed >= 0, got {args.seeds!r}{hint}")
    args.seeds = seeds
    if args.quick:
        args.seeds, args.steps, args.tasks_per_step, args.group_size = [0], 2, 2, 4
        args.eval_every, args.eval_tasks, args.max_bc_steps = 1, 16, 25
        args.workdir, args.out = args.workdir.rstrip("/") + "-quick", str(Path(args.out).with_name("credit_assignment_quick.png"))
    for name in ("steps", "tasks_per_step", "group_size", "eval_tasks", "max_bc_steps", "bc_check_every", "jobs",
                 "eval_every", "demos", "bc_batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.demos is not None:  # each demonstration needs its own training task
        from agentgym.registration.suites import load_suite

        for name in args.tasks:
            available = len(load_suite(TASKS[name].suite).split("train"))
            if args.demos > available:
                p.error(f"--demos {args.demos}: suite {TASKS[name].suite!r} (--tasks {name}) has only {available} "
                        "training tasks; ask for at most that many")
    if args.eval_split is not None:
        from agentgym.registration.suites import load_suite

        for name in args.tasks:
            splits = sorted(load_suite(TASKS[name].suite).splits)
            if args.eval_split not in splits or args.eval_split == "train":
                p.error(f"--eval-split {args.eval_split!r}: suite {TASKS[name].suite!r} (--tasks {name}) has the "
                        f"held-out splits {[s for s in splits if s != 'train']}; pick one of those")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        p.error(f"--device must be cpu or cuda (cuda:N for one GPU of several), got {args.device!r}")
    if args.max_context_tokens is not None and args.max_context_tokens < 256:
        p.error(f"--max-context-tokens must be >= 256 (a prompt and a few turns), got {args.max_context_tokens}")
    if args.warmup_steps < 0:
        p.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if not args.learning_rate > 0:
        p.error(f"--learning-rate must be > 0 (1e-4: the default), got {args.learning_rate}")
    if args.mask_over_turn and not set(args.methods) <= set(GROUP_METHODS):
        p.error(f"--mask-over-turn is an option of {', '.join(GROUP_METHODS)} only; drop it or pick --methods among those")
    if args.packing and not set(args.methods) <= set(GROUP_METHODS):
        p.error(f"--packing is an option of {', '.join(GROUP_METHODS)} only; drop it or pick --methods among those")
    if args.constrain_actions and not set(args.methods) <= set(GROUP_METHODS):
        p.error(f"--constrain-actions works with {', '.join(GROUP_METHODS)} only (ArCHer and filtered BC rebuild "
                f"turns into their own transitions); drop it or pick --methods among those")
    if not args.temperature > 0:
        p.error(f"--temperature must be > 0 (1.0: the default; rollouts must sample), got {args.temperature}")
    if not 0 < args.bc_target <= 1:
        p.error(f"--bc-target must be in (0, 1], got {args.bc_target}")
    if args.steps % args.eval_every:
        p.error(f"--steps ({args.steps}) must be a multiple of --eval-every ({args.eval_every}) so every run's "
                "curve has the same points")
    if "arpo" in args.methods and args.group_size < 4:
        p.error("--group-size must be >= 4 with arpo (it starts 4 rollouts per task and branches up to the group size)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(_threads_per_run(args.jobs))
    logging.basicConfig(level=logging.WARNING)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    say = lambda message: (sys.stdout.write(message + "\n"), sys.stdout.flush())  # noqa: E731
    models, warm = {}, {}
    for name in args.tasks:
        models[name], warm[name] = warm_start(TASKS[name], workdir, target=args.bc_target,
                                              max_bc_steps=args.max_bc_steps, chunk=args.bc_check_every,
                                              demos=args.demos, batch_size=args.bc_batch_size, device=args.device,
                                              log=say)
        say(f"warm start {name}: {warm[name]['bc_steps']} BC steps, train success "
            f"{warm[name]['train_success_curve'][-1][1]:.3f} ({models[name]})")
    if args.build_only:
        return 0
    jobs = [(t, m, s) for t in args.tasks for s in args.seeds for m in args.methods]
    results: list[dict[str, Any]] = []
    failed: list[str] = []

    def record(job: tuple[str, str, int], run: Any) -> None:
        """Keep a finished run, or report a failed one and go on (its directory resumes on the next call)."""
        try:
            r = run()
        except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others' results
            failed.append(f"{job[0]} {job[1]} seed {job[2]}: {type(exc).__name__}: {exc}")
            say(f"{job[0]:6s} {job[1]:12s} seed {job[2]}: FAILED ({type(exc).__name__}: {exc})")
            return
        results.append(r)
        say(f"{r['task']:6s} {r['method']:12s} seed {r['seed']}: {r['curve']} "
            f"({r['seconds']:.0f} s{', reused' if r['reused'] else ''})")

    if args.jobs == 1:
        for job in jobs:
            record(job, lambda job=job: run_one(*job, str(models[job[0]]), args))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # a fresh process per run: no state (or module imported before a code change) leaks between runs
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                 max_tasks_per_child=1) as pool:
            futures = {pool.submit(run_one, *job, str(models[job[0]]), args): job for job in jobs}
            for future in as_completed(futures):
                record(futures[future], future.result)
    if not results:
        say("no run finished:\n" + "\n".join(failed))
        return 1
    order = {(t, m, s): i for i, (t, m, s) in enumerate(jobs)}
    results.sort(key=lambda r: order[(r["task"], r["method"], r["seed"])])
    out = Path(args.out)
    episodes = args.steps * args.tasks_per_step * args.group_size
    title = (f"tiny model from a shared BC warm start, {episodes} training episodes per run, "
             f"{len(args.seeds)} seed(s), {args.eval_tasks} held-out tasks (greedy)")
    plot(results, args.tasks, out, title, args.eval_split)
    wall = time.perf_counter() - t0
    report = {"args": vars(args), "warm_start": warm, "results": results, "failed": failed, "wall_s": wall}
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    for name in args.tasks:
        say(f"\n{TASKS[name].suite} ({args.eval_split or TASKS[name].eval_split}, {args.eval_tasks} tasks); {title}\n"
            f"{table(results, name)}")
    say("")
    for name in args.tasks:
        for line in goals(results, name):
            say(line)
    say(f"curves: {out}; raw: {out.with_suffix('.json')}; wall time {wall:.0f} s")
    if failed:
        say(f"{len(failed)} run(s) FAILED (run again to retry them):\n" + "\n".join(failed))
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        record_results(results, args, title, failed)
    return 1 if failed else 0


def record_results(results: list[dict[str, Any]], args: argparse.Namespace, title: str, failed: list[str]) -> None:
    """Final held-out success per task to ``benchmarks/results/credit_assignment.json``: each method against the
    baseline its goal names (GiGPO and ARPO against GRPO, ArCHer against filtered BC), with the goals ``goals``
    prints."""
    from _results import figure, write_results

    figures = []
    for task in args.tasks:
        finals = {m: statistics.mean(v) for m, v in finals_by_method(results, task).items()}
        split = args.eval_split or TASKS[task].eval_split
        for method, base, goal, met in (
                ("gigpo", "grpo", "GiGPO - GRPO >= +0.10", lambda gap: gap >= 0.10 - 1e-9),
                ("arpo", "grpo", None, None),
                ("archer", "filtered_bc", "ArCHer - filtered BC > 0", lambda gap: gap > 0)):
            if method not in finals or base not in finals:
                continue
            gap = finals[method] - finals[base]
            figures.append(figure(f"{TASKS[task].suite} ({split}): {method}, final greedy held-out success; {title}; "
                                  f"baseline: {base}", finals[method], finals[base], unit="success rate", goal=goal,
                                  met=None if met is None else met(gap), note=f"difference {gap:+.3f}"))
    write_results("credit_assignment", figures, details={"runs": results, "failed": failed},
                  note="--quick: 1 seed, 2 steps of 2 tasks x 4, 16 eval tasks" if args.quick else None)


if __name__ == "__main__":
    raise SystemExit(main())
