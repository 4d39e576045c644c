"""Training-step throughput: right padding in trajectory order (the baseline) against padding longest-first (what
the trainer does), with and without the padding mask in attention, and sequence packing, side by side in one run.

One GRPO-style update as ``GrpoTrainer._update`` does it (forward in float32, per-token log-probs,
clipped policy loss with clip-higher, token-mean aggregation with the exact global token count,
backward per micro-batch, gradient clipping, one AdamW step) on CPU, for two models in four setups:

* ``tiny``: the built-in tiny model (``TinyModelConfig()`` defaults: Llama, hidden 128, 4 layers, the
  512-token local tokenizer);
* ``tiny-games``: the tiny model on long rows (640-1024 tokens, most near 900), the shape of multi-turn game
  episodes such as Sokoban's 15 turns of board and move, where attention is a larger share of the work;
* ``tiny-long``: the tiny model on rows of 1,000-1,536 tokens, most near 1,300: BabyAI's episodes at the studies'
  1,536-token context, where attention costs more than the linear layers;
* ``100M``: a from-config Llama (hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000, tied
  embeddings), the smallest size people fine-tune agents with.

The batch is synthetic but shaped like multi-turn agent data: sequence lengths lognormal and clipped
(long-tailed: many short episodes, a few long ones), each sequence a prompt followed by several
action/observation turns, loss mask 1 on the action tokens (about 40% of all tokens). Advantages and
old log-probs are synthetic (ratios near 1); they do not change the cost.

Methods, same batch, same micro-batch token budget ``B x max_len``:

* ``padded`` (baseline): ``build_batch`` + ``TrainingBatch.micro_batches(B)`` in trajectory order, i.e. right
  padding to the longest sequence of each micro-batch, as the trainer did before it sorted rows.
* ``sorted``: the same, rows ordered longest first (:func:`agentgym.trainers.grpo.longest_first`) so each
  micro-batch holds sequences of like length, exactly as ``GrpoTrainer._update`` does now. Like every
  right-padded forward of :func:`~agentgym.trainers.batch.sequence_logprobs`, attention gets no padding mask
  (causal attention already hides the padding after each real token), so SDPA runs its causal kernel.
* ``sorted-masked``: the same rows with their padding mask passed to attention (the baseline of the line above):
  the kernel then computes every block of each ``L x L`` score matrix, the ones above the diagonal included.
* ``sorted-bf16``: ``sorted`` under ``mixed_precision: bf16`` (:mod:`agentgym.trainers.precision`): the forward
  under ``torch.autocast`` in bfloat16, weights, gradients and AdamW in float32. Its loss differs from ``sorted``'s
  by bfloat16 rounding (printed); the learning studies run float32.
* ``packed``: first-fit-decreasing packing into rows of ``max_len`` tokens
  (:func:`agentgym.trainers.packing.pack_sequences`), ``B`` rows per micro-batch, positions restarting at
  0 per sequence and a block-diagonal causal 4-D float mask. Packing time is inside the timed update.

Before timing, the run checks on the tiny model that packed log-probs, the loss and the gradients equal
the padded ones (log-probs within 1e-4); it exits with an error if they do not. Times come from one
subprocess per model that interleaves the two methods (padded, packed, packed, padded, ...) after a
warm-up update of each, and report the fastest update: other processes on a shared machine only ever
add time, and interleaving spreads their load over both methods. Peak memory comes from a fresh
subprocess per (model, method) running two updates, so each ``ru_maxrss`` is its own.

Run: python benchmarks/train_step.py [--quick] [--only tiny|tiny-games|tiny-long|100M]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from agentgym.models.geometry import rope_position_ids
from agentgym.trainers import algorithms as alg
from agentgym.trainers.batch import TrainingBatch, build_batch, sequence_logprobs
from agentgym.trainers.grpo import longest_first
from agentgym.trainers.precision import forward_precision
from agentgym.trainers.logprobs import token_logprobs
from agentgym.trainers.packing import pack_sequences, packed_inputs, packed_sequence_logprobs, unpack_logprobs
from agentgym.trajectory import TokenView

METHODS = ("padded", "sorted", "sorted-masked", "sorted-bf16", "packed")


@dataclass(frozen=True)
class Setup:
    """One model and its synthetic batch.

    Attributes:
        name: Row label.
        sequences: Trajectories in the update (one GRPO mini-batch).
        min_len / max_len: Clip range of the lengths; ``max_len`` is also the packed row width.
        median_len / sigma: Lognormal parameters of the lengths before clipping.
        micro_batch: Sequences (padded) or rows (packed) per micro-batch.
        timed_updates: Timed updates per method after one untimed warm-up update each.
    """

    name: str
    sequences: int
    min_len: int
    max_len: int
    median_len: float
    sigma: float
    micro_batch: int
    timed_updates: int


def setups(quick: bool) -> dict[str, Setup]:
    if quick:
        return {"tiny": Setup("tiny", 24, 64, 1024, 200, 0.9, 8, 2),
                "tiny-games": Setup("tiny-games", 16, 640, 1024, 900, 0.15, 8, 2),
                "tiny-long": Setup("tiny-long", 16, 1000, 1536, 1300, 0.12, 8, 2),
                "100M": Setup("100M", 6, 32, 256, 80, 0.8, 4, 1)}
    return {"tiny": Setup("tiny", 64, 64, 1024, 200, 0.9, 8, 4),
            "tiny-games": Setup("tiny-games", 32, 640, 1024, 900, 0.15, 8, 2),
            "tiny-long": Setup("tiny-long", 32, 1000, 1536, 1300, 0.12, 8, 2),
            "100M": Setup("100M", 12, 32, 512, 110, 0.8, 4, 2)}


# ---- model and data ------------------------------------------------------------------------------
def make_model(name: str) -> tuple[Any, int]:
    """(model in train mode, vocabulary size); weights seeded, dropout-free."""
    import transformers

    from agentgym.models import TinyModelConfig, create_model, default_corpus, train_tokenizer

    if name.startswith("tiny"):
        tokenizer = train_tokenizer(default_corpus(), TinyModelConfig().vocab_size)
        model = create_model(tokenizer, TinyModelConfig())
    else:
        config = transformers.LlamaConfig(vocab_size=32000, hidden_size=768, num_hidden_layers=12,
                                          num_attention_heads=12, num_key_value_heads=12, intermediate_size=2048,
                                          max_position_embeddings=2048, tie_word_embeddings=True,
                                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(config)
    return model.float().train(), int(model.config.vocab_size)


class _SyntheticTrajectory:
    """Just enough of a :class:`~agentgym.trajectory.Trajectory` for ``build_batch``: a token view, no images."""

    prompt_images: tuple[Any, ...] = ()

    def __init__(self, view: TokenView) -> None:
        self._view = view

    num_segments = 1

    def token_view(self) -> TokenView:
        return self._view

    def token_views(self) -> list[TokenView]:
        return [self._view]


def synthetic_views(setup: Setup, vocab: int, seed: int = 0) -> list[TokenView]:
    """Multi-turn token views: prompt, then 2-6 turns of (action: mask 1, observation: mask 0).

    Lengths are lognormal(median, sigma) clipped to [min_len, max_len]; the prompt takes ~15% and each
    turn gives its action 35-60% of the turn's tokens, so ~40% of all tokens are trained.
    """
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn(setup.sequences, generator=g)
    lengths = (setup.median_len * torch.exp(setup.sigma * normal)).round().clamp(setup.min_len, setup.max_len)
    views = []
    log_v = math.log(vocab)
    for length in lengths.long().tolist():
        turns = int(torch.randint(2, 7, (1,), generator=g))
        prompt = max(4, int(0.15 * length))
        body = length - prompt
        cuts = sorted(torch.randint(1, body, (turns - 1,), generator=g).tolist()) if body > turns else []
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, body]) if b > a]
        mask = [0] * prompt
        for size in sizes:
            share = 0.35 + 0.25 * float(torch.rand((), generator=g))
            action = max(1, round(share * size))
            mask += [1] * action + [0] * (size - action)
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        logps = [(-log_v + 0.1 * float(x)) if m else 0.0 for m, x in zip(mask, torch.randn(length, generator=g))]
        views.append(TokenView(tuple(ids), tuple(mask), tuple(logps), tuple([0] * length)))
    return views


def synthetic_batch(setup: Setup, vocab: int, seed: int = 0) -> TrainingBatch:
    views = synthetic_views(setup, vocab, seed)
    advantages = torch.randn(len(views), generator=torch.Generator().manual_seed(seed + 1))
    batch = build_batch([_SyntheticTrajectory(v) for v in views], advantages, [True] * len(views), pad_id=0)
    batch.old_logprobs = batch.sampler_logprobs.clone()
    return batch


# ---- the update ----------------------------------------------------------------------------------
def _loss(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, tokens: float) -> torch.Tensor:
    per_token, _ = alg.clipped_policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.28, loss_mask=mask)
    return alg.aggregate_loss(per_token, mask, mode="token-mean", global_token_count=max(tokens, 1.0))


def padded_micro_batches(batch: TrainingBatch, setup: Setup) -> Iterator[TrainingBatch]:
    return batch.micro_batches(setup.micro_batch)


def packed_micro_batches(batch: TrainingBatch, setup: Setup) -> Iterator[dict[str, torch.Tensor]]:
    """Packed micro-batches, built lazily (one 4-D mask alive at a time, as padded micro-batches are)."""
    bins = pack_sequences(batch.attention_mask.sum(dim=1).tolist(), setup.max_len)
    for i in range(0, len(bins), setup.micro_batch):
        yield packed_inputs(batch, bins[i:i + setup.micro_batch])


def masked_logprobs(model: Any, mb: TrainingBatch) -> torch.Tensor:
    """The forward of ``sequence_logprobs`` with the padding mask passed on to attention, as it is for left-padded
    rows: the baseline of the mask-free causal forward."""
    position_ids = rope_position_ids(model, mb.input_ids, mb.attention_mask)
    return token_logprobs(model, mb.input_ids, attention_mask=mb.attention_mask, position_ids=position_ids)


def update(model: Any, optimizer: torch.optim.Optimizer, batch: TrainingBatch, setup: Setup, method: str) -> dict[str, float]:
    """One optimizer step over the whole batch, micro-batch by micro-batch; packing time included."""
    start, cpu = time.perf_counter(), time.process_time()
    tokens, _ = alg.loss_denominators(batch.loss_mask)
    optimizer.zero_grad(set_to_none=True)
    total, positions = 0.0, 0
    if method in ("padded", "sorted", "sorted-masked", "sorted-bf16"):
        ordered = batch.select(longest_first(batch, torch.arange(len(batch)))) if method != "padded" else batch
        for mb in padded_micro_batches(ordered, setup):
            with forward_precision("cpu", "bf16" if method == "sorted-bf16" else "no"):
                logp = (masked_logprobs(model, mb) if method == "sorted-masked"
                        else sequence_logprobs(model, mb.input_ids, mb.attention_mask))
            loss = _loss(logp, mb.old_logprobs, mb.advantages, mb.loss_mask, tokens)
            loss.backward()
            total += float(loss.detach())
            positions += mb.input_ids.numel()
    else:
        for inputs in packed_micro_batches(batch, setup):
            logp = packed_sequence_logprobs(model, inputs)
            loss = _loss(logp, inputs["old_logprobs"], inputs["advantages"], inputs["loss_mask"], tokens)
            loss.backward()
            total += float(loss.detach())
            positions += inputs["input_ids"].numel()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "loss": total,
            "positions": positions}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _build(name: str, quick: bool) -> tuple[Setup, Any, TrainingBatch, torch.optim.Optimizer]:
    setup = setups(quick)[name]
    torch.manual_seed(0)
    model, vocab = make_model(name)
    batch = synthetic_batch(setup, vocab)
    return setup, model, batch, torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)


def memory_worker(name: str, method: str, quick: bool) -> dict[str, Any]:
    """Fresh process, one method: RSS after setup and peak RSS over two updates (AdamW state included)."""
    setup, model, batch, optimizer = _build(name, quick)
    rss_setup = _rss_mb()
    runs = [update(model, optimizer, batch, setup, method) for _ in range(2)]
    return {"rss_setup_mb": rss_setup, "rss_peak_mb": _rss_mb(), "positions": runs[0]["positions"]}


def timing_worker(name: str, quick: bool) -> dict[str, Any]:
    """Fresh process, both methods interleaved (A B A B ...) so that load from other processes hits both alike."""
    setup, model, batch, optimizer = _build(name, quick)
    for method in METHODS:  # warm-up: AdamW state, every shape seen once
        update(model, optimizer, batch, setup, method)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for i in range(setup.timed_updates):
        for method in METHODS if i % 2 == 0 else METHODS[::-1]:
            runs[method].append(update(model, optimizer, batch, setup, method))
    return {
        "parameters": sum(p.numel() for p in model.parameters()), "sequences": len(batch),
        "tokens": int(batch.attention_mask.sum()), "trained_tokens": int(batch.loss_mask.sum()),
        "threads": torch.get_num_threads(),
        "methods": {m: {"seconds": min(r["seconds"] for r in rs), "cpu_seconds": min(r["cpu_seconds"] for r in rs),
                        "all_seconds": [r["seconds"] for r in rs], "positions": rs[0]["positions"],
                        "loss": rs[0]["loss"]}
                    for m, rs in runs.items()},
    }


# ---- correctness ---------------------------------------------------------------------------------
def check_packing(name: str = "tiny", sequences: int = 16, max_len: int = 512, tolerance: float = 1e-4) -> dict[str, float]:
    """Packed log-probs, loss and gradients against the padded ones; raises AssertionError when they differ."""
    setup = Setup(name, sequences, 16, max_len, max_len / 4, 0.9, 3, 1)
    torch.manual_seed(0)
    model, vocab = make_model(name)
    model.eval()
    batch = synthetic_batch(setup, vocab, seed=7)
    n, width = batch.input_ids.shape
    real = batch.attention_mask.bool()
    tokens, _ = alg.loss_denominators(batch.loss_mask)

    model.zero_grad()
    padded_lp = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    padded_loss = _loss(padded_lp, batch.old_logprobs, batch.advantages, batch.loss_mask, tokens)
    padded_loss.backward()
    padded_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    packed_lp = torch.zeros(n, width)
    packed_loss = torch.zeros(())
    for inputs in packed_micro_batches(batch, setup):
        lp = packed_sequence_logprobs(model, inputs)
        loss = _loss(lp, inputs["old_logprobs"], inputs["advantages"], inputs["loss_mask"], tokens)
        loss.backward()
        packed_loss += loss.detach()
        packed_lp += unpack_logprobs(lp.detach(), inputs, n, width)
    lp_err = float((packed_lp - padded_lp.detach()).abs()[real].max())
    loss_err = abs(float(packed_loss) - float(padded_loss.detach()))
    grad_err = max(float((p.grad - g).abs().max() / g.abs().max().clamp_min(1e-12))
                   for p, g in zip(model.parameters(), padded_grads))
    if not (lp_err <= tolerance and loss_err <= tolerance and grad_err <= 1e-3):
        raise AssertionError(f"packing changes the result on {name}: max |dlogp| = {lp_err:.3g} (tolerance "
                             f"{tolerance}), |dloss| = {loss_err:.3g}, max relative |dgrad| = {grad_err:.3g}")
    return {"logp": lp_err, "loss": loss_err, "grad": grad_err}


# ---- driver --------------------------------------------------------------------------------------
def run_worker(*args: str, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *args] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"worker {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller batches (a smoke test, about two minutes)")
    parser.add_argument("--only", choices=("tiny", "tiny-games", "tiny-long", "100M"), help="run one setup only")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, kind, *method = args.worker
        out = timing_worker(name, args.quick) if kind == "time" else memory_worker(name, method[0], args.quick)
        print(json.dumps(out))
        return

    from _results import figure, write_results

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    errors = check_packing()
    print(f"Correctness (tiny model, 16 sequences): packed vs padded max |dlogp| {errors['logp']:.2e}, "
          f"|dloss| {errors['loss']:.2e}, max relative |dgrad| {errors['grad']:.2e}: OK")
    names = [args.only] if args.only else ["tiny", "tiny-games", "tiny-long", "100M"]
    results = {}
    for name in names:
        timing = run_worker(name, "time", quick=args.quick)
        for method in METHODS:
            memory = run_worker(name, "memory", method, quick=args.quick)
            if memory["positions"] != timing["methods"][method]["positions"]:
                raise SystemExit(f"{name}/{method}: the memory and timing runs computed different batches")
            results[(name, method)] = {**{k: v for k, v in timing.items() if k != "methods"},
                                       **timing["methods"][method], **memory}
    load_after = os.getloadavg()[0]

    first = results[(names[0], "padded")]
    print(f"\nOne GRPO update (forward + clipped loss + backward + AdamW) on CPU, {first['threads']} torch threads, "
          f"{os.cpu_count()} cores; time: best of the updates after a warm-up, methods interleaved in one process; memory: a fresh process per row")
    header = ("config", "method", "sequences", "trained tok/s", "total tok/s", "padding", "s/update",
              "CPU s/update", "peak RSS MB", "RSS over setup MB")
    rows = []
    for (name, method), r in results.items():
        rows.append((f"{name} ({r['parameters'] / 1e6:.2f}M)", method, str(r["sequences"]),
                     f"{r['trained_tokens'] / r['seconds']:,.0f}", f"{r['tokens'] / r['seconds']:,.0f}",
                     f"{1 - r['tokens'] / r['positions']:.0%}", f"{r['seconds']:.2f}", f"{r['cpu_seconds']:.2f}",
                     f"{r['rss_peak_mb']:,.0f}", f"{r['rss_peak_mb'] - r['rss_setup_mb']:,.0f}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  " + " | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  " + "-+-".join("-" * w for w in widths))
    for row in rows:
        print("  " + " | ".join(c.ljust(w) for c, w in zip(row, widths)))

    print()
    figures = []
    for name in names:
        s = setups(args.quick)[name]
        pad, pack = results[(name, "padded")], results[(name, "packed")]
        speed = pad["seconds"] / pack["seconds"]
        cpu = pad["cpu_seconds"] / pack["cpu_seconds"]
        memory = pack["rss_peak_mb"] / pad["rss_peak_mb"]
        extra = (pack["rss_peak_mb"] - pack["rss_setup_mb"]) / (pad["rss_peak_mb"] - pad["rss_setup_mb"])
        print(f"  {name}: {pad['parameters']:,} parameters; {pad['sequences']} sequences of {s.min_len}..{s.max_len} "
              f"tokens ({pad['tokens']:,} tokens, {pad['trained_tokens'] / pad['tokens']:.0%} trained); "
              f"micro-batch {s.micro_batch} sequences (padded) or {s.micro_batch} rows of {s.max_len} tokens (packed)")
        print(f"    packed/padded: throughput {speed:.2f}x (wall), {cpu:.2f}x (CPU time); positions computed "
              f"{pack['positions'] / pad['positions']:.2f}x; peak RSS {memory:.2f}x ({extra:.2f}x over setup)")
        ordered = results[(name, "sorted")]
        print(f"    sorted/padded (longest first, what the trainer does): throughput "
              f"{pad['seconds'] / ordered['seconds']:.2f}x (wall), {pad['cpu_seconds'] / ordered['cpu_seconds']:.2f}x "
              f"(CPU time); positions computed {ordered['positions'] / pad['positions']:.2f}x")
        masked = results[(name, "sorted-masked")]
        mixed = results[(name, "sorted-bf16")]
        print(f"    sorted in float32 / under bf16 autocast (mixed_precision: bf16): throughput "
              f"{ordered['seconds'] / mixed['seconds']:.2f}x (wall), "
              f"{ordered['cpu_seconds'] / mixed['cpu_seconds']:.2f}x (CPU time); loss {mixed['loss']:+.5f} vs "
              f"{ordered['loss']:+.5f}")
        print(f"    sorted without/with the padding mask in attention: throughput "
              f"{masked['seconds'] / ordered['seconds']:.2f}x (wall), "
              f"{masked['cpu_seconds'] / ordered['cpu_seconds']:.2f}x (CPU time)")
        workload = (f"one GRPO update, {name} model ({pad['parameters'] / 1e6:.1f}M parameters), {pad['sequences']} "
                    f"sequences of {s.min_len}-{s.max_len} tokens")
        figures += [
            figure(f"{workload}: rows sorted longest first (the trainer's default); baseline: right padding in "
                   "trajectory order", ordered["trained_tokens"] / ordered["seconds"],
                   pad["trained_tokens"] / pad["seconds"], unit="trained tokens/s", ratio=pad["seconds"] / ordered["seconds"],
                   note=f"padding share {1 - ordered['tokens'] / ordered['positions']:.0%} vs "
                        f"{1 - pad['tokens'] / pad['positions']:.0%}"),
            figure(f"{workload}: rows sorted longest first, attention without the padding mask (causal kernel); "
                   "baseline: the same rows with their padding mask in attention",
                   ordered["trained_tokens"] / ordered["seconds"], masked["trained_tokens"] / masked["seconds"],
                   unit="trained tokens/s", ratio=masked["seconds"] / ordered["seconds"]),
            figure(f"{workload}: mixed precision (forward under bfloat16 autocast, float32 weights and AdamW); "
                   "baseline: the same sorted rows in float32", mixed["trained_tokens"] / mixed["seconds"],
                   ordered["trained_tokens"] / ordered["seconds"], unit="trained tokens/s",
                   ratio=ordered["seconds"] / mixed["seconds"],
                   note=f"loss of the first timed update {mixed['loss']:+.5f} vs {ordered['loss']:+.5f} in float32"),
            figure(f"{workload}: sequence packing; baseline: right padding in trajectory order",
                   pack["trained_tokens"] / pack["seconds"], pad["trained_tokens"] / pad["seconds"],
                   unit="trained tokens/s", ratio=speed,
                   note=f"padding share {1 - pack['tokens'] / pack['positions']:.0%}; peak RSS {memory:.2f}x"),
        ]
        print(f"    every timed update: padded {_fmt(pad['all_seconds'])}, sorted {_fmt(ordered['all_seconds'])}, "
              f"sorted-masked {_fmt(masked['all_seconds'])}, sorted-bf16 {_fmt(mixed['all_seconds'])}, packed {_fmt(pack['all_seconds'])}")
        if speed < 1.0:
            print(f"    NOTE: packing is SLOWER here ({speed:.2f}x wall). Rows are always {s.max_len} wide and the "
                  "CPU attention kernels compute every block of the dense 4-D mask, so its saving on padding "
                  "can be eaten by row-width-squared attention work and bigger tensors.")
        if memory > 1.05:
            print(f"    NOTE: packing uses MORE memory here ({memory:.2f}x peak RSS): every micro-batch is full "
                  f"width ({s.micro_batch} x {s.max_len} tokens) and carries a {s.micro_batch}x1x{s.max_len}x"
                  f"{s.max_len} float mask.")
    print(f"\nLoad average (1 min) {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} cores: "
          "other processes share the CPU, so compare ratios rather than absolute figures. "
          f"Total wall time {time.perf_counter() - started:.0f} s.")
    write_results("train_step", figures, note="--quick: smaller batches, a smoke test" if args.quick else None,
                  details={"packing check": errors, "runs": [{"model": n, "method": m, **{k: v for k, v in r.items()}}
                                                             for (n, m), r in results.items()]})


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "] s"


if __name__ == "__main__":
    main()
