"""The GRPO update without a separate no-grad pass for pi_old, against one with it, side by side, in two settings.

* One optimizer step on fresh samples (``ppo_epochs: 1``, ``mini_batches: 1``, no off-policy correction, the
  default): every micro-batch's forward runs on the weights the samples came from, so the PPO ratio's pi_old is
  that forward's own output, detached (``fused``).
* Several optimizer steps (``mini_batches: 4``, as the noise-sized studies run): pi_old is the sampler's recorded
  log-probs once the first mini-batch's own forward has confirmed them (``sampler``); here the batch's sampler
  log-probs are the model's own, as float32 HF sampling records them.

The baseline computes pi_old first in a separate no-grad pass over the whole batch, which the trainer still does
where it is needed (stale samples, dropout, a sampler whose log-probs are not the model's). Both paths run the real
``GrpoTrainer._update`` on one synthetic batch shaped
like multi-turn agent data (``benchmarks/train_step.py``'s lengths, turns and loss mask) and the studies' tiny model
(``TinyModelConfig()``: hidden 128, 4 layers), packing on as the studies run it. Before timing, one update of each
from the same weights must give the same parameters (within 1e-6) and the same loss; times are the best of
interleaved updates (A B B A ...) after a warm-up of each, so load from other processes hits both alike.

Run: python benchmarks/update_pi_old.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402 - the synthetic multi-turn batch

import agentgym.trainers.grpo as grpo_module  # noqa: E402
from agentgym.trainers.config import GrpoConfig  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402

PATHS = ("fused", "separate")
"""``fused``: no no-grad pass (pi_old off the update's own forward with one optimizer step, else the sampler's log-probs
checked by the first mini-batch); ``separate``: a no-grad pass over the batch first."""
SETTINGS = {1: "pi_old off the update's own forward", 4: "pi_old from the sampler's log-probs, checked"}
"""Mini-batches per update -> what the ``fused`` path does there."""

original = grpo_module.same_in_train_and_eval
"""The trainer's dropout check; the baseline path replaces it with one that always says "dropout" for one update."""


def make_trainer(model_dir: Path, out: Path, micro_batch: int, mini_batches: int) -> GrpoTrainer:
    """A GRPO trainer on the tiny model with the studies' update settings (packing, ``mini_batches`` optimizer
    steps)."""
    config = GrpoConfig(model=str(model_dir), suite="babyai-goto", eval_split="test", output_dir=str(out), steps=1,
                        tasks_per_step=mini_batches, group_size=2, eval_every=0, system_prompt="",
                        tensorboard=False, micro_batch_size=micro_batch, packing=True, max_context_tokens=1024,
                        seed=0, mini_batches=mini_batches)  # tasks: the config refuses more mini-batches than rollouts
    trainer = GrpoTrainer(config)
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.reference = None
    return trainer


def one_update(trainer: GrpoTrainer, batch: Any, state: dict[str, torch.Tensor], path: str) -> tuple[float, dict, torch.Tensor]:
    """``(seconds, stats, parameters after)`` of one ``_update`` from ``state`` along ``path``."""
    grpo_module.same_in_train_and_eval = (lambda model: False) if path == "separate" else original
    batch.old_logprobs = None  # what the previous update left
    trainer.model.load_state_dict(state)
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-4)
    started = time.perf_counter()
    stats = trainer._update(batch, optimizer, trainer._schedule(optimizer), 0)
    seconds = time.perf_counter() - started
    grpo_module.same_in_train_and_eval = original
    return seconds, stats, torch.cat([p.detach().flatten() for p in trainer.model.parameters()])



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 sequences and one timed update a path (seconds)")
    args = parser.parse_args()
    from _results import figure, write_results

    from agentgym.models import TinyModelConfig, default_corpus
    from agentgym.models.tiny import build_tiny_model

    setup = train_step.Setup("tiny", 16 if args.quick else 64, 64, 1024, 200, 0.9, 8, 1 if args.quick else 4)
    load_before = os.getloadavg()[0]
    figures, details = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", texts=default_corpus(), config=TinyModelConfig())
        for mini_batches, fused_does in SETTINGS.items():
            trainer = make_trainer(model_dir, Path(tmp) / f"run{mini_batches}", setup.micro_batch, mini_batches)
            if not grpo_module.same_in_train_and_eval(trainer.model):
                raise SystemExit("the tiny model has dropout: the trainer would take the separate pass on both paths")
            batch = train_step.synthetic_batch(setup, int(trainer.model.config.vocab_size))
            with torch.no_grad():  # what float32 HF sampling records: the model's own log-probs
                batch.sampler_logprobs = grpo_module._no_grad_logprobs(
                    trainer._forward_logprobs, trainer.model, batch, setup.micro_batch,
                    int(batch.input_ids.shape[1])) * batch.loss_mask
            state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
            checks = {path: one_update(trainer, batch, state, path) for path in PATHS}  # also the warm-up
            gap = float((checks["fused"][2] - checks["separate"][2]).abs().max())
            loss_gap = abs(checks["fused"][1]["train/loss"] - checks["separate"][1]["train/loss"])
            if gap > 1e-6 or loss_gap > 1e-6:
                raise SystemExit(f"mini_batches {mini_batches}: the two paths disagree: parameters by {gap:.2e}, "
                                 f"loss by {loss_gap:.2e}")
            if mini_batches > 1 and checks["fused"][1].get("train/pi_old_from_sampler") != 1.0:
                raise SystemExit("the update did not take the sampler's log-probs: the benchmark measures nothing")
            print(f"mini_batches {mini_batches}: the same update from the same weights (max |dparameter| {gap:.1e}, "
                  f"|dloss| {loss_gap:.1e})")
            seconds: dict[str, list[float]] = {path: [] for path in PATHS}
            for i in range(setup.timed_updates):
                for path in PATHS if i % 2 == 0 else PATHS[::-1]:
                    seconds[path].append(one_update(trainer, batch, state, path)[0])
            tokens, trained = int(batch.attention_mask.sum()), int(batch.loss_mask.sum())
            best = {path: min(values) for path, values in seconds.items()}
            ratio = best["separate"] / best["fused"]
            for path in PATHS:
                print(f"  {path:9s} best {best[path]:.2f} s ({trained / best[path]:,.0f} trained tokens/s; every update "
                      f"{', '.join(f'{s:.2f}' for s in seconds[path])} s)")
            print(f"  no pass / separate pass: {ratio:.2f}x ({tokens:,} tokens in {setup.sequences} sequences)")
            workload = (f"one GrpoTrainer._update, tiny model, {setup.sequences} sequences of {setup.min_len}-"
                        f"{setup.max_len} tokens ({tokens:,} tokens), packing, mini_batches {mini_batches}, "
                        f"{torch.get_num_threads()} torch threads")
            figures.append(figure(f"{workload}: {fused_does}; baseline: a separate no-grad pass",
                                  trained / best["fused"], trained / best["separate"], unit="trained tokens/s",
                                  ratio=ratio, note=f"same parameters after the update (max |d| {gap:.1e})"))
            details[f"mini_batches_{mini_batches}"] = {"seconds": seconds, "tokens": tokens, "trained_tokens": trained,
                                                       "max_parameter_gap": gap, "loss_gap": loss_gap}
    print(f"{torch.get_num_threads()} torch threads, load {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    write_results("update_pi_old", figures, note="--quick: 16 sequences, a smoke test" if args.quick else None,
                  details=details)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
