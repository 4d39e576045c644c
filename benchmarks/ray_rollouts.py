"""Episodes per second of a CPU-heavy env (the code interpreter: every turn runs Python in a sandbox) with envs
in-process against envs as Ray actors on a local cluster of 1 and 2 nodes, side by side in one run.

The policy is each env's reference solver (free), so the figures measure where the env work runs and what moving
it behind Ray costs; on a real cluster the second node brings its own cores, while here both nodes share this
machine's, so the 2-node figure shows Ray's overhead, not a speed-up.

    python benchmarks/ray_rollouts.py [--episodes 64] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

from agentgym.policies import ReferencePolicy
from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite
from agentgym.registration.suites import load_suite


def run(specs: list, backend: str, in_flight: int) -> tuple[float, int]:
    engine = RolloutEngine(ReferencePolicy(), RolloutConfig(max_in_flight=in_flight, env_backend=backend,
                                                            step_timeout_s=120, progress=False))
    engine.run(specs[: min(4, len(specs))])  # warm: sandboxes, Ray worker processes
    started = time.perf_counter()
    trajectories = engine.run(specs)
    return time.perf_counter() - started, sum(t.error is None for t in trajectories)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=64, help="episodes per setting")
    p.add_argument("--in-flight", type=int, default=16, help="episodes running at once")
    p.add_argument("--quick", action="store_true", help="16 episodes")
    args = p.parse_args(argv)
    if args.quick:
        args.episodes = 16
    if args.episodes < 1 or args.in_flight < 1:
        p.error("--episodes and --in-flight must be >= 1")
    import ray
    from ray.cluster_utils import Cluster

    suite = load_suite("code-smoke")
    group = -(-args.episodes // len(suite.split("train")))
    specs = episodes_for_suite(suite, "train", group_size=group)[: args.episodes]
    rows = [("in-process (env worker threads)", *run(specs, "local", args.in_flight))]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        rows.append(("Ray, 1 node", *run(specs, "ray", args.in_flight)))
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        rows.append(("Ray, 2 nodes (same machine)", *run(specs, "ray", args.in_flight)))
    finally:
        ray.shutdown()
        cluster.shutdown()
    base = args.episodes / rows[0][1]
    print(f"\n{args.episodes} CodeInterpreter episodes (code-smoke, reference solver), {args.in_flight} in flight")
    print("| envs | episodes/s | finished | vs in-process |\n|---|---|---|---|")
    for name, wall, ok in rows:
        print(f"| {name} | {args.episodes / wall:.1f} | {ok}/{args.episodes} | {args.episodes / wall / base:.2f}x |")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        from _results import figure, write_results

        write_results("ray_rollouts", [
            figure(f"{args.episodes} CodeInterpreter episodes (code-smoke, reference solver), {args.in_flight} in "
                   f"flight, envs as Ray actors: {name} ({ok}/{args.episodes} finished); baseline: envs in-process",
                   args.episodes / wall, base, unit="episodes/s", ratio=args.episodes / wall / base)
            for name, wall, ok in rows[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
