"""``make quickstart``: the main job on the embedded default, offline, on a CPU, in a few minutes.

1. Build the built-in tiny model: a BPE tokenizer trained locally on the calculator suite's instructions
   and reference demonstrations, and a from-config Llama model (nothing is downloaded).
2. Train it with ``configs/quickstart_calc.yaml``: a behaviour-cloning warm start on imperfect
   demonstrations (half skip the calculator and answer wrongly), then GRPO with a success-only reward.
3. Print held-out success (questions never seen in training) for the reference solver, the BC warm start
   and the GRPO-trained model, measured by evaluation rollouts, not read off training rewards.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from agentgym.errors import ConfigError
from agentgym.trainers.interrupt import TrainingInterrupted
from agentgym.trainers.tiny_model import demonstration_texts
from agentgym.utils.cpu_threads import apply_cpu_threads
from agentgym.utils.log_setup import setup_logging

__all__ = ["demonstration_texts", "main"]  # demonstration_texts: the tokenizer corpus, shared with ``model: tiny:``


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/quickstart", help="output directory")
    parser.add_argument("--config", default="configs/quickstart_calc.yaml", help="trainer config to run")
    parser.add_argument("--force", action="store_true",
                        help="resume the earlier run in --out even though its config differs (the change is recorded "
                             "in its resume_changes.jsonl); without it such a resume is refused with the differences")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies import ReferencePolicy, SamplingParams
    from agentgym.cli.report import format_metric
    from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite, summarize
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.config import GrpoConfig, load_config
    from agentgym.trainers.grpo import GrpoTrainer

    if not Path(args.config).is_file():
        raise ConfigError(f"{args.config} not found: run the quickstart from the repository root (make quickstart).")
    setup_logging(logging.WARNING, agentgym_level=logging.WARNING)
    logging.getLogger("agentgym.trainers").setLevel(logging.INFO)
    logging.getLogger("agentgym.utils.cpu_threads").setLevel(logging.INFO)  # says how many threads it chose, why
    console = Console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    config = load_config(args.config)
    config = GrpoConfig.from_dict({**config.to_dict(), "model": str(out / "model"), "output_dir": str(out / "grpo")})

    # the thread count for this machine, chosen once before any torch work: building the model, the BC warm start,
    # sampling, training and evaluation all run in this process with it (not only the training updates)
    apply_cpu_threads(config.cpu_threads)
    console.print(f"[bold]1/3[/bold] building the tiny model in {out / 'model'} (tokenizer trained on {config.suite})")
    build_tiny_model(out / "model", texts=demonstration_texts(config.suite, 500), config=TinyModelConfig())

    console.print(f"[bold]2/3[/bold] training: BC warm start ({config.bc_demos} demonstrations, "
                  f"{config.bc_shortcut_fraction:.0%} of them skip the tool), then {config.steps} GRPO steps "
                  f"of {config.tasks_per_step} tasks x {config.group_size} rollouts")
    try:
        summary = GrpoTrainer(config).train(force_resume=args.force)
    except TrainingInterrupted as stopped:
        console.print(f"{escape(str(stopped))}\nresume with: make quickstart (the run continues from its last "
                      f"checkpoint; delete {escape(str(out))} to start over)")
        return 130
    if "resumed_from" in summary:
        console.print(f"resumed the earlier run in {escape(config.output_dir)} from {escape(summary['resumed_from'])} "
                      f"(delete {escape(str(out))} to train from scratch)")

    console.print(f"[bold]3/3[/bold] held-out evaluation ({config.eval_tasks} test questions never seen in training)")
    suite = load_suite(config.suite)
    specs = episodes_for_suite(suite, config.eval_split, limit=config.eval_tasks)
    reference = summarize(RolloutEngine(ReferencePolicy(), RolloutConfig(sampling=SamplingParams(max_tokens=1))).run(specs))
    before = summary.get("eval_before")  # absent only when resuming a run whose checkpoints predate carrying it
    rows = [("reference solver", reference), *([("BC warm start", before)] if before else []),
            ("BC + GRPO", summary["eval_after"])]
    table = Table(title=escape(f"{suite.name} [{config.eval_split}]: held-out success"))
    for column in ("policy", "success", "turns", "tool calls", "action tokens"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for label, s in rows:
        table.add_row(label, f"{s['success_rate']:.2f}", f"{s['mean_turns']:.2f}", f"{s['mean_tool_calls']:.2f}",
                      format_metric(s["mean_action_tokens"], "{:.1f}"))
    console.print(table)
    if before:
        gain = summary["eval_after"]["success_rate"] - before["success_rate"]
        console.print(f"GRPO changed held-out success by {gain * 100:+.0f} points "
                      f"({before['success_rate']:.2f} -> {summary['eval_after']['success_rate']:.2f}).")
    (out / "quickstart.json").write_text(json.dumps({label: s for label, s in rows}, indent=2), encoding="utf-8")
    console.print(f"learning curve: {out / 'grpo' / 'learning_curve.png'}; metrics: {out / 'grpo' / 'metrics.jsonl'}; "
                  f"trained model: {out / 'grpo' / 'model'}; took {time.perf_counter() - started:.0f} s")
    return 0


def _cli() -> int:
    """``python -m agentgym.cli.quickstart``: a refused setting (a changed config over an earlier run, a missing
    config file) ends with its message and status 2, not a traceback."""
    import sys

    from agentgym.errors import AgentGymError

    try:
        return main()
    except AgentGymError as exc:
        sys.stderr.write(f"quickstart: error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(_cli())
