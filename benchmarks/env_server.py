"""Load test of ``agentgym serve-env`` on loopback: per-step overhead against in-process, and leak checks.

What it measures, side by side in one run:

* in-process: ``env.step`` latency of the reference solver's actions on ``gym.make(env_id)`` (the baseline);
* one session: the same actions through ``gym.make("agentgym/Remote-v0", url=...)`` (OpenEnv's sync client), one
  step at a time: the protocol's own per-step overhead;
* N sessions (default 64) for ``--seconds`` (default 120): concurrent episodes through OpenEnv's async client
  (:class:`agentgym.serving.env_server.AgentGymClient`) in one event loop: latency under load and steps/s;
* leaks: the server's sessions and live envs, open file descriptors, threads and child processes before the load
  (after one warm-up session) and after every client closed.

Usage::

    python benchmarks/env_server.py                      # 64 sessions, 2 minutes
    python benchmarks/env_server.py --sessions 16 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import httpx

import agentgym  # noqa: F401 - registers the ids

DEFAULT_ENV = "agentgym/Calculator-v0"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def reference_actions(env_id: str, seeds: range) -> dict[int, list[str]]:
    """The reference solver's actions for each seed, played in-process."""
    out: dict[int, list[str]] = {}
    env = gym.make(env_id)
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        solver = env.unwrapped.reference_solver()
        actions: list[str] = []
        while True:
            action = solver(obs)
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        out[seed] = actions
    env.close()
    return out


def time_steps(env: Any, plans: dict[int, list[str]], seconds: float) -> list[float]:
    """Step latencies (s) of replaying the plans on ``env`` (in-process or Remote-v0) for about ``seconds``."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for seed, actions in plans.items():
            env.reset(seed=seed)
            for action in actions:
                start = time.perf_counter()
                env.step(action)
                latencies.append(time.perf_counter() - start)
            if time.monotonic() >= deadline:
                break
    return latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (a load-independent cost on a shared machine)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_resources(url: str, pid: int) -> dict[str, int]:
    """What a leak would show: sessions, live envs, open fds, threads and child processes of the server."""
    info = httpx.get(f"{url}/sessions", timeout=10).json()
    children = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children += 1
            except (OSError, IndexError, ValueError):
                continue
    return {"sessions": int(info["active_sessions"]), "live_envs": int(info["live_envs"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task")),
            "children": children}


def settled(url: str, pid: int, baseline: dict[str, int] | None, timeout_s: float = 30.0) -> dict[str, int]:
    """Resources once the server is idle again (sessions close asynchronously after a client leaves)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = server_resources(url, pid)
        idle = now["sessions"] == 0 and now["live_envs"] == 0
        if idle and (baseline is None or all(now[k] <= baseline[k] for k in now)):
            return now
        if time.monotonic() > deadline:
            return now
        time.sleep(0.25)


async def _session(url: str, plans: dict[int, list[str]], deadline: float, latencies: list[float],
                   errors: list[str], rng: random.Random) -> int:
    from agentgym.serving.env_server import AgentGymAction, AgentGymClient

    steps = 0
    client = AgentGymClient(base_url=url, message_timeout_s=60.0)
    try:
        await client.connect()
        seeds = list(plans)
        while time.monotonic() < deadline:
            seed = rng.choice(seeds)
            await client.reset(seed=seed)
            for action in plans[seed]:
                start = time.perf_counter()
                await client.step(AgentGymAction(text=action))
                latencies.append(time.perf_counter() - start)
                steps += 1
    except Exception as exc:  # noqa: BLE001 - counted and reported, the other sessions go on
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        await client.close()
    return steps


async def _load(url: str, plans: dict[int, list[str]], sessions: int, seconds: float) -> tuple[list[float], list[str], float]:
    latencies: list[float] = []
    errors: list[str] = []
    start = time.monotonic()
    deadline = start + seconds
    await asyncio.gather(*(_session(url, plans, deadline, latencies, errors, random.Random(i)) for i in range(sessions)))
    return latencies, errors, time.monotonic() - start


