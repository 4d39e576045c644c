"""The tiny VLM learns MiniWoB++ on a CPU: BC warm start on reference demonstrations, then GRPO, held-out pages.

Why: the multimodal path (screenshots as image tokens in sampling, in BC and in the GRPO forward) must be shown
to *learn*, not only to run. This is the text quickstart's recipe with a vision-language model on real web pages:

1. Build the tiny VLM from its config (LLaVA: CLIP tower on 28x28 images, 4 image tokens per screenshot, a
   tokenizer trained here on the suite's observation texts plus ``<image>``, 800 tokens: half the sequence length of
   the default 400 on these pages). Nothing is downloaded.
2. Collect reference-solver demonstrations on the train split of ``tasks/suites/vlm-miniwob.yaml``
   (click-button, click-link, click-test-2; set-of-marks on; the screenshot shrunk to 56x72), with the VLM's
   processor, so the recorded prompts hold the screenshots' image tokens and BC scores with the pixels. The
   solver clicks pixels; each click is rewritten as ``click_mark(n)`` of the numbered box it lands in, an action
   the tiny model can write (a 4-token image cannot place a click to the pixel).
3. Behaviour-clone the VLM on them, then train it with GRPO (``benchmarks/vlm_miniwob.yaml``, success-only reward).
4. Held-out success (test seeds: other words, labels and positions than any training page) before and after
   GRPO, greedy, from evaluation rollouts; plus the share a uniformly random mark would hit on those pages.

Run: ``python benchmarks/vlm_miniwob.py`` (needs Chromium: ``apt-get install chromium`` and playwright).
Prints a JSON summary (also written to ``OUT/summary.json``) with wall times and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentgym.policies import ReferencePolicy  # noqa: E402

SUITE = "vlm-miniwob"
CONFIG = "benchmarks/vlm_miniwob.yaml"
_CLICK = re.compile(r"^\s*click\(\s*([-+0-9.e]+)\s*,\s*([-+0-9.e]+)\s*\)\s*$")


def mark_action(env: Any, action: str) -> str:
    """A ``click(x, y)`` of the screenshot as ``click_mark(n)`` of the smallest mark box holding that point (the
    box ``click_mark`` clicks the centre of); any other action, or a click outside every box, is kept as it is."""
    match = _CLICK.match(action)
    if match is None:
        return action
    px, py = env.to_page(float(match.group(1)), float(match.group(2)))
    # The env's marks of the observation being answered (MiniWoBEnv sets them when it observes the page).
    marks = getattr(env, "_marks", {}).values()
    holding = [m for m in marks if m.box[0] <= px <= m.box[0] + m.box[2] and m.box[1] <= py <= m.box[1] + m.box[3]]
    if not holding:
        return action
    best = min(holding, key=lambda m: m.box[2] * m.box[3])
    return f"click_mark({best.id})"


class MarkReferencePolicy(ReferencePolicy):
    """The env's reference solver, its clicks rewritten into set-of-marks actions (:func:`mark_action`)."""

    name = "reference-marks"

    def begin_episode(self, episode_id: str, env: Any) -> None:
        unwrapped = env.unwrapped
        solve = unwrapped.reference_solver()
        with self._lock:
            self._solvers[episode_id] = lambda observation: mark_action(unwrapped, solve(observation))


def corpus_texts(suite: Any, count: int) -> list[str]:
    """Instructions, observation texts and set-of-marks actions of ``count`` train pages (the tokenizer corpus)."""
    from agentgym.rollout import run_reference_episode

    env = suite.make_env()
    texts: list[str] = []
    try:
        _, info = env.reset(seed=0, options={"task": suite.split("train")[0]})
        texts.append(info["instructions"])
        for i, task in enumerate(suite.split("train")[:count]):
            for turn in run_reference_episode(env, task, seed=i).turns:
                texts.append(turn.observation)
    finally:
        env.close()
    return texts + [f"click_mark({n})" for n in range(1, 13)]


def random_mark_rate(trajectories: list[Any]) -> float:
    """Expected success of clicking one uniformly random mark on each page (the pages are one-click tasks)."""
    rates = []
    for traj in trajectories:
        marks = len(re.findall(r"^\[\d+\] ", traj.turns[0].observation, flags=re.M)) if traj.turns else 0
        rates.append(1.0 / marks if marks else 0.0)
    return sum(rates) / max(len(rates), 1)


