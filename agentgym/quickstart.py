"""``make quickstart``: the main job on the embedded default, offline, on a CPU.

Steps: build the built-in tiny model (a BPE tokenizer trained locally on the calculator suite's
instructions and reference demonstrations, and a from-config Llama model), evaluate the reference solver
and the tiny model on the held-out split of ``games-calc``, and print both tables. Training (BC warm start
+ GRPO) plugs in between build and eval once the trainer lands.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agentgym.errors import ConfigError

__all__ = ["main"]


def demonstration_texts(suite_name: str, limit: int) -> list[str]:
    """Instructions, observations and reference actions of ``limit`` training tasks (tokenizer corpus)."""
    from agentgym.rollout import run_reference_episode
    from agentgym.suite import load_suite

    suite = load_suite(suite_name)
    env = suite.make_env()
    texts: list[str] = []
    try:
        _, info = env.reset(seed=0)
        texts.append(info["instructions"])
        for i, task in enumerate(suite.train[:limit]):
            traj = run_reference_episode(env, task, seed=i)
            for turn in traj.turns:
                texts += [turn.observation, turn.action]
    finally:
        env.close()
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="runs/quickstart", help="output directory")
    parser.add_argument("--suite", default="games-calc")
    parser.add_argument("--eval-limit", type=int, default=100, help="held-out tasks to evaluate")
    args = parser.parse_args(argv)
    if args.eval_limit < 1:
        raise ConfigError("--eval-limit must be >= 1.")
    from rich.console import Console

    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies import ReferencePolicy, SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.report import render_summary_table
    from agentgym.rollout import (
        RolloutConfig,
        RolloutEngine,
        episodes_for_suite,
        summarize,
    )
    from agentgym.storage import TrajectoryWriter
    from agentgym.suite import load_suite

    console = Console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    console.print(f"[bold]1/3[/bold] building the tiny model in {out / 'model'} (tokenizer trained on {args.suite})")
    model_dir = build_tiny_model(out / "model", texts=demonstration_texts(args.suite, 500), config=TinyModelConfig())
    suite = load_suite(args.suite)
    specs = episodes_for_suite(suite, "test", limit=args.eval_limit)
    results = {}
    for step, (label, policy) in enumerate(
        [("reference solver", ReferencePolicy()), ("tiny model (untrained)", HFPolicy.from_pretrained(model_dir))], 2
    ):
        console.print(f"[bold]{step}/3[/bold] evaluating the {label} on {len(specs)} held-out tasks")
        config = RolloutConfig(sampling=SamplingParams(max_tokens=48, temperature=0.0), max_in_flight=128,
                               system_prompt="" if isinstance(policy, HFPolicy) else None)
        started = time.perf_counter()
        with TrajectoryWriter(out / f"eval-{step}.jsonl") as writer:
            trajectories = RolloutEngine(policy, config).run(specs, writer=writer)
        summary = summarize(trajectories)
        summary["wall_s"] = time.perf_counter() - started
        results[label] = summary
        console.print(render_summary_table(summary, title=f"{suite.name} [test]: {label}"))
    (out / "summary.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    console.print(f"done in {time.perf_counter() - t0:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