def load(url: str, pid: int, *, sessions: int, seconds: float, env_id: str = DEFAULT_ENV,
         plans: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """``sessions`` concurrent episodes for ``seconds`` against the server at ``url`` (process ``pid``).

    Returns steps, errors, latency percentiles (ms), steps/s, the resources before/after, and ``leaks``: each
    resource that is higher after the run than before it, as ``(before, after)``.
    """
    from agentgym.serving.env_server import AgentGymAction, AgentGymClient

    plans = plans or reference_actions(env_id, range(32))

    async def warm_up() -> None:  # first-use allocations (imports, pools) are not leaks
        client = AgentGymClient(base_url=url)
        try:
            await client.reset(seed=0)
            await client.step(AgentGymAction(text=plans[next(iter(plans))][0]))
        finally:
            await client.close()

    asyncio.run(warm_up())
    before = settled(url, pid, None)
    server_cpu, client_cpu = cpu_seconds(pid), time.process_time()
    latencies, errors, wall = asyncio.run(_load(url, plans, sessions, seconds))
    server_cpu, client_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - client_cpu
    after = settled(url, pid, before)
    return {
        "sessions": sessions, "seconds": wall, "steps": len(latencies), "errors": len(errors),
        "first_errors": errors[:3], "steps_per_s": len(latencies) / wall if wall else 0.0,
        "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
        "server_cpu_ms_per_step": 1000 * server_cpu / max(len(latencies), 1),
        "client_cpu_ms_per_step": 1000 * client_cpu / max(len(latencies), 1),
        "before": before, "after": after,
        "leaks": {k: (before[k], after[k]) for k in before if after[k] > before[k]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default=DEFAULT_ENV)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--sequential-seconds", type=float, default=10.0,
                        help="duration of the in-process and one-session measurements each")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.seconds <= 0 or args.sequential_seconds <= 0:
        parser.error("--sessions must be >= 1 and --seconds, --sequential-seconds > 0")

    from agentgym.serving.remote_env import launch_env_server

    plans = reference_actions(args.env_id, range(32))
    local = gym.make(args.env_id)
    cpu = time.process_time()
    in_process = time_steps(local, plans, args.sequential_seconds)
    in_process_cpu_ms = 1000 * (time.process_time() - cpu) / len(in_process)  # includes the resets
    local.close()
    with launch_env_server(args.env_id, max_sessions=args.sessions) as server:
        remote = gym.make("agentgym/Remote-v0", url=server.url, env_id=args.env_id)
        one_session = time_steps(remote, plans, args.sequential_seconds)
        remote.close()
        result = load(server.url, server.pid, sessions=args.sessions, seconds=args.seconds, env_id=args.env_id,
                      plans=plans)

    def ms(values: list[float], q: float) -> float:
        return 1000 * percentile(values, q)

    rows = [
        ("in-process env.step", len(in_process), ms(in_process, 50), ms(in_process, 99), "-"),
        ("Remote-v0, 1 session", len(one_session), ms(one_session, 50), ms(one_session, 99),
         f"{ms(one_session, 50) - ms(in_process, 50):.2f} / {ms(one_session, 99) - ms(in_process, 99):.2f}"),
        (f"OpenEnv async client, {args.sessions} sessions", result["steps"], result["p50_ms"], result["p99_ms"],
         f"{result['p50_ms'] - ms(in_process, 50):.2f} / {result['p99_ms'] - ms(in_process, 99):.2f}"),
    ]
    print(f"env server load test: {args.env_id}, {args.sessions} sessions for {result['seconds']:.0f} s on loopback "
          f"({os.cpu_count()} CPUs, shared)")
    print(f"{'path':<40} {'steps':>8} {'p50 ms':>8} {'p99 ms':>8}   overhead p50 / p99 ms")
    for name, n, p50, p99, overhead in rows:
        print(f"{name:<40} {n:>8} {p50:>8.3f} {p99:>8.3f}   {overhead}")
    print(f"throughput under load: {result['steps_per_s']:.0f} steps/s; errors: {result['errors']} "
          f"{result['first_errors']}; mean in-process step {1000 * statistics.fmean(in_process):.3f} ms")
    print(f"CPU per step (load-independent): in-process {in_process_cpu_ms:.3f} ms (resets included); under load "
          f"server {result['server_cpu_ms_per_step']:.3f} ms + client {result['client_cpu_ms_per_step']:.3f} ms")
    print(f"server before: {result['before']}")
    print(f"server after:  {result['after']}")
    print(f"leaks: {result['leaks'] or 'none'}")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        from _results import figure, write_results

        slower = "ratio is agentgym / baseline latency (lower is better)"
        write_results("env_server", [
            figure(f"{args.env_id} steps through `agentgym serve-env` (OpenEnv protocol, loopback), Remote-v0, 1 session; "
                   "baseline: in-process env.step", ms(one_session, 50), ms(in_process, 50), unit="ms p50",
                   note=f"{slower}; overhead +{ms(one_session, 50) - ms(in_process, 50):.2f} ms p50, "
                        f"+{ms(one_session, 99) - ms(in_process, 99):.2f} ms p99"),
            figure(f"same, OpenEnv async client, {args.sessions} sessions for {result['seconds']:.0f} s; baseline: "
                   "in-process env.step", result["p50_ms"], ms(in_process, 50), unit="ms p50",
                   note=f"{slower}; {result['steps_per_s']:.0f} steps/s under load"),
            figure(f"{args.sessions} sessions: errors and leaks (sessions, envs, fds, threads, children after the load)",
                   result["errors"] + len(result["leaks"] or []), unit="count", goal="0 errors, no leaks",
                   met=not result["leaks"] and not result["errors"], note=f"leaks: {result['leaks'] or 'none'}"),
            figure("CPU per step: server + client under load; baseline: in-process (resets included)",
                   result["server_cpu_ms_per_step"] + result["client_cpu_ms_per_step"], in_process_cpu_ms,
                   unit="CPU ms/step", note=f"server {result['server_cpu_ms_per_step']:.3f} ms + client "
                                           f"{result['client_cpu_ms_per_step']:.3f} ms; lower is better"),
        ])
    return 1 if result["leaks"] or result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