def mark_probabilities(model_dir: str | Path, pages: int = 36) -> dict[str, Any]:
    """Why greedy success moves or not: per held-out page, the policy's probability of the correct ``click_mark(n)``
    (the whole action, end-of-turn token included, scored with the trainers' ``sequence_logprobs`` and the page's
    screenshot) and of any mark, split by whether the greedy policy solves the page.

    A page whose correct action has probability ``p`` is missed by all of GRPO's ``g`` samples with probability
    ``(1 - p) ** g``: such a group has no success to learn from.
    """
    import math

    import numpy as np
    import torch

    from agentgym.utils.images import observation_parts
    from agentgym.models.loading import load_model, load_processor
    from agentgym.policies.base import SamplingParams
    from agentgym.models.vision import pixel_inputs
    from agentgym.policies.hf import HFPolicy
    from agentgym.rollout import RolloutConfig, open_conversation
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.batch import sequence_logprobs
    from agentgym.trainers.config import load_config

    config = load_config(CONFIG)
    model, tokenizer = load_model(str(model_dir), config.load_options())
    processor = load_processor(str(model_dir))
    policy = HFPolicy(model.eval(), tokenizer, processor=processor)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    suite = load_suite(SUITE)
    env = suite.make_env()
    rows = []
    try:
        for i, task in enumerate(suite.split(config.eval_split)[:pages]):
            observation, info = env.reset(seed=i, options={"task": task})
            text, _ = observation_parts(observation)
            correct = mark_action(env.unwrapped, env.unwrapped.reference_solver()(text))
            agent = open_conversation(policy, RolloutConfig(system_prompt=config.system_prompt), info, observation)
            prompt, images = list(agent.token_ids), agent.all_images()
            vision = pixel_inputs(processor, images)
            probability = {}
            with torch.no_grad():
                for n in re.findall(r"^\[(\d+)\] ", text, flags=re.M):
                    ids = torch.tensor([prompt + tokenizer.encode(f"click_mark({n})", add_special_tokens=False) + [end]])
                    logp = sequence_logprobs(model, ids, torch.ones_like(ids), vision=vision)[0, len(prompt):]
                    probability[f"click_mark({n})"] = math.exp(float(logp.sum()))
            greedy = policy.generate([prompt], SamplingParams(max_tokens=config.max_tokens_per_turn, temperature=0.0),
                                     images=[images])[0].text.strip()
            rows.append({"marks": len(probability), "p_correct": probability.get(correct, 0.0),
                         "p_any_mark": sum(probability.values()), "solved": greedy == correct})
    finally:
        env.close()
    out: dict[str, Any] = {}
    for name, group in (("greedy_solves", [r for r in rows if r["solved"]]),
                        ("greedy_fails", [r for r in rows if not r["solved"]])):
        if group:
            out[name] = {"pages": len(group), "marks_mean": round(float(np.mean([r["marks"] for r in group])), 2),
                         "p_correct_mean": round(float(np.mean([r["p_correct"] for r in group])), 3),
                         "p_any_mark_mean": round(float(np.mean([r["p_any_mark"] for r in group])), 3),
                         "p_group_of_6_misses": round(float(np.mean([(1 - r["p_correct"]) ** 6 for r in group])), 2)}
    return out


