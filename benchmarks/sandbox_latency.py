"""Per-call latency of the Python sandbox against three per-call-process baselines, in one run.

Methods (same code strings, same machine, interleaved in rounds so background load hits all of them):

* ``ours``: one :class:`SandboxSession` on a bwrap worker (all namespaces, caps dropped, uid 65534,
  pids + memory cgroup, rlimits); the warm parent forked the episode's child once, each call is a
  message over a Unix socket to that child. Full isolation on every call.
* ``(a) python -c``: ``subprocess.run([python, "-I", "-c", code])`` per call, no isolation at all.
* ``(b) bwrap python -c``: the same bwrap flags as ours (without the cgroup, which only adds cost) wrapped
  around a fresh ``python -I -c code`` per call: isolated, but a new interpreter every time.
* ``(c) fresh + numpy``: ``python -I -c "import numpy; <code>"`` per call, no isolation: what it costs
  to give each call a fresh interpreter with numpy ready.

Codes: ``trivial`` (``x = 1``) and ``numpy`` (a small array computation, numpy already imported in the
session; baselines import it on every call, which is exactly their cost).

Then throughput: calls/s of trivial code with 8 concurrent episodes (8 threads, 8 sessions), ours vs (b).

Then episode start: ``reset()`` plus the first call of the next episode on the same pool, after an episode
that imported numpy and wrote a file. This includes the host-side cleanup between episodes (kill every
episode process from outside, empty /work, /tmp and /dev/shm, check the cgroup against its launch baseline).

Target: p50 under 5 ms for trivial code with full isolation, at least 5x faster than (b).

Run: python benchmarks/sandbox_latency.py [--calls 400] [--baseline-calls 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from agentgym.tools.sandbox import SandboxConfig, SandboxPool
from agentgym.tools.sandbox.backends import BwrapBackend, _zygote_argv

CODES = {
    "trivial": ("x = 1", "x = 1"),
    "numpy": ("a = np.arange(1000.0); float((a * a).sum())",
              "import numpy as np; a = np.arange(1000.0); float((a * a).sum())"),
}


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000  # noqa: E731
    return pick(0.50), pick(0.95), pick(0.99)


def bwrap_python_c_prefix() -> list[str]:
    """Our bwrap flags, with a fresh ``python -I -c`` instead of the warm parent."""
    config = SandboxConfig()
    cmd = BwrapBackend().command("/tmp", config)
    return cmd[: len(cmd) - len(_zygote_argv(config.preload))] + [sys.executable, "-I", "-c"]


def time_calls(call: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def run_checked(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"baseline failed: {' '.join(argv[-3:])}: {result.stderr.decode()[-300:]}")


def throughput(make_call: Callable[[], Callable[[], object]], episodes: int, seconds: float) -> float:
    counts = [0] * episodes
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        call = make_call()
        while time.monotonic() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(episodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    from _results import figure, write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400, help="calls per round for our sandbox")
    parser.add_argument("--baseline-calls", type=int, default=40, help="calls per round for each baseline")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    parser.add_argument("--episodes", type=int, default=100, help="episodes for the episode-start measurement")
    args = parser.parse_args()
    if min(args.calls, args.baseline_calls, args.rounds, args.episodes) < 1 or args.seconds <= 0:
        parser.error("--calls, --baseline-calls, --rounds and --episodes must be >= 1 and --seconds > 0")

    bwrap_prefix = bwrap_python_c_prefix()
    samples: dict[tuple[str, str], list[float]] = {}
    with SandboxPool(SandboxConfig(backend="bwrap", max_workers=16)) as pool:
        session = pool.session()
        session.run("import numpy as np")
        for _ in range(args.rounds):
            for code_name, (warm_code, fresh_code) in CODES.items():
                methods: dict[str, tuple[Callable[[], object], int]] = {
                    "ours": (lambda c=warm_code: session.run(c), args.calls),
                    "(a) python -c": (lambda c=fresh_code: run_checked([sys.executable, "-I", "-c", c]),
                                      args.baseline_calls),
                    "(b) bwrap python -c": (lambda c=fresh_code: run_checked([*bwrap_prefix, c]), args.baseline_calls),
                }
                if code_name == "trivial":
                    methods["(c) fresh + numpy"] = (
                        lambda: run_checked([sys.executable, "-I", "-c", "import numpy; x = 1"]), args.baseline_calls)
                for method, (call, n) in methods.items():
                    call()  # warm-up (page cache, worker spawn)
                    samples.setdefault((code_name, method), []).extend(time_calls(call, n))
        assert session.run("print(x)").stdout == "1\n", "state did not persist across calls"
        session.close()

        episode = pool.session()
        episode_starts = []
        for _ in range(args.episodes):
            episode.run("import numpy as np\nopen('/tmp/scratch', 'w').write(str(np.arange(10)))")
            start = time.perf_counter()
            episode.reset()
            episode.run("x = 1")
            episode_starts.append(time.perf_counter() - start)
        episode.close()

        pool.prewarm(8)
        ours_tput = throughput(lambda: (lambda s=pool.session(): s.run("x = 1")), 8, args.seconds)
        base_tput = throughput(lambda: (lambda: run_checked([*bwrap_prefix, "x = 1"])), 8, args.seconds)

    print(f"\nSandbox per-call latency on {os.cpu_count()} cores (ms; {args.rounds} interleaved rounds)")
    header = f"  {'code':<8} {'method':<22} {'calls':>6} {'p50':>8} {'p95':>8} {'p99':>8}"
    print(header + "\n  " + "-" * (len(header) - 2))
    for (code_name, method), values in samples.items():
        p50, p95, p99 = percentiles(values)
        print(f"  {code_name:<8} {method:<22} {len(values):>6} {p50:>8.2f} {p95:>8.2f} {p99:>8.2f}")
    ours_p50 = percentiles(samples[("trivial", "ours")])[0]
    bwrap_p50 = percentiles(samples[("trivial", "(b) bwrap python -c")])[0]
    speedup = bwrap_p50 / ours_p50
    print(f"\n  trivial p50: ours {ours_p50:.2f} ms vs (b) {bwrap_p50:.2f} ms -> {speedup:.0f}x faster "
          f"(target: < 5 ms and >= 5x: {'MET' if ours_p50 < 5 and speedup >= 5 else 'NOT MET'})")
    print(f"  numpy p50: ours {percentiles(samples[('numpy', 'ours')])[0]:.2f} ms vs "
          f"(b) {percentiles(samples[('numpy', '(b) bwrap python -c')])[0]:.2f} ms")
    print(f"\n  8 concurrent episodes, trivial code: ours {ours_tput:,.0f} calls/s vs (b) {base_tput:,.1f} calls/s "
          f"-> {ours_tput / base_tput:.0f}x")
    print(f"  (stdev of ours trivial: {statistics.pstdev(samples[('trivial', 'ours')]) * 1000:.3f} ms)")
    p50, p95, p99 = percentiles(episode_starts)
    print(f"\n  episode start (host-side cleanup + fork + first call), {len(episode_starts)} episodes: "
          f"p50 {p50:.2f} ms, p95 {p95:.2f} ms, p99 {p99:.2f} ms")
    numpy_ours = percentiles(samples[("numpy", "ours")])[0]
    numpy_bwrap = percentiles(samples[("numpy", "(b) bwrap python -c")])[0]
    faster = "ratio is baseline / agentgym latency (higher is better)"
    write_results("sandbox_latency", [
        figure("python sandbox call `x = 1`, one episode's session (bwrap, full isolation); baseline: (b) bwrap ... "
               "python -c per call", ours_p50, bwrap_p50, unit="ms p50", ratio=speedup, goal="p50 < 5 ms and >= 5x",
               met=ours_p50 < 5 and speedup >= 5, note=faster),
        figure("python sandbox call, small numpy computation; baseline: (b) bwrap ... python -c per call", numpy_ours,
               numpy_bwrap, unit="ms p50", ratio=numpy_bwrap / numpy_ours, note=faster),
        figure("8 concurrent episodes, trivial code; baseline: (b) bwrap ... python -c per call", ours_tput, base_tput,
               unit="calls/s", ratio=ours_tput / base_tput),
        figure(f"episode start (host-side cleanup + fork + first call), {len(episode_starts)} episodes", p50,
               unit="ms p50", note=f"p95 {p95:.2f} ms, p99 {p99:.2f} ms"),
    ])


if __name__ == "__main__":
    main()
