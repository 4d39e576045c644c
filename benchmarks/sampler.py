"""HFPolicy's continuous-batching sampler against the sampler before it (an older commit's code) and today's reference loop, side by side in one run, on a GRPO step's rollouts.

The workload is one rollout step of ``configs/gigpo_sokoban_512.yaml`` as the trainer runs it: 64 Sokoban rooms x 8
rollouts (512 episodes), 256 in flight, constrained actions (``move("up")`` ...), up to 16 tokens a turn at
temperature 1, episodes cut at 1024 tokens of context, every episode with its own sampling seed. The policy is the
built-in tiny model (hidden 128, 4 layers, a tokenizer trained on Sokoban text, as the config's ``--build-only``
step builds it) before any training, so its episodes run long.

Samplers, same model, same episodes, interleaved (reference, continuous, commit, reference, ...):

* ``commit`` (the baseline the goal counts from): the default ``HFPolicy`` of agentgym at commit
  :data:`BEFORE_CONTINUOUS`, the last commit before continuous batching, which is the sampler the studies were
  starved by. Its code is taken with ``git archive`` into a temporary folder and run in a subprocess
  (``benchmarks/_sampler_at_commit.py``) on the same model file and episodes; the model load and a warm-up are not
  timed. ``--commit SHA`` names another commit, ``--commit none`` skips it (a shallow clone lacks the commit: the
  run says so and goes on without it).
* ``reference``: today's ``HFPolicy(sampler="reference")``, each engine batch decoded from start to finish with
  the model's own forward and a ``DynamicCache`` (the same loop as the commit's, with today's rollout engine, which
  has since stopped re-encoding the whole conversation after every observation).
* ``continuous``: ``HFPolicy()``'s default: continuous batching over a slot KV cache
  (:mod:`agentgym.policies.continuous`).
* ``continuous-bf16``: the same sampler on a bfloat16 copy of the model, as a ``mixed_precision: bf16`` run samples
  (:mod:`agentgym.trainers.precision`; the CPU needs fast bfloat16 products, AVX512-BF16 or AMX, for it to pay).
  Its episodes are other draws (bfloat16 logits), so its token count is printed beside the others; its log-probs
  are checked against a full forward of the same bfloat16 model, within :data:`BF16_GAP`. The 10x goal is counted
  on the float32 sampler, whose numbers equal the training forward's.

Checks (the run exits with an error when one fails): the share of episodes whose sampled ids are identical in both
samplers (seeded, so they should all be, up to float rounding at a CDF boundary) is printed; for a sample of
final sequences, every sampled token's log-prob from each sampler must equal one fresh full forward of the
sequence within 1e-4 (the tests hold the continuous sampler to 1e-5 on fixed sequences). Times are the best of
the rounds (other processes only ever add time); the load average at the start and the end is recorded.

The floor: the continuous sampler's FLOPs at this machine's measured rates, matrix products at the matmul rate of
the model's shapes and attention at the rate of one ``scaled_dot_product_attention`` call a turn and layer over a
sample of the workload's own (new tokens, context) shapes (the fastest way measured for them: batching rows by
padding or a hand-written ``softmax(q k^T) v`` was slower). The reference loop's time over the floor is the most any
float32 sampler that computes the same tokens on these kernels could gain here; the 10x goal is out of reach where
that ratio is below 10. (The only tokens a sampler could skip are the repeats of a group's shared first prompt: its
8 rollouts start from the same text, which is about 5% of the tokens computed here.)

The FLOP estimate counts the model's matrix products per computed token (2 x weights, the output layer included)
plus attention (4 x layers x hidden x position) over the tokens each sampler actually computes (prompt suffixes not
covered by the cached prefix, and fed sampled tokens), against the machine's matmul rate measured here at the
model's shapes (a [256, 128] x [128, 512] product) and at 1024^3.

Run: python benchmarks/sampler.py [--quick] [--threads 2] [--rounds 2] [--tasks 64] [--group 8] [--commit SHA|none]
     python benchmarks/sampler.py --device cuda   # on a GPU: the same figures without the CPU goal, written to
                                                  # benchmarks/results/sampler_gpu.json
A workload other than the default (or --quick) is written to a file named after it
(``sampler_gpu_128x8_1024_in_flight.json``, ``sampler_quick.json``), never over the default's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from agentgym.cli.quickstart import demonstration_texts
from agentgym.models import build_tiny_model, load_tiny_model
from agentgym.policies.base import SamplingParams
from agentgym.policies.hf import HFPolicy
from agentgym.registration.suites import load_suite
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.trainers.precision import sampling_copy

SAMPLERS = ("reference", "continuous", "continuous-bf16")
BF16_GAP = 0.02
"""Most |log-prob - full forward| for the bfloat16 sampler, whose full forward is the same bfloat16 model: the batch
shapes differ, so the products round differently (measured: a few thousandths on the tiny model)."""
GOAL = 10.0
BEFORE_CONTINUOUS = "3279914"
"""The last commit before continuous batching landed: its default sampler is "today's" in the goal of >= 10x
today's rollouts/s (a 512-rollout Sokoban step then sampled for minutes)."""
REPO = Path(__file__).resolve().parents[1]