def run(out: Path, *, bc_demos: int, bc_steps: int, bc_batch_size: int, bc_learning_rate: float,
        overrides: dict[str, Any], corpus_pages: int = 24, seed: int = 0) -> dict[str, Any]:
    """The whole recipe; returns the summary (also written to ``out/summary.json``)."""
    import torch

    from agentgym.models.loading import load_model
    from agentgym.models.tiny_vlm import TinyVLMConfig, build_tiny_vlm
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations
    from agentgym.trainers.config import GrpoConfig, load_config
    from agentgym.trainers.grpo import GrpoTrainer

    started = time.perf_counter()
    load_before = os.getloadavg()
    out.mkdir(parents=True, exist_ok=True)
    suite = load_suite(SUITE)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    model_dir = build_tiny_vlm(out / "model", texts=corpus_texts(suite, corpus_pages), config=TinyVLMConfig(vocab_size=800, seed=seed))
    timings["build_s"] = time.perf_counter() - t0

    config = load_config(CONFIG)
    config = GrpoConfig.from_dict({**config.to_dict(), "model": str(out / "bc_model"), "output_dir": str(out / "grpo"),
                                   "seed": seed, **overrides})
    model, tokenizer = load_model(model_dir, config.load_options())
    from agentgym.models.loading import load_processor

    processor = load_processor(model_dir)
    t0 = time.perf_counter()
    demos = collect_demonstrations(suite, "train", bc_demos, tokenizer, seed=seed, system_prompt=config.system_prompt,
                                   processor=processor, policy=MarkReferencePolicy(tokenizer=tokenizer, seed=seed),
                                   max_in_flight=config.max_in_flight)
    timings["demos_s"] = time.perf_counter() - t0
    demo_actions = [turn.action for d in demos for turn in d.turns]
    marked = sum(a.startswith("click_mark(") for a in demo_actions)
    if not demos or marked < len(demo_actions) // 2:
        raise RuntimeError(f"only {marked} of {len(demo_actions)} demonstration actions became click_mark(n); "
                           "the set-of-marks boxes do not hold the solver's clicks.")
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    bc = behaviour_clone(model, tokenizer, demos, steps=bc_steps, learning_rate=bc_learning_rate,
                         batch_size=bc_batch_size, seed=seed, progress=False, processor=processor)
    timings["bc_s"] = time.perf_counter() - t0
    model.save_pretrained(out / "bc_model")
    tokenizer.save_pretrained(out / "bc_model")
    processor.save_pretrained(out / "bc_model")

    t0 = time.perf_counter()
    trainer = GrpoTrainer(config)
    summary = trainer.train()
    timings["grpo_with_evals_s"] = time.perf_counter() - t0

    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    eval_tasks = suite.split(config.eval_split)[: config.eval_tasks]
    ref_specs = [EpisodeSpec(suite.env_id, task=t, seed=i, env_kwargs=dict(suite.env_kwargs))
                 for i, t in enumerate(eval_tasks)]
    from agentgym.policies import SamplingParams

    t0 = time.perf_counter()
    reference = RolloutEngine(MarkReferencePolicy(), RolloutConfig(
        sampling=SamplingParams(max_tokens=1), progress=False, max_in_flight=config.max_in_flight)).run(ref_specs)
    timings["reference_eval_s"] = time.perf_counter() - t0
    before, after = summary["eval_before"]["success_rate"], summary["eval_after"]["success_rate"]
    result = {
        "suite": SUITE, "config": CONFIG, "train_tasks": len(suite.split("train")), "eval_tasks": len(eval_tasks),
        "bc": {"demonstrations": len(demos), "actions": len(demo_actions), "click_mark_actions": marked,
               "steps": bc_steps, "batch_size": bc_batch_size, "learning_rate": bc_learning_rate, **bc},
        "grpo": {k: summary["config"][k] for k in ("steps", "tasks_per_step", "group_size", "learning_rate",
                                                  "temperature", "max_tokens_per_turn")},
        "held_out_success": {"reference_marks": sum(bool(t.outcome.get("success")) for t in reference) / len(reference),
                             "random_mark": random_mark_rate(reference), "bc": before, "bc_grpo": after},
        "gain_points": round(100 * (after - before), 1),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "wall_s": round(time.perf_counter() - started, 1),
        "load_average_start": [round(v, 2) for v in load_before],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "seed": seed,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/vlm_miniwob", help="output directory")
    parser.add_argument("--bc-demos", type=int, default=90)
    parser.add_argument("--bc-steps", type=int, default=100)
    parser.add_argument("--bc-batch-size", type=int, default=16)
    parser.add_argument("--bc-learning-rate", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the config's)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out pages (default: the config's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--diagnose", metavar="MODEL_DIR",
                        help="instead of training: per held-out page, the probability MODEL_DIR gives the correct mark")
    args = parser.parse_args(argv)
    if args.diagnose:
        print(json.dumps(mark_probabilities(args.diagnose, args.eval_tasks or 36), indent=2))
        return 0
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("agentgym.trainers").setLevel(logging.INFO)
    overrides = {k: v for k, v in (("steps", args.steps), ("eval_tasks", args.eval_tasks)) if v is not None}
    result = run(Path(args.out), bc_demos=args.bc_demos, bc_steps=args.bc_steps, bc_batch_size=args.bc_batch_size,
                 bc_learning_rate=args.bc_learning_rate, overrides=overrides, seed=args.seed)
    print(json.dumps(result, indent=2))
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        from _results import figure, write_results

        held = result["held_out_success"]
        what = (f"tiny VLM on {SUITE} ({result['eval_tasks']} held-out pages, greedy), BC on "
                f"{result['bc']['demonstrations']} demonstrations then {result['grpo']['steps']} GRPO steps")
        write_results("vlm_miniwob", [
            figure(f"{what}: held-out success after BC + GRPO; baseline: after BC alone", held["bc_grpo"], held["bc"],
                   unit="success rate", note=f"gain {result['gain_points']:+.1f} points"),
            figure(f"{what}: held-out success after BC + GRPO; baseline: a uniformly random mark", held["bc_grpo"],
                   held["random_mark"], unit="success rate",
                   note=f"the reference solver's marks succeed on {held['reference_marks']:.3f}"),
        ], details=result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
