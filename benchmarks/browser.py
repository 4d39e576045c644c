"""Browser env cost: our pooled contexts against launching a fresh browser per episode, in one run.

Episodes are real WebShop-v1 episodes played by the reference solver (search, open the product, set
2-3 options, add to cart, check out, place the order: 8-9 actions, each followed by an accessibility
snapshot), with 1 and with 4 envs stepping concurrently from threads (as the rollout engine does).

* ``ours``: one Chromium, one pooled context per env, cleaned and reused across episodes
  (``BrowserPool(isolation="context")``, the default).
* ``fresh browser``: a new Chromium process for every episode, closed after it
  (``BrowserPool(isolation="browser")``): the usual way of getting a clean browser per episode.
* ``text fallback``: ``WebShop-text-v1``, the same pages rendered without a browser, in one thread.

Reported: reset time (p50/p95), per-action latency (``env.step``: action + snapshot; p50/p95) and
actions/s over the whole run (resets included).

Run: python benchmarks/browser.py [--episodes 6] [--text-episodes 200]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

from agentgym.envs.web.env import WebShopEnv, WebShopTextEnv
from agentgym.envs.web.goals import generate_tasks
from agentgym.tools.browser import BrowserConfig
from agentgym.tools.browser.pool import BrowserPool


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000 if ordered else float("nan")


def play(env: Any, tasks: list[Any], resets: list[float], steps: list[float], lock: threading.Lock) -> int:
    """Play ``tasks`` with the reference solver; return the number of successes."""
    solved = 0
    for task in tasks:
        start = time.perf_counter()
        observation, _ = env.reset(options={"task": task})
        reset_s = time.perf_counter() - start
        solver = env.unwrapped.reference_solver()
        local: list[float] = []
        while True:
            action = solver(observation)
            start = time.perf_counter()
            observation, _, terminated, truncated, info = env.step(action)
            local.append(time.perf_counter() - start)
            if terminated or truncated:
                solved += int(info["outcome"]["success"])
                break
        with lock:
            resets.append(reset_s)
            steps.extend(local)
    return solved


def run(setting: str, contexts: int, episodes: int, tasks: list[Any], config: BrowserConfig) -> dict[str, Any]:
    isolation = "browser" if setting == "fresh browser" else "context"
    pool = BrowserPool(config, isolation=isolation)
    envs = [WebShopEnv(browser=pool) for _ in range(contexts)]
    resets: list[float] = []
    steps: list[float] = []
    solved = [0] * contexts
    lock = threading.Lock()
    try:
        # Warm-up outside the clock: the browser (for ours) and the page cache, like a long training run.
        play(envs[0], tasks[:1], [], [], lock)
        shares = [[tasks[(i * episodes + j) % len(tasks)] for j in range(episodes)] for i in range(contexts)]

        def worker(index: int) -> None:
            solved[index] = play(envs[index], shares[index], resets, steps, lock)

        start = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(contexts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
    finally:
        for env in envs:
            env.close()
        pool.close()
    return {"setting": setting, "contexts": contexts, "episodes": len(resets), "solved": sum(solved),
            "reset_p50": percentile(resets, 0.5), "reset_p95": percentile(resets, 0.95),
            "step_p50": percentile(steps, 0.5), "step_p95": percentile(steps, 0.95),
            "actions_per_s": len(steps) / wall, "launches": pool.stats["launches"]}


def run_text(episodes: int, tasks: list[Any]) -> dict[str, Any]:
    env = WebShopTextEnv()
    resets: list[float] = []
    steps: list[float] = []
    lock = threading.Lock()
    play(env, tasks[:1], [], [], lock)
    start = time.perf_counter()
    solved = play(env, [tasks[i % len(tasks)] for i in range(episodes)], resets, steps, lock)
    wall = time.perf_counter() - start
    env.close()
    return {"setting": "text fallback", "contexts": 1, "episodes": len(resets), "solved": solved,
            "reset_p50": percentile(resets, 0.5), "reset_p95": percentile(resets, 0.95),
            "step_p50": percentile(steps, 0.5), "step_p95": percentile(steps, 0.95),
            "actions_per_s": len(steps) / wall, "launches": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=6, help="episodes per env (thread) for each browser setting")
    parser.add_argument("--text-episodes", type=int, default=200, help="episodes for the text fallback")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1, 4], help="concurrent envs to measure")
    args = parser.parse_args()
    if args.episodes < 1 or args.text_episodes < 1 or min(args.contexts) < 1:
        parser.error("--episodes, --text-episodes and --contexts must be >= 1")

    import random

    tasks = generate_tasks(random.Random("benchmark"), 32)
    config = BrowserConfig()
    rows = []
    for contexts in args.contexts:
        for setting in ("ours", "fresh browser"):
            rows.append(run(setting, contexts, args.episodes, tasks, config))
    rows.append(run_text(args.text_episodes, tasks))

    print(f"\nWebShop-v1 episodes with the reference solver on {os.cpu_count()} cores (times in ms)")
    header = (f"  {'setting':<16} {'envs':>4} {'episodes':>8} {'solved':>6} {'reset p50':>9} {'reset p95':>9} "
              f"{'step p50':>8} {'step p95':>8} {'actions/s':>9} {'launches':>8}")
    print(header + "\n  " + "-" * (len(header) - 2))
    for r in rows:
        print(f"  {r['setting']:<16} {r['contexts']:>4} {r['episodes']:>8} {r['solved']:>6} {r['reset_p50']:>9.1f} "
              f"{r['reset_p95']:>9.1f} {r['step_p50']:>8.1f} {r['step_p95']:>8.1f} {r['actions_per_s']:>9.1f} "
              f"{r['launches']:>8}")
    by_key = {(r["setting"], r["contexts"]): r for r in rows}
    print()
    for contexts in args.contexts:
        ours, fresh = by_key[("ours", contexts)], by_key[("fresh browser", contexts)]
        print(f"  {contexts} env(s): reset {fresh['reset_p50'] / ours['reset_p50']:.1f}x faster, "
              f"actions/s {ours['actions_per_s'] / fresh['actions_per_s']:.1f}x higher than a fresh browser per "
              "episode")
    text = by_key[("text fallback", 1)]
    best = max(r["actions_per_s"] for r in rows if r["setting"] == "ours")
    print(f"  text fallback: {text['actions_per_s']:.0f} steps/s, {text['actions_per_s'] / best:.0f}x the best browser "
          "setting")


if __name__ == "__main__":
    main()
