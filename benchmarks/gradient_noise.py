"""How many rollouts a step needs before the policy gradient is more signal than noise: GRPO vs GiGPO and variants.

A step's gradient is an estimate from a batch of B rollouts. Two batches sampled independently from the same
policy agree only in the gradient's true direction G; the rest is noise of variance tr(S)/B. So the cosine between
the two batches' gradients is about |G|^2 / (|G|^2 + tr(S)/B), and the **noise scale** B_noise = tr(S)/|G|^2 =
B (1 - cos) / cos (McCandlish et al., 2018, "An Empirical Model of Large-Batch Training") is the batch at which
a step is half signal. With B far below B_noise, Adam (which moves every weight by about the learning rate,
whatever the gradient's size) takes mostly random steps, and a control run whose advantages are shuffled ends
where the real run does (``advantage_control: shuffle``, the credit-assignment benchmark's ``grpo_shuffled``).

This script samples K independent batches with the trainer's own rollouts (same policy, different tasks and
seeds: the noise of a real step), computes each variant's real policy gradient on every batch with the trainer's
own ``_learn`` (captured before the optimizer would step), and prints the mean pairwise cosine and B_noise per
variant, with GRPO as the baseline (ratio = GRPO's B_noise / the variant's: how many times fewer rollouts the
variant needs for the same signal). Variants that change only the learner (loss aggregation, masking, GiGPO's
settings) reuse the same rollouts, so they are compared on identical data; ``--save``/``--load`` keep them.

    python benchmarks/gradient_noise.py --model runs/credit_sokoban/warm-sokoban-d500-b32 --batches 6
    python benchmarks/gradient_noise.py --model M --load runs/gradient_noise/rollouts.pt --variants grpo,gigpo
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import credit_assignment as credit  # noqa: E402 - the tasks and the run config the learning smoke uses
from studies.catalogue import EXTRA_TASKS, STUDIES, task_of  # noqa: E402 - the studies' tasks and names

#: name -> (trainer, config overrides): learner-side settings only, so every variant scores the same rollouts
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "grpo_seq_mean": ("grpo", {"loss_agg": "seq-mean-token-mean"}),
    "grpo_mask_over_turn": ("grpo", {"mask_over_turn": True}),
    "gigpo": ("gigpo", {}),
    "gigpo_seq_mean": ("gigpo", {"loss_agg": "seq-mean-token-mean"}),
    "gigpo_mask_over_turn": ("gigpo", {"mask_over_turn": True}),
    "gigpo_gamma_0.8": ("gigpo", {"gamma": 0.8}),
    "gigpo_omega_2": ("gigpo", {"omega": 2.0}),
}


class _CapturedGradient:
    """Stands in for the optimizer: ``step`` records the gradient (after clipping, which only scales it) instead of
    moving the weights, so every variant and batch is measured at the same policy."""

    def __init__(self, params: list[Any]) -> None:
        self.params, self.grad, self.param_groups = params, None, [{"lr": 0.0}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch

        self.grad = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                               for p in self.params]).double()


class _NoSchedule:
    def step(self) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return [0.0]


def _trainer(task: credit.CreditTask, name: str, model: Path, args: argparse.Namespace) -> Any:
    from agentgym.trainers import make_trainer
    from agentgym.trainers.config import config_from_dict

    method, overrides = VARIANTS[name]
    config = credit.run_config(task, method, 0, model, Path(args.workdir) / name, args.credit_args)
    config.update(overrides, mini_batches=1, ppo_epochs=1)
    return make_trainer(config_from_dict(config))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    task = task_of(args.task)
    model = Path(args.model)
    sampler = _trainer(task, "grpo", model, args)
    sampler.model, sampler.tokenizer = sampler._load(model)
    params = [p for p in sampler.model.parameters() if p.requires_grad]
    if args.load:
        batches = torch.load(args.load, weights_only=False)
        print(f"loaded {len(batches)} batches of {len(batches[0])} rollouts from {args.load}", flush=True)
    else:
        sampler.policy = sampler._generation_policy(sampler.model_dir)
        batches = []
        for k in range(args.batches):
            t0 = time.perf_counter()
            batches.append(sampler._sample(1000 + k))  # steps no training run reaches: fresh tasks, fresh seeds
            rate = statistics.mean(float(t.success) for t in batches[-1])
            print(f"batch {k}: {len(batches[-1])} rollouts, success {rate:.2f} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
        # End the decode thread before the gradient passes: left waiting through them, the process aborted at exit
        # (exit status 134, 'terminate called without an active exception'), even when closed by an atexit hook.
        sampler.policy.close()
        if args.save:
            Path(args.save).parent.mkdir(parents=True, exist_ok=True)
            torch.save(batches, args.save)
    size = len(batches[0])
    results: dict[str, Any] = {}
    for name in args.variants:
        trainer = _trainer(task, name, model, args)
        trainer.model, trainer.tokenizer, trainer.reference, trainer._rollout_stats = \
            sampler.model, sampler.tokenizer, None, {}
        trainer.optimizer, trainer.scheduler = _CapturedGradient(params), _NoSchedule()
        t0 = time.perf_counter()
        grads, empty = [], 0
        for k, batch in enumerate(batches):
            trainer.optimizer.grad = None
            trainer._learn(1000 + k, batch)
            if trainer.optimizer.grad is None:  # nothing to train on (every group scored alike, or all masked)
                empty += 1
                grads.append(torch.zeros(sum(p.numel() for p in params), dtype=torch.float64))
            else:
                grads.append(trainer.optimizer.grad)
        cosines = [float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in itertools.combinations(grads, 2)]
        mean = statistics.mean(cosines)
        se = statistics.stdev(cosines) / len(cosines) ** 0.5 if len(cosines) > 1 else float("nan")
        # each batch's gradient norm beside the cosines: one batch far larger than the rest (a heavy-tailed
        # gradient) shows as its row of cosines against all the others, and the mean cosine then misleads
        results[name] = {"cosines": cosines, "grad_norms": [float(g.norm()) for g in grads],
                         "mean_cos": mean, "se_cos": se, "rollouts_per_batch": size,
                         "noise_scale": size * (1 - mean) / mean if mean > 0 else None,
                         "noise_scale_2se": noise_range(mean, se, size), "empty_batches": empty,
                         "seconds": time.perf_counter() - t0}
        print(f"{name:22s} mean cos {mean:+.3f} ± {se:.3f} -> noise scale "
              f"{_scale(results[name]['noise_scale'], size, len(batches))}", flush=True)
    return {"task": args.task, "model": str(model), "batches": len(batches), "rollouts_per_batch": size,
            "success": statistics.mean(float(t.success) for b in batches for t in b), "variants": results}


def noise_range(mean: float, se: float, size: int) -> tuple[float | None, float | None]:
    """The noise scales of the cosines two standard errors above and below the mean: ``(fewest, most)`` rollouts
    a step; ``None`` for a bound past any batch (a cosine at or below 0). A mean cosine within two se of 0 leaves
    only the lower bound: the noise scale may be far larger than its point estimate."""
    def scale(cos: float) -> float | None:
        return size * (1 - cos) / cos if cos > 0 else None

    if se != se:  # one pair only: no spread to bound
        return scale(mean), scale(mean)
    return scale(min(mean + 2 * se, 1.0)), scale(mean - 2 * se)


def _range(bounds: Any) -> str:
    if not bounds:
        return "-"
    low, high = bounds
    return f"{low:,.0f} to {f'{high:,.0f}' if high is not None else 'unbounded'}" if low is not None else "unbounded"


def _scale(value: float | None, size: int, batches: int) -> str:
    return f"{value:,.0f} rollouts" if value is not None else f"not measurable (> {size * batches:,} rollouts)"


def table(report: dict[str, Any]) -> str:
    """Markdown: per variant the cosine, the noise scale and how many times fewer rollouts it needs than GRPO."""
    base = report["variants"].get("grpo", {}).get("noise_scale")
    rows = [f"{report['task']}: {report['batches']} independent batches of {report['rollouts_per_batch']} rollouts "
            f"(sampled success {report['success']:.2f})", "",
            "| variant | mean pairwise cos (± se) | noise scale (rollouts a step for half signal) | within 2 se | vs GRPO |",
            "|---|---|---|---|---|"]
    for name, r in report["variants"].items():
        ratio = f"{base / r['noise_scale']:.2f}x" if base and r["noise_scale"] else "-"
        rows.append(f"| {name} | {r['mean_cos']:+.3f} ± {r['se_cos']:.3f} | "
                    f"{_scale(r['noise_scale'], report['rollouts_per_batch'], report['batches'])} | "
                    f"{_range(r.get('noise_scale_2se'))} | {ratio} |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="sokoban", choices=sorted({*credit.TASKS, *EXTRA_TASKS}),
                   help="the credit-assignment task, or a learning study's (textworld)")
    p.add_argument("--model", required=True, help="the policy to measure at (e.g. the benchmark's BC warm start)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--batches", type=int, default=6, help="independent batches (pairs: batches x (batches-1) / 2)")
    p.add_argument("--tasks-per-step", type=int, default=16, help="tasks per batch")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    p.add_argument("--constrain-actions", action="store_true", help="decode replies among the env's valid actions")
    p.add_argument("--env-kwargs", default=None, help="JSON object for every env (e.g. '{\"reward\": \"gym-sokoban\"}')")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--save", default=None, help="save the sampled batches here (torch.save)")
    p.add_argument("--load", default=None, help="measure on batches saved by --save instead of sampling")
    p.add_argument("--workdir", default="runs/gradient_noise", help="where the variants' (unused) run dirs go")
    p.add_argument("--out", default="runs/gradient_noise.json", help="the report (JSON)")
    p.add_argument("--label", default=None,
                   help="record under benchmarks/results/gradient_noise_TASK_LABEL.json instead of the task's own file "
                        "(a measurement at a trained model, or of more variants at the warm start); the studies "
                        "size themselves only from figures at the model of the task's own file")
    p.add_argument("--replace", action="store_true",
                   help="record this run's figures in benchmarks/results even over a measurement on more rollouts")
    args = p.parse_args(argv)
    args.variants = credit._names(args.variants, tuple(VARIANTS), "--variants", p)
    if args.label is not None and not re.fullmatch(r"[a-z0-9_]+", args.label):
        p.error(f"--label {args.label!r}: use lower-case letters, digits and _ (it names a results file)")
    if args.batches < 2:
        p.error("--batches must be >= 2: the noise is measured between independent batches")
    if args.group_size < 2:
        p.error("--group-size must be >= 2: GRPO and GiGPO compare rollouts of one task")
    if not Path(args.model, "config.json").is_file():
        study_start = Path(args.model).name == f"warm-{args.task}" and Path(args.model).parent.name == "studies" \
            and f"grpo_{args.task}" in STUDIES
        build = (f"python benchmarks/credit_assignment.py --tasks {args.task} --build-only writes it under "
                 "runs/credit_assignment/" if args.task in credit.TASKS and not study_start
                 else f"agentgym study grpo_{args.task} --agreement builds runs/studies/warm-{args.task}, then measures "
                      "no more than the two methods' agreement")
        p.error(f"--model {args.model}: no config.json there; build the warm start first ({build})")
    if args.load and not Path(args.load).is_file():
        p.error(f"--load {args.load}: no such file (write one with --save)")
    # the benchmark's parser knows only its own tasks (and checks the split against their suites); the task itself
    # comes from task_of, so for a study's task a benchmark task stands in and the split is set after the checks
    own = args.task in credit.TASKS
    credit_argv = ["--tasks", args.task if own else "maze", "--methods", "grpo,gigpo",
                   "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size)]
    if own:
        credit_argv += ["--eval-split", _held_out(args.task)]
    if args.constrain_actions:
        credit_argv.append("--constrain-actions")
    if args.env_kwargs:
        credit_argv += ["--env-kwargs", args.env_kwargs]
    args.credit_args = credit.parse_args(credit_argv)  # its checks (JSON of --env-kwargs included) apply here too
    args.credit_args.eval_split = _held_out(args.task)
    return args


def _held_out(task: str) -> str:
    return "validation" if task in ("maze", "guess", "sokoban") else task_of(task).eval_split


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = measure(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("\n" + table(report) + f"\n\nraw: {args.out}")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        record(report, replace=args.replace, label=args.label)
    return 0


def _rollouts(report: dict[str, Any]) -> int:
    return int(report.get("batches") or 0) * int(report.get("rollouts_per_batch") or 0)


def record(report: dict[str, Any], *, replace: bool = False, label: str | None = None) -> Path | None:
    """The table's noise scales to ``benchmarks/results/gradient_noise.json`` (Sokoban, the default task) or
    ``gradient_noise_TASK.json``, GRPO as the baseline (the same ``vs GRPO`` ratio the table prints: GRPO's noise
    scale over the variant's, higher is better).

    The studies size their rollouts a step from that file, so a smaller try (fewer batches or rollouts) does not
    replace a measurement on more rollouts unless ``replace``; it says so. Returns the path written, or ``None``
    when the earlier measurement was kept. With ``label`` the figures go to ``gradient_noise_TASK_LABEL.json``: the
    noise at a trained model (does a plateau come from a step too small for its noise?) must not resize the studies,
    which read a labelled file only for a variant measured at the model of the task's own file."""
    from _results import RESULTS_DIR, figure, write_results

    # one file a task, so a second task's run keeps the first's (the studies size each task from its own file)
    result = "gradient_noise" if report["task"] == "sokoban" else f"gradient_noise_{report['task']}"
    if label:
        result = f"gradient_noise_{report['task']}_{label}"
    existing = RESULTS_DIR / f"{result}.json"
    if existing.is_file() and not replace:
        earlier = json.loads(existing.read_text(encoding="utf-8")).get("details") or {}
        if earlier.get("task") == report["task"] and _rollouts(earlier) > _rollouts(report):
            print(f"kept {existing}: it was measured on {_rollouts(earlier)} rollouts, this run on "
                  f"{_rollouts(report)} (pass --replace to record this run there anyway)")
            return None

    base = report["variants"].get("grpo", {}).get("noise_scale")
    figures = []
    for name, r in report["variants"].items():
        if name == "grpo":
            continue
        figures.append(figure(
            f"{report['task']}: {name}, gradient noise scale (rollouts a step for half signal), {report['batches']} "
            f"batches of {report['rollouts_per_batch']} rollouts" + ("; baseline: GRPO" if base else
                                                                     " (GRPO not measured in this run)"),
            r["noise_scale"], base,
            unit="rollouts", ratio=base / r["noise_scale"] if base and r["noise_scale"] else None,
            note=f"mean pairwise cos {r['mean_cos']:+.3f} ± {r['se_cos']:.3f}; within 2 se: "
                 f"{_range(r.get('noise_scale_2se'))} rollouts for this variant"
                 + (f", {_range(report['variants']['grpo'].get('noise_scale_2se'))} for GRPO; ratio is GRPO's / "
                    "the variant's (higher is better)" if base else "")
                 + "; none: not measurable at this batch count"))
    return write_results(result, figures, details=report)


if __name__ == "__main__":
    raise SystemExit(main())
