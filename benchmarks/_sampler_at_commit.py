"""Time one sampler workload with the agentgym of another commit (run by ``benchmarks/sampler.py --commit``).

``benchmarks/sampler.py`` starts this file in a subprocess whose ``PYTHONPATH`` puts a checkout of the other
commit first, so ``agentgym`` (and the envs it registers) are that commit's code, while this file is today's. It
therefore uses only what both sides have had since commit 3279914 (the default baseline): ``load_suite``,
``EpisodeSpec``, ``RolloutConfig``, ``RolloutEngine``, ``HFPolicy`` and ``load_tiny_model``. It builds the episodes
the way ``sampler.episodes`` does, runs them ``--rounds`` times with that commit's default ``HFPolicy`` (its
sampler as a trainer gets it), and writes the best time and every episode's sampled ids as JSON.

    PYTHONPATH=CHECKOUT python benchmarks/_sampler_at_commit.py MODEL_DIR OUT.json --tasks 64 --group 8 ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a tiny model directory (build_tiny_model's output)")
    parser.add_argument("out", help="JSON file to write: seconds of each round and the episodes' sampled ids")
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--in-flight", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import torch

    import agentgym
    from agentgym.models import load_tiny_model
    from agentgym.policies.base import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.registration.suites import load_suite
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    torch.set_num_threads(args.threads)
    model, tokenizer = load_tiny_model(args.model)
    suite = load_suite("sokoban")
    train = suite.split("train")
    specs = [EpisodeSpec(suite.env_id, task=train[k], seed=1000 * k + g, group_id=f"0/{k}",
                         env_kwargs=dict(suite.env_kwargs), sampling_seed=7919 * k + g)
             for k in range(args.tasks) for g in range(args.group)]
    config = RolloutConfig(max_in_flight=args.in_flight,
                           sampling=SamplingParams(max_tokens=16, temperature=1.0, seed=0), system_prompt="",
                           max_context_tokens=1024, deterministic=False, constrain_actions=True, progress=False)
    policy = HFPolicy(model, tokenizer, device=args.device, max_batch_size=args.in_flight,
                      kv_cache_tokens=args.in_flight * 1024)
    RolloutEngine(policy, config).run(specs[: min(len(specs), 16)])  # warm-up: first-call costs
    seconds, ids = [], None
    for _ in range(args.rounds):
        start = time.perf_counter()
        trajectories = RolloutEngine(policy, config).run(specs)
        seconds.append(time.perf_counter() - start)
        ids = [[list(t.action_token_ids) for t in tr.turns] for tr in trajectories]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"seconds": seconds, "ids": ids, "agentgym": os.path.dirname(agentgym.__file__)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
