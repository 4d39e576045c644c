"""GRPO on a rubric reward: does the held-out *rubric* score rise when the reward is the rubric?

The task is the calculator suite (games-calc). The rubric has two programmatic criteria (the checker's verdict
and a short final answer) and one judge criterion (did the agent use the calc tool), judged by the naive scripted
judge through a PolicyJudge, in group mode (one judge call per task group, scores relative within the group).
Both arms start from the same tiny model and the same behaviour-cloning warm start (half the demonstrations skip
the calculator and guess, so there is something to learn) and train with the same budget:

- ours: GRPO with ``reward: rubric`` (``judge_mode: group``);
- baseline: GRPO with the env checker's score (``reward: outcome``).

Both are evaluated greedily on held-out tasks with the same rubric (scored inside the env, independent mode), before
and after training. Prints the mean held-out rubric score before and after per arm over seeds and the ratio of
the gains; writes benchmarks/results/rubric_grpo.json.

    python benchmarks/rubric_grpo.py            # 3 seeds x 2 arms at a CPU-sized scale (see --help)
    python benchmarks/rubric_grpo.py --quick    # 1 seed, 2 steps: a smoke run
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

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from _results import figure, write_results  # noqa: E402 - imported first: it notes the load average at the start


def calc_rubric(judged: bool = False) -> Any:
    """The rubric: correct (checker) x2, short answer x1, uses the calc tool (judge) x2."""
    from agentgym.rewards import Check, JudgeCriterion, Rubric

    judge = None
    if judged:
        from agentgym.policies.scripted import ScriptedPolicy
        from agentgym.rewards.scripted_judge import naive_judge_reply
        from agentgym.rollout.judging import PolicyJudge

        judge = PolicyJudge(ScriptedPolicy(naive_judge_reply))
    return Rubric("calc", (
        Check("correct", lambda s: float(s.outcome.get("success", False)), weight=2.0),
        Check("short_answer", lambda s: len(s.answer) <= 12),
        JudgeCriterion("uses_calc", "Did the agent call the [calc] tool before answering?",
                       fields=("answer", "transcript"), weight=2.0),
    ), judge=judge)


def eval_rubric() -> Any:
    """The same rubric with the scripted judge attached, for scoring inside the eval env."""
    return calc_rubric(judged=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--tasks-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-tasks", type=int, default=100)
    p.add_argument("--bc-steps", type=int, default=300)
    p.add_argument("--workdir", default="runs/rubric_grpo")
    p.add_argument("--quick", action="store_true", help="1 seed, 2 steps, 10 eval tasks")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_tasks = 1, 2, 10
    return args


def _eval_suite(workdir: Path) -> Path:
    """games-calc with the judged rubric as the env's reward: eval mean_score is the held-out rubric score."""
    import yaml

    source = Path(__import__("agentgym.tasks", fromlist=["x"]).__file__).parent / "suites" / "games-calc.yaml"
    spec = yaml.safe_load(source.read_text())
    spec["name"] = "games-calc-rubric"
    spec["env_kwargs"] = {"reward": f"{HERE}:eval_rubric"}
    path = workdir / "games-calc-rubric.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _bc_model(workdir: Path, args: argparse.Namespace) -> Path:
    """One tiny model behaviour-cloned once on calculator demonstrations, half of them the shortcut (answer without
    calc, wrongly), shared by every run: both arms and all seeds start from the same weights."""
    target = workdir / f"bc-{args.bc_steps}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.cli.quickstart import demonstration_texts
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations

    base = build_tiny_model(workdir / "tiny", texts=demonstration_texts("games-calc", 300),
                            config=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2,
                                                   intermediate_size=128))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    demos = collect_demonstrations(load_suite("games-calc"), "train", 200, tokenizer, shortcut_fraction=0.5,
                                   system_prompt="")
    behaviour_clone(model, tokenizer, demos, steps=args.bc_steps, learning_rate=1e-3, batch_size=32, seed=0,
                    progress=False)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = _bc_model(workdir, args)
    eval_suite = _eval_suite(workdir)
    runs: dict[str, list[dict[str, float]]] = {"rubric": [], "outcome": []}
    started = time.perf_counter()
    for seed in range(args.seeds):
        for arm in runs:
            extra = dict(reward="rubric", rubric=f"{HERE}:calc_rubric", judge="scripted-naive", judge_mode="group") \
                if arm == "rubric" else dict(reward="outcome")
            shutil.rmtree(workdir / f"{arm}-{seed}", ignore_errors=True)  # a fresh run, never a resume
            config = GrpoConfig(model=str(model), suite="games-calc", eval_suite=str(eval_suite),
                                output_dir=str(workdir / f"{arm}-{seed}"), system_prompt="", warmstart="none", steps=args.steps,
                                tasks_per_step=args.tasks_per_step, group_size=args.group_size, learning_rate=3e-4,
                                warmup_steps=1, max_tokens_per_turn=24, max_context_tokens=256, eval_every=0,
                                eval_tasks=args.eval_tasks, checkpoint_every=0, tensorboard=False, seed=seed,
                                progress=False, **extra)  # type: ignore[arg-type]
            summary = GrpoTrainer(config).train()
            row = {"before": summary["eval_before"]["mean_score"], "after": summary["eval_after"]["mean_score"],
                   "success_before": summary["eval_before"]["success_rate"],
                   "success_after": summary["eval_after"]["success_rate"]}
            runs[arm].append(row)
            print(f"seed {seed} {arm}: held-out rubric score {row['before']:.3f} -> {row['after']:.3f}", flush=True)
    wall = time.perf_counter() - started

    def mean(arm: str, key: str) -> float:
        return statistics.fmean(r[key] for r in runs[arm])

    gain = {arm: mean(arm, "after") - mean(arm, "before") for arm in runs}
    rises = sum(r["after"] > r["before"] for r in runs["rubric"])
    ratio = gain["rubric"] / gain["outcome"] if gain["outcome"] > 0 else None
    for arm in runs:
        print(f"{arm:8s} held-out rubric score {mean(arm, 'before'):.3f} -> {mean(arm, 'after'):.3f} "
              f"(gain {gain[arm]:+.3f}, {args.seeds} seeds)")
    print(f"rubric-reward gain / checker-reward gain: {ratio if ratio is None else round(ratio, 2)}; "
          f"rubric score rose in {rises} of {args.seeds} seeds; {wall:.0f} s")
    scale = (f"tiny model (64 wide, 2 layers), games-calc, one shared BC warm start ({args.bc_steps} steps, half "
             f"shortcut demos), {args.steps} GRPO "
             f"steps x {args.tasks_per_step} tasks x {args.group_size} rollouts, {args.eval_tasks} held-out tasks, "
             f"{args.seeds} seeds")
    write_results("rubric_grpo", [
        figure(f"{scale}: held-out rubric score gain (after - before)", round(gain["rubric"], 4),
               round(gain["outcome"], 4), ratio=ratio, unit="rubric score",
               goal="rubric score rises in every seed", met=rises == args.seeds,
               note="baseline: GRPO on the checker's score, evaluated with the same rubric"),
        figure(f"{scale}: held-out rubric score after training", round(mean("rubric", "after"), 4),
               round(mean("outcome", "after"), 4), unit="rubric score"),
    ], details={"runs": runs, "wall_s": wall, "args": vars(args)},
        note=f"Scaled to fit ~20 min of CPU; measured on a shared, loaded 2-core CPU (load average in machine): {scale}. "
             "The rubric: correct x2 and short answer x1 (checks), uses calc x2 (scripted judge, group mode in "
             "training, independent in evaluation).")
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
