"""Peak memory of training log-probs at a Qwen vocabulary: full logits (the baseline) against chunked ``lm_head``.

What the trainers do per micro-batch: per-token log-probs of the sampled tokens in float32
(:func:`agentgym.trainers.batch.sequence_logprobs`), a policy-gradient loss over them, and backward. The
model is a from-config Qwen2 (tied embeddings, as in Qwen2.5-0.5B/1.5B) with the real Qwen vocabulary
size, 151,936, and a deliberately thin body (hidden 64, 2 layers) so that it runs on 2 CPU cores; the
logits' share of memory then stands out, which is also where a real model runs out of GPU memory at
long sequences (the body's activations grow with ``H``, the logits with ``V``).

Methods, same model (seeded), same tokens, same loss:

* ``full`` (baseline): ``chunk_size=None``, the plain path (``model(...).logits`` ``[N, L, V]``, float32
  ``log_softmax``, gather), exactly what the trainers did before chunking.
* ``chunk=C``: the backbone's hidden states, then ``lm_head`` + float32 ``log_softmax`` + gather over ``C``
  token positions at a time, each chunk checkpointed so backward recomputes one chunk's logits at a time.

Correctness runs first, in its own subprocess, on the full-size input: log-probs of the chunked path at the
default chunk size against the full path (max abs difference, tolerance 1e-5) and every parameter
gradient (max relative difference, tolerance 1e-4); the script exits with an error if they differ.
Memory: a fresh subprocess per method builds the model and batch, records ``ru_maxrss`` (the setup), runs
forward + loss + backward once, and records ``ru_maxrss`` again; "over setup" is the difference, i.e.
what computing the log-probs and their gradients costs. Time: one more subprocess runs ``full`` and the
default chunk size interleaved (A B B A after a warm-up pass of each) and reports each one's fastest pass,
so that load from other processes hits both alike.

Run: python benchmarks/logprob_memory.py [--length 4096] [--batch 1] [--chunk-sizes 128 512 2048] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from agentgym.trainers.batch import sequence_logprobs
from agentgym.trainers.logprobs import DEFAULT_CHUNK_SIZE

QWEN_VOCAB = 151_936


def make_model(vocab: int) -> Any:
    """Seeded from-config Qwen2 with a thin body and the given vocabulary, float32, train mode."""
    import transformers

    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=32_768,
                                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config)
    return model.float().train()


def make_batch(batch: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    """Random tokens; the last row is a quarter shorter (right padding); ~40% of real tokens trained."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    attention = torch.ones((batch, length), dtype=torch.long)
    if batch > 1:
        attention[-1, length - length // 4:] = 0
        ids[-1, length - length // 4:] = 2
    loss_mask = (torch.rand((batch, length), generator=g) < 0.4).float() * attention
    loss_mask[:, 0] = 0.0
    advantages = torch.randn(batch, generator=g)
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask, "advantages": advantages}


def parse_chunk(method: str) -> int | None:
    return None if method == "full" else int(method.split("=", 1)[1])


def forward_backward(model: Any, b: dict[str, torch.Tensor], chunk_size: int | None) -> tuple[torch.Tensor, float]:
    """Log-probs, a REINFORCE-style token-mean loss over them, backward; returns (log-probs, loss)."""
    logp = sequence_logprobs(model, b["input_ids"], b["attention_mask"], temperature=0.9, chunk_size=chunk_size)
    mask = b["loss_mask"]
    loss = -(logp * b["advantages"][:, None] * mask).sum() / mask.sum().clamp(min=1.0)
    loss.backward()
    return logp.detach(), float(loss.detach())


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# ---- workers (one fresh process each) ------------------------------------------------------------
def memory_worker(method: str, batch: int, length: int, vocab: int) -> dict[str, Any]:
    """Setup RSS, then peak RSS over one forward + backward pass of one method."""
    torch.manual_seed(0)
    model = make_model(vocab)
    b = make_batch(batch, length, vocab)
    rss_setup = _rss_mb()
    _, loss = forward_backward(model, b, parse_chunk(method))
    return {"method": method, "rss_setup_mb": rss_setup, "rss_peak_mb": _rss_mb(), "loss": loss,
            "parameters": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}


def timing_worker(batch: int, length: int, vocab: int, chunk_size: int) -> dict[str, Any]:
    """``full`` and ``chunk=chunk_size`` interleaved in one process: warm-up each, then A B B A; fastest pass each."""
    torch.manual_seed(0)
    model = make_model(vocab)
    b = make_batch(batch, length, vocab)
    methods = ("full", f"chunk={chunk_size}")
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    for i, method in enumerate([*methods, *methods, *methods[::-1]]):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        forward_backward(model, b, parse_chunk(method))
        if i >= len(methods):  # the first pass of each is the warm-up
            seconds[method].append(time.perf_counter() - start)
    return {m: {"seconds": min(v), "all_seconds": v} for m, v in seconds.items()}


def check_worker(batch: int, length: int, vocab: int, chunk_size: int) -> dict[str, float]:
    """Full against chunked on the same input: max |dlogp|, |dloss| and max relative |dgrad| per parameter."""
    torch.manual_seed(0)
    model = make_model(vocab)
    b = make_batch(batch, length, vocab)
    results = {}
    for name, chunk in (("full", None), ("chunked", chunk_size)):
        model.zero_grad(set_to_none=True)
        logp, loss = forward_backward(model, b, chunk)
        results[name] = (logp, loss, [p.grad.clone() for p in model.parameters()])
    (lp_a, loss_a, g_a), (lp_b, loss_b, g_b) = results["full"], results["chunked"]
    grad = max(float((x - y).abs().max() / x.abs().max().clamp_min(1e-12)) for x, y in zip(g_a, g_b))
    return {"logp": float((lp_a - lp_b).abs().max()), "loss": abs(loss_a - loss_b), "grad": grad}


def run_worker(*args: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"worker {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- driver --------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB, help=f"vocabulary size (default {QWEN_VOCAB:,}, Qwen)")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[128, DEFAULT_CHUNK_SIZE, 2048],
                        help=f"chunked variants to measure besides the default {DEFAULT_CHUNK_SIZE} (default: 128 2048)")
    parser.add_argument("--quick", action="store_true", help="1,024-token sequences (a smoke test, a few minutes)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "check":
            out: dict[str, Any] = check_worker(*(int(x) for x in rest))
        elif kind == "time":
            out = timing_worker(*(int(x) for x in rest))
        else:
            out = memory_worker(rest[0], *(int(x) for x in rest[1:]))
        print(json.dumps(out))
        return
    if args.quick:
        args.length = 1024
    for name in ("length", "batch", "vocab"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.chunk_sizes) < 1:
        parser.error(f"--chunk-sizes must all be >= 1, got {args.chunk_sizes}")
    shape = [str(args.batch), str(args.length), str(args.vocab)]

    from _results import figure, write_results

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    errors = run_worker("check", *shape, str(DEFAULT_CHUNK_SIZE))
    ok = errors["logp"] <= 1e-5 and errors["grad"] <= 1e-4
    print(f"Correctness ({args.batch} x {args.length} tokens, V = {args.vocab:,}): chunk={DEFAULT_CHUNK_SIZE} vs full "
          f"max |dlogp| {errors['logp']:.2e} (tolerance 1e-5), |dloss| {errors['loss']:.2e}, max relative |dgrad| "
          f"{errors['grad']:.2e} (tolerance 1e-4): {'OK' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit("the chunked log-probs differ from the full ones; see the figures above")

    methods = ["full", *(f"chunk={c}" for c in sorted({*args.chunk_sizes, DEFAULT_CHUNK_SIZE}))]
    results = {m: run_worker("memory", m, *shape) for m in methods}
    timing = run_worker("time", *shape, str(DEFAULT_CHUNK_SIZE))
    base = results["full"]
    base_extra = base["rss_peak_mb"] - base["rss_setup_mb"]
    load_after = os.getloadavg()[0]

    logits_gb = args.batch * (args.length - 1) * args.vocab * 4 / 1e9
    print(f"\nForward + loss + backward of float32 log-probs, Qwen2 config (hidden 64, 2 layers, tied embeddings, "
          f"{base['parameters'] / 1e6:.1f}M parameters), V = {args.vocab:,}, {args.batch} x {args.length} tokens "
          f"(one [N, L, V] float32 tensor: {logits_gb:.2f} GB); CPU, {base['threads']} torch threads, {os.cpu_count()} "
          "cores; memory: a fresh process per row")
    header = ("method", "peak RSS MB", "over setup MB", "memory vs full", "loss")
    rows = []
    for m, r in results.items():
        extra = r["rss_peak_mb"] - r["rss_setup_mb"]
        label = m + (" (baseline)" if m == "full" else " (default)" if parse_chunk(m) == DEFAULT_CHUNK_SIZE else "")
        versus = "1.0x" if m == "full" else f"{base_extra / max(extra, 1.0):.1f}x lower"
        rows.append((label, f"{r['rss_peak_mb']:,.0f}", f"{extra:,.0f}", versus, f"{r['loss']:.6f}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  " + " | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  " + "-+-".join("-" * w for w in widths))
    for row in rows:
        print("  " + " | ".join(c.ljust(w) for c, w in zip(row, widths)))
    default = results[f"chunk={DEFAULT_CHUNK_SIZE}"]
    ratio = base_extra / max(default["rss_peak_mb"] - default["rss_setup_mb"], 1.0)
    t_full, t_chunk = timing["full"], timing[f"chunk={DEFAULT_CHUNK_SIZE}"]
    print(f"\n  default chunk_size={DEFAULT_CHUNK_SIZE}: {ratio:.1f}x less memory over setup than the full logits "
          f"({'meets' if ratio >= 4 else 'MISSES'} the 4x target); peak RSS {base['rss_peak_mb']:,.0f} -> "
          f"{default['rss_peak_mb']:,.0f} MB ({base['rss_peak_mb'] / default['rss_peak_mb']:.1f}x)")
    print(f"  time per pass (interleaved, fastest): full {t_full['seconds']:.2f} s, chunked {t_chunk['seconds']:.2f} s "
          f"({t_chunk['seconds'] / t_full['seconds']:.2f}x; every pass: full {_fmt(t_full['all_seconds'])}, chunked "
          f"{_fmt(t_chunk['all_seconds'])}); backward recomputes each chunk's lm_head matmul and softmax")
    print(f"\nLoad average (1 min) {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} cores. "
          f"Total wall time {time.perf_counter() - started:.0f} s.")
    write_results("logprob_memory", [
        figure(f"training log-probs + backward, from-config Qwen2 (V = {args.vocab:,}), {args.batch} x {args.length} "
               f"tokens: chunked (chunk_size={DEFAULT_CHUNK_SIZE}); baseline: full [N, L, V] logits",
               default["rss_peak_mb"] - default["rss_setup_mb"], base_extra, unit="MB RSS over setup", ratio=ratio,
               goal=">= 4x less memory", met=ratio >= 4,
               note="ratio is baseline / agentgym memory (higher is better); peak RSS "
                    f"{default['rss_peak_mb']:,.0f} vs {base['rss_peak_mb']:,.0f} MB"),
        figure(f"time per forward + backward pass, same workload: chunked (chunk_size={DEFAULT_CHUNK_SIZE}); baseline: "
               "full logits", t_chunk["seconds"], t_full["seconds"], unit="s (fastest pass)",
               ratio=t_chunk["seconds"] / t_full["seconds"], note="ratio is agentgym / baseline time (lower is better)"),
    ], details={"correctness": errors, "memory": results, "timing": timing},
        note="--quick: 1,024-token sequences, a smoke test" if args.quick else None)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "] s"


if __name__ == "__main__":
    main()