def checkout(commit: str, into: Path) -> str | None:
    """Write ``commit``'s tree into ``into`` (``git archive``: the repository is not touched); an error message
    instead when it cannot (no git, or a shallow clone that lacks the commit)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True)
    if archive.returncode != 0:
        return (f"commit {commit} is not in this clone ({archive.stderr.decode(errors='replace').strip()}); fetch the "
                "full history (git fetch --unshallow) or pass --commit none")
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return None


def run_at_commit(tree: Path, model_dir: Path, args: argparse.Namespace, out: Path) -> tuple[float, list[Any]]:
    """One timed round of the workload with the agentgym in ``tree`` (a subprocess): ``(seconds, each episode's
    sampled ids per turn)``.

    Raises:
        RuntimeError: the subprocess failed; the message holds the end of its output.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    command = [sys.executable, str(Path(__file__).resolve().parent / "_sampler_at_commit.py"), str(model_dir), str(out),
               "--tasks", str(args.tasks), "--group", str(args.group), "--in-flight", str(args.in_flight),
               "--threads", str(args.threads), "--device", args.device]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the sampler of commit {args.commit} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    record = json.loads(out.read_text(encoding="utf-8"))
    return min(record["seconds"]), record["ids"]


def episodes(tasks: int, group: int) -> list[EpisodeSpec]:
    """The step's episodes, seeded as the trainer seeds them (one sampling seed per episode)."""
    suite = load_suite("sokoban")
    train = suite.split("train")
    return [EpisodeSpec(suite.env_id, task=train[k], seed=1000 * k + g, group_id=f"0/{k}",
                        env_kwargs=dict(suite.env_kwargs), sampling_seed=7919 * k + g)
            for k in range(tasks) for g in range(group)]


def run(policy: HFPolicy, specs: list[EpisodeSpec], in_flight: int) -> tuple[float, list[Any], dict[str, int]]:
    config = RolloutConfig(max_in_flight=in_flight, sampling=SamplingParams(max_tokens=16, temperature=1.0, seed=0),
                           system_prompt="", max_context_tokens=1024, deterministic=False, constrain_actions=True,
                           progress=False)
    before = dict(policy.kv_cache.stats)
    start = time.perf_counter()
    trajectories = RolloutEngine(policy, config).run(specs)
    seconds = time.perf_counter() - start
    stats = {k: policy.kv_cache.stats[k] - before.get(k, 0) for k in ("prompt_tokens", "reused_tokens")}
    return seconds, trajectories, stats


