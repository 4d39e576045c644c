"""SWE episodes: setup time and run_tests time per sandbox backend, against a naive per-episode baseline.

* ``bwrap`` / ``docker``: ``SWEEnv.reset`` (lease a warm sandbox, send it the buggy repo without the hidden
  tests and write it into the work dir, commit a git baseline), one
  ``run_tests`` call on a visible test file (pytest in a subprocess inside the sandbox), then the reference
  fix and ``submit``: grading (stage and diff the agent's tree, then in a fresh sandbox session rebuild the
  buggy tree, apply the patch, restore everything but package source modules, run FAIL_TO_PASS, PASS_TO_PASS
  and the visible tests under ``python -I``). The visible-tests baseline of each task is measured once per
  process (in the warm-up episodes); its cost is reported separately as "first grade".
* ``naive``: what a simple harness does per episode: copy the repo to a temp dir, write the buggy file and
  create a fresh virtualenv (``python -m venv --system-site-packages``, so pytest is there), then run the
  same test file with that venv's python; its "grade" runs FAIL_TO_PASS + PASS_TO_PASS in place in that
  same tree (no isolation at all: a conftest.py the agent wrote would be loaded).

Docker is measured when a daemon answers (``DOCKER_HOST``); otherwise its rows are skipped with a note.

Run: python benchmarks/swe.py [--episodes 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentgym.envs.swe.env import SWEEnv
from agentgym.registration.suites import load_suite
from agentgym.tasks.swe.builder import SweTaskSpec
from agentgym.tasks.swe.libraries import fetch_library, get_library


def naive_episode(spec: SweTaskSpec, test_file: str) -> tuple[float, float, float]:
    lib = get_library(spec.library)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="naive-swe-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(fetch_library(spec.library), repo, symlinks=True)
        for path, text in spec.buggy_files(fetch_library(spec.library)).items():
            (repo / path).write_text(text, encoding="utf-8")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(Path(tmp) / "venv")], check=True)
        setup = time.perf_counter() - start
        python = str(Path(tmp) / "venv" / "bin" / "python")
        timings = []
        for args in ([test_file], [*spec.fail_to_pass, *spec.pass_to_pass]):
            start = time.perf_counter()
            subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *args],
                           cwd=repo, capture_output=True, check=False,
                           env={"PYTHONPATH": lib.python_path, "PATH": "/usr/bin:/bin"})
            timings.append(time.perf_counter() - start)
        return setup, timings[0], timings[1]


def env_episode(env: SWEEnv, task, test_file: str) -> tuple[float, float, float]:
    start = time.perf_counter()
    env.reset(options={"task": task})
    setup = time.perf_counter() - start
    start = time.perf_counter()
    obs = env.step(f'run_tests("{test_file}")')[0]
    if "passed" not in obs and "failed" not in obs:
        raise SystemExit(f"run_tests did not run: {obs[:300]}")
    run = time.perf_counter() - start
    env.step(env.unwrapped.reference_solver()(obs))
    start = time.perf_counter()
    _, reward, _, _, info = env.step("submit()")
    if reward != 1.0:
        raise SystemExit(f"the reference fix did not grade as solved: {info['turn'].get('grading')}")
    return setup, run, time.perf_counter() - start


def docker_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "version"], capture_output=True, check=False).returncode == 0


def main() -> None:
    from _results import figure, write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10, help="episodes per method (smoke tasks, cycled)")
    args = parser.parse_args()
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    tasks = list(load_suite("swe-smoke").test)
    plan = [(tasks[i % len(tasks)], SweTaskSpec.from_dict(tasks[i % len(tasks)].metadata["spec"]))
            for i in range(args.episodes)]
    backends = ["bwrap"] + (["docker"] if docker_available() else [])
    results: dict[str, list[tuple[float, float, float]]] = {b: [] for b in [*backends, "naive"]}
    first: dict[str, list[float]] = {b: [] for b in backends}
    envs = {b: SWEEnv(backend=b) for b in backends}
    try:
        for backend, env in envs.items():  # warm-up: first sandbox per library, image builds, visible baselines
            for task, spec in plan[: len(tasks)]:
                first[backend].append(env_episode(env, task, spec.visible_tests[0])[2])
        for task, spec in plan:  # interleaved so background load hits every method alike
            for backend, env in envs.items():
                results[backend].append(env_episode(env, task, spec.visible_tests[0]))
            results["naive"].append(naive_episode(spec, spec.visible_tests[0]))
    finally:
        for env in envs.values():
            env.close()

    print(f"\nSWE episode costs over {args.episodes} smoke episodes (median seconds)")
    print(f"  {'method':<8} {'setup p50':>10} {'setup max':>10} {'run_tests p50':>14} {'grade p50':>10} "
          f"{'grade max':>10} {'first grade p50':>16}")
    for method, values in results.items():
        setups, runs, grades = ([v[i] for v in values] for i in range(3))
        first_grade = f"{statistics.median(first[method]):>16.3f}" if first.get(method) else f"{'-':>16}"
        print(f"  {method:<8} {statistics.median(setups):>10.3f} {max(setups):>10.3f} {statistics.median(runs):>14.3f} "
              f"{statistics.median(grades):>10.3f} {max(grades):>10.3f} {first_grade}")
    naive_setup = statistics.median(v[0] for v in results["naive"])
    figures = []
    for backend in backends:
        ours = statistics.median(v[0] for v in results[backend])
        print(f"  setup: {backend} is {naive_setup / ours:.1f}x faster than the naive copy + venv")
        figures.append(figure(f"SWE episode setup (lease a warm sandbox, send the buggy repo, git baseline), {backend}, "
                              f"{args.episodes} swe-smoke episodes; baseline: copy + venv per episode", ours,
                              naive_setup, unit="s p50", ratio=naive_setup / ours,
                              note="ratio is baseline / agentgym time (higher is better)"))
        for i, part in ((1, "run_tests on a visible test file"), (2, "grading the reference fix")):
            mine = statistics.median(v[i] for v in results[backend])
            theirs = statistics.median(v[i] for v in results["naive"])
            figures.append(figure(f"SWE {part}, {backend}; baseline: naive pytest in place", mine, theirs, unit="s p50",
                                  note="agentgym's grading runs in a fresh sandbox and adds the visible tests; "
                                       "lower is better" if i == 2 else "lower is better"))
        figures.append(figure(f"SWE first grade per task (finds the visible tests that pass on the buggy tree), {backend}",
                              statistics.median(first[backend]), unit="s p50"))
    if "docker" not in backends:
        print("  (docker rows skipped: no Docker daemon answers; start dockerd or set DOCKER_HOST)")
    write_results("swe", figures, note=None if "docker" in backends else
                  "docker rows skipped: no Docker daemon answered")


if __name__ == "__main__":
    main()