def synchronize(device: str) -> None:
    """Wait for the device's queued kernels (a GPU runs them asynchronously: a timer read before this measures the
    launches, not the work)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def matmul_gflops(shape: tuple[int, int, int], seconds: float = 1.0, device: str = "cpu") -> float:
    """Best measured rate of ``[m, k] x [k, n]`` float32 products on ``device`` (this process's torch threads on a
    CPU)."""
    m, k, n = shape
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
    best, end = float("inf"), time.perf_counter() + seconds
    reps = max(1, int(2e8 // (2 * m * k * n)))
    while time.perf_counter() < end:
        synchronize(device)
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        synchronize(device)
        best = min(best, (time.perf_counter() - t) / reps)
    return 2 * m * k * n / best / 1e9


def computed_turns(trajectories: list[Any]) -> list[tuple[int, int]]:
    """``(new tokens, context width)`` of every forward run a turn needs: the prompt past the previous turn's cached
    part (its prompt and fed tokens) and every fed sampled token (the last sampled token is never fed)."""
    runs = []
    for trajectory in trajectories:
        cached = length = 0
        for turn in trajectory.turns:  # a turn stores only the tokens added since the previous action
            length += len(turn.prompt_token_ids)
            g = len(turn.action_token_ids)
            start = min(cached, length - 1)
            end = length + max(g - 1, 0)
            runs.append((end - start, end))
            cached = end
            length += g
    return runs


def flops(model: Any, trajectories: list[Any]) -> tuple[float, float]:
    """``(matrix products, attention)`` FLOPs of the tokens computed (:func:`computed_turns`): 2 x weights a token
    (the output layer included) and 4 x layers x hidden x position for attention (query-key scores and the values),
    the token at position ``p`` attending to ``p + 1`` columns."""
    config = model.config
    per_token = 2 * sum(p.numel() for name, p in model.named_parameters()
                        if p.dim() == 2 and "embed_tokens" not in name)
    if config.tie_word_embeddings:
        per_token += 2 * model.get_input_embeddings().weight.numel()
    attention = 4 * config.num_hidden_layers * config.hidden_size
    linear = attend = 0.0
    for count, end in computed_turns(trajectories):
        linear += count * per_token
        attend += attention * (2 * end - count + 1) * count / 2
    return linear, attend


def attention_gflops(model: Any, trajectories: list[Any], sample: int = 256, seconds: float = 2.0,
                     device: str = "cpu") -> float:
    """Best measured rate of the attention the workload needs, run the fastest way measured for these shapes (one
    ``scaled_dot_product_attention`` call per turn and layer, each turn's new tokens over its own context, as the
    sampler runs it), over ``sample`` of the workload's turns; FLOPs counted as :func:`flops` counts them."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    runs = computed_turns(trajectories)
    runs = runs[:: max(1, len(runs) // sample)][:sample]
    width = max(end for _, end in runs)
    keys = torch.randn(1, heads, width, head_dim, device=device)
    values = torch.randn(1, heads, width, head_dim, device=device)
    calls = []
    for count, end in runs:
        columns = torch.arange(end, device=device)
        limit = torch.arange(end - count, end, device=device)[:, None]
        mask = torch.zeros(count, end, device=device).masked_fill_(columns[None] > limit, float("-inf"))
        calls.append((torch.randn(1, heads, count, head_dim, device=device), end, mask))
    work = sum(4 * config.hidden_size * (2 * end - count + 1) * count / 2 for count, end in runs)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    best, stop = float("inf"), time.perf_counter() + seconds
    with torch.inference_mode():
        while time.perf_counter() < stop:
            synchronize(device)
            t = time.perf_counter()
            for query, end, mask in calls:
                sdpa(query, keys[:, :, :end], values[:, :, :end], attn_mask=mask)
            synchronize(device)
            best = min(best, time.perf_counter() - t)
    return work / best / 1e9


def full_forward_gap(model: Any, trajectories: list[Any], limit: int) -> float:
    """Largest |sampler log-prob - fresh full-forward log-prob| over the sampled tokens of ``limit`` turns."""
    gap = 0.0
    sequences = []  # (context before the action, action ids, recorded log-probs)
    for trajectory in trajectories:
        context: list[int] = []
        for turn in trajectory.turns:  # a turn stores only the tokens added since the previous action
            context = context + list(turn.prompt_token_ids)
            if turn.action_token_ids:
                sequences.append((context, list(turn.action_token_ids), list(turn.action_logprobs)))
            context = context + list(turn.action_token_ids or ())
    step = max(1, len(sequences) // limit)
    device = next(model.parameters()).device
    with torch.inference_mode():
        for context, action, recorded in sequences[::step][:limit]:
            ids = context + action
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float().cpu()
            logp = torch.log_softmax(logits, -1)  # temperature 1
            n = len(context)
            fresh = logp[n - 1: len(ids) - 1].gather(-1, torch.tensor(action)[:, None]).squeeze(-1)
            gap = max(gap, float((torch.tensor(recorded) - fresh).abs().max()))
    return gap


DEFAULT_WORKLOAD = {"tasks": 64, "group": 8, "in_flight": 256}
"""The workload of the committed figures (one rollout step of ``configs/gigpo_sokoban_512.yaml``)."""


def result_name(args: argparse.Namespace) -> str:
    """The result file a run writes: ``sampler`` (``sampler_gpu`` on a GPU) for the default workload at full size,
    a name that spells out the workload otherwise, so that a probe at another size (or ``--quick``) never replaces
    the committed figures of the default one."""
    name = "sampler" if args.device == "cpu" else "sampler_gpu"
    if args.quick:
        return f"{name}_quick"
    workload = {"tasks": args.tasks, "group": args.group, "in_flight": args.in_flight}
    if workload != DEFAULT_WORKLOAD:
        name += f"_{args.tasks}x{args.group}_{args.in_flight}_in_flight"
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI smoke size: 4 rooms x 8 rollouts, one round")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs of each sampler, interleaved")
    parser.add_argument("--tasks", type=int, default=DEFAULT_WORKLOAD["tasks"], help="Sokoban rooms (default 64)")
    parser.add_argument("--group", type=int, default=DEFAULT_WORKLOAD["group"], help="rollouts per room (default 8)")
    parser.add_argument("--in-flight", type=int, default=DEFAULT_WORKLOAD["in_flight"],
                        help="episodes in flight (default 256); a workload other than the default is written to a "
                             "result file named after it")
    parser.add_argument("--device", default="cpu",
                        help="where the model runs: cpu (default) or cuda[:N]; the FLOP rates are measured there too")
    parser.add_argument("--commit", default=BEFORE_CONTINUOUS,
                        help=f"also time the default sampler of this commit, the goal's baseline (default "
                             f"{BEFORE_CONTINUOUS}, the last before continuous batching; 'none' skips it)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds = 4, 1
    if min(args.threads, args.rounds, args.tasks, args.group, args.in_flight) < 1:
        parser.error("--threads, --rounds, --tasks, --group and --in-flight must be >= 1")
    if not (args.device == "cpu" or args.device == "cuda" or
            (args.device.startswith("cuda:") and args.device[5:].isdigit())):
        parser.error(f"--device takes cpu, cuda or cuda:N, got {args.device!r}")
    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA GPU here (torch {torch.__version__}); run on a GPU "
                     "machine with a CUDA build of torch, or use --device cpu")
    if not args.commit or args.commit.startswith("-"):
        parser.error(f"--commit takes a commit (a SHA, a tag or a branch) or 'none', got {args.commit!r}")

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        return measure(args, Path(tmp))


def measure(args: argparse.Namespace, tmp: Path) -> int:
    """The benchmark proper (``tmp``: a scratch folder for the model file and the commit's checkout)."""
    from _results import figure, write_results

    path = build_tiny_model(tmp / "model", texts=demonstration_texts("sokoban", 200))
    model, tokenizer = load_tiny_model(path)
    tree: Path | None = None
    if args.commit.lower() != "none":
        problem = checkout(args.commit, tmp / "commit")
        if problem:
            print(f"skipping the commit baseline: {problem}", file=sys.stderr)
        else:
            tree = tmp / "commit"
    specs = episodes(args.tasks, args.group)
    kv_tokens = args.in_flight * 1024  # the trainer sizes the cache for every episode at its full context
    models = {"reference": model, "continuous": model, "continuous-bf16": sampling_copy(model, "bf16")}
    policies = {name: HFPolicy(models[name], tokenizer, device=args.device, max_batch_size=args.in_flight,
                               kv_cache_tokens=kv_tokens, sampler=name.split("-")[0]) for name in SAMPLERS}
    print(f"{len(specs)} Sokoban rollouts, {args.in_flight} in flight, {args.threads} torch threads, "
          f"load average {os.getloadavg()[0]:.2f}")
    run(policies["continuous"], specs[: min(len(specs), 16)], args.in_flight)  # warm-up: first-call costs
    run(policies["reference"], specs[: min(len(specs), 16)], args.in_flight)
    run(policies["continuous-bf16"], specs[: min(len(specs), 16)], args.in_flight)
    best: dict[str, tuple[float, list[Any], dict[str, int]]] = {}
    at_commit: dict[str, tuple[float, list[Any]]] = {}
    for round_ in range(args.rounds):
        for name in SAMPLERS:
            seconds, trajectories, stats = run(policies[name], specs, args.in_flight)
            tokens = sum(len(t.action_token_ids) for tr in trajectories for t in tr.turns)
            print(f"  round {round_ + 1} {name:10s} {seconds:7.2f} s  {len(trajectories) / seconds:7.2f} rollouts/s  "
                  f"{tokens / seconds:8.0f} tokens/s  load {os.getloadavg()[0]:.2f}")
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, trajectories, stats)
        if tree is not None:
            seconds, ids = run_at_commit(tree, path, args, tmp / "commit.json")
            print(f"  round {round_ + 1} {'commit':10s} {seconds:7.2f} s  {len(ids) / seconds:7.2f} rollouts/s  "
                  f"{sum(len(a) for e in ids for a in e) / seconds:8.0f} tokens/s  load {os.getloadavg()[0]:.2f}")
            if "commit" not in at_commit or seconds < at_commit["commit"][0]:
                at_commit["commit"] = (seconds, ids)
    for policy in policies.values():
        policy.close()

    ref_s, ref_traj, ref_stats = best["reference"]
    new_s, new_traj, new_stats = best["continuous"]
    tokens = {name: sum(len(t.action_token_ids) for tr in traj for t in tr.turns) for name, (_, traj, _) in best.items()}
    same = sum(tuple(tuple(t.action_token_ids) for t in a.turns) == tuple(tuple(t.action_token_ids) for t in b.turns)
               for a, b in zip(ref_traj, new_traj))
    gaps = {name: full_forward_gap(models[name], traj, 64) for name, (_, traj, _) in best.items()}
    bf_s, bf_traj, _ = best["continuous-bf16"]
    ratio = ref_s / new_s
    work = {name: flops(model, traj) for name, (_, traj, _) in best.items()}
    rate = {name: sum(work[name]) / s / 1e9 for name, (s, _, _) in best.items()}
    model_mm = matmul_gflops((256, 128, 512), device=args.device)
    big_mm = matmul_gflops((1024, 1024, 1024), device=args.device)
    attention_rate = attention_gflops(model, new_traj, device=args.device)
    # The floor: the continuous sampler's FLOPs at the machine's measured rates (products at the matmul rate of the
    # model's shapes, attention at its own), with no other work. No sampler that computes these tokens in float32
    # on this machine's kernels can take less time.
    linear_flops, attention_flops = work["continuous"]
    floor_s = linear_flops / model_mm / 1e9 + attention_flops / attention_rate / 1e9
    print(f"reference : {ref_s:7.2f} s  {len(ref_traj) / ref_s:7.2f} rollouts/s  {tokens['reference'] / ref_s:8.0f} "
          f"rollout tokens/s  {rate['reference']:.2f} GFLOP/s")
    print(f"continuous: {new_s:7.2f} s  {len(new_traj) / new_s:7.2f} rollouts/s  {tokens['continuous'] / new_s:8.0f} "
          f"rollout tokens/s  {rate['continuous']:.2f} GFLOP/s")
    print(f"continuous on a bfloat16 copy: {bf_s:7.2f} s  {len(bf_traj) / bf_s:7.2f} rollouts/s  "
          f"{tokens['continuous-bf16'] / bf_s:8.0f} rollout tokens/s ({tokens['continuous-bf16']:,} sampled tokens); "
          f"{new_s / bf_s:.2f}x the float32 sampler")
    commit_s = at_commit["commit"][0] if at_commit else None
    commit_same = None
    if at_commit:
        commit_ids = at_commit["commit"][1]
        commit_same = sum([list(t.action_token_ids) for t in tr.turns] == ids for tr, ids in zip(new_traj, commit_ids))
        tokens["commit"] = sum(len(action) for episode in commit_ids for action in episode)
        # It seeds each row's sampling its own way, so its episodes are other draws of the same policy: the token
        # counts say whether the two workloads are alike.
        print(f"commit {args.commit}: {commit_s:7.2f} s  {len(commit_ids) / commit_s:7.2f} rollouts/s  "
              f"{tokens['commit'] / commit_s:8.0f} rollout tokens/s (the default sampler before continuous batching; "
              f"{commit_same}/{len(commit_ids)} episodes sampled the continuous sampler's ids, {tokens['commit']:,} "
              f"sampled tokens against {tokens['continuous']:,})")
        print(f"ratio (rollouts/s) over commit {args.commit}: {commit_s / new_s:.2f}x (goal >= {GOAL:.0f}x); over "
              f"today's reference loop: {ratio:.2f}x")
    else:
        print(f"ratio (rollouts/s) over today's reference loop: {ratio:.2f}x (goal >= {GOAL:.0f}x)")
    print(f"identical sampled ids: {same}/{len(ref_traj)} episodes; max |log-prob - full forward|: "
          f"reference {gaps['reference']:.2e}, continuous {gaps['continuous']:.2e}, continuous-bf16 (against the "
          f"bfloat16 model) {gaps['continuous-bf16']:.2e}")
    print(f"machine matmul: {model_mm:.1f} GFLOP/s at the model's shapes, {big_mm:.1f} GFLOP/s at 1024^3; "
          f"continuous sampler reaches {100 * rate['continuous'] / model_mm:.0f}% of the former")
    print(f"floor: {floor_s:.2f} s ({linear_flops / 1e12:.2f} TFLOP of products at {model_mm:.0f} GFLOP/s, "
          f"{attention_flops / 1e12:.2f} TFLOP of attention at {attention_rate:.0f} GFLOP/s): the most any float32 "
          f"sampler could gain here is {ref_s / floor_s:.2f}x over the reference loop"
          + (f", {commit_s / floor_s:.2f}x over commit {args.commit}" if commit_s else ""))
    print(f"prompt tokens computed: reference {ref_stats['prompt_tokens'] - ref_stats['reused_tokens']:,}, "
          f"continuous {new_stats['prompt_tokens'] - new_stats['reused_tokens']:,}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if max(gaps["reference"], gaps["continuous"]) > 1e-4 or gaps["continuous-bf16"] > BF16_GAP:
        print(f"log-probs differ from a full forward by more than 1e-4 (float32) or {BF16_GAP} (bfloat16)",
              file=sys.stderr)
        return 1
    where = (f"{args.threads} torch threads" if args.device == "cpu"
             else f"{torch.cuda.get_device_name(args.device)} ({args.device})")
    workload = (f"{len(specs)} Sokoban rollouts ({args.tasks} rooms x {args.group}), {args.in_flight} in flight, "
                f"constrained actions, <= 16 tokens a turn, tiny model, {where}")
    # The 10x goal is set on 2 CPU cores; on a GPU the figures are recorded without it, in a file of their own.
    goal = f">= {GOAL:.0f}x" if args.device == "cpu" else None
    base_s, base_name = (commit_s, f"the default sampler of commit {args.commit}") if commit_s else (
        ref_s, "today's reference loop")
    figures = []
    if commit_s is not None:  # the goal counts from the sampler before continuous batching
        commit_ratio = commit_s / new_s
        figures.append(figure(
            f"{workload}: continuous batching; baseline: the default sampler of commit {args.commit} (the last "
            "before continuous batching)", len(new_traj) / new_s, len(new_traj) / commit_s, unit="rollouts/s",
            ratio=commit_ratio, goal=goal, met=commit_ratio >= GOAL if goal else None,
            note=f"it seeds sampling its own way: {commit_same}/{len(new_traj)} episodes sampled identical ids, "
                 f"{tokens['commit']:,} sampled tokens against {tokens['continuous']:,}"))
    figures += [
        figure(f"{workload}: continuous batching; baseline: today's reference loop", len(new_traj) / new_s,
               len(ref_traj) / ref_s, unit="rollouts/s", ratio=ratio, goal=None if commit_s else goal,
               met=None if commit_s or not goal else ratio >= GOAL,
               note=f"{same}/{len(ref_traj)} episodes sampled identical ids" +
                    ("" if commit_s else "; the commit baseline was not run")),
        figure(f"{workload}: continuous batching on a bfloat16 copy of the model (mixed_precision: bf16); "
               f"baseline: {base_name}, float32", len(bf_traj) / bf_s, len(bf_traj) / base_s, unit="rollouts/s",
               ratio=base_s / bf_s, note=f"{new_s / bf_s:.2f}x the float32 continuous sampler; other draws: "
                                          f"{tokens['continuous-bf16']:,} sampled tokens against "
                                          f"{tokens['continuous']:,}; log-probs within "
                                          f"{gaps['continuous-bf16']:.1e} of the bfloat16 model's full forward"),
        figure(f"{workload}: rollout tokens/s", tokens["continuous"] / new_s, tokens["reference"] / ref_s,
               unit="tokens/s"),
        figure("model FLOP rate (estimate) against measured matmul at the model's shapes", rate["continuous"],
               rate["reference"], unit="GFLOP/s", note=f"matmul {model_mm:.1f} GFLOP/s at [256,128]x[128,512], "
                                                       f"{big_mm:.1f} at 1024^3"),
        figure("the floor: seconds of the continuous sampler's FLOPs at the machine's measured rates (products at "
               "the matmul rate of the model's shapes, attention at the rate of one attention call a turn and layer "
               f"at the workload's shapes), against the measured time of {base_name}", floor_s, base_s, unit="s",
               ratio=base_s / floor_s, note=f"{linear_flops / 1e12:.2f} TFLOP of products at {model_mm:.0f} GFLOP/s "
                                           f"and {attention_flops / 1e12:.2f} TFLOP of attention at "
                                           f"{attention_rate:.0f} GFLOP/s; the ratio is the most a float32 sampler "
                                           f"could gain over {base_name} on this machine"
                                           + (f"; over today's reference loop: {ref_s / floor_s:.2f}x" if commit_s
                                              else "")),
    ]
    write_results(result_name(args), figures, details={
        "seconds": {"reference": ref_s, "continuous": new_s, "continuous-bf16": bf_s, "floor": floor_s,
                    **({"commit": commit_s} if commit_s else {})},
        "commit": {"sha": args.commit, "identical_episodes": commit_same} if commit_s else None, "tokens": tokens,
        "flops": {name: {"products": w[0], "attention": w[1]} for name, w in work.items()},
        "attention_gflops": attention_rate, "identical_episodes": same,
        "logprob_gap": gaps, "matmul_gflops": {"model_shapes": model_mm, "1024^3": big_mm},
        "prompt_tokens": {"reference": ref_stats, "continuous": new_stats}},
        note="--quick: 32 rollouts, one round" if args.quick else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
