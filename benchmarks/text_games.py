"""Text-game env cost: agentgym's TextWorld-v0 / ScienceWorld-v0 steps against each package's own loop, in one run.

Both sides play the same games with the same commands (the reference solver's, recorded once from the env) and
request the same information from the simulator, so the difference is agentgym's own work per step: parsing the
model text, the tool call, cleaning the observation, the reward bookkeeping and ``state_key``.

* TextWorld: ``textworld.start(game, EnvInfos(score, won, lost, facts, policy_commands, ...))`` and
  ``env.step(command)`` against ``gym.make("agentgym/TextWorld-v0").step('<tool_call>...')`` (with ``state_key``
  read after every step, as the rollout engine does for GiGPO).
* ScienceWorld: ``ScienceWorldEnv.step(action)`` against ``gym.make("agentgym/ScienceWorld-v0").step(...)``.

CPU time of this process is reported next to wall time: the simulators run in-process (TextWorld) or in a JVM
(ScienceWorld, whose CPU is not counted here), and the machine is shared, so compare ratios within one run.

Run: python benchmarks/text_games.py [--rounds 3] [--repeats 5] [--only textworld|scienceworld]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import gymnasium as gym

import agentgym  # noqa: F401 - registers the ids


def _reference_actions(env: Any, task: Any) -> list[str]:
    obs, _ = env.reset(seed=0, options={"task": task})
    solver = env.unwrapped.reference_solver()
    actions, done = [], False
    while not done:
        action = solver(obs)
        actions.append(action)
        obs, _, term, trunc, _ = env.step(action)
        done = term or trunc
    return actions


def _command_of(action: str) -> str:
    body = action.split("<tool_call>", 1)[1].rsplit("</tool_call>", 1)[0]
    return str(next(iter(json.loads(body)["arguments"].values())))


def _time(fn: Any) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_textworld(rounds: int, repeats: int) -> list[tuple[str, float, float, int]]:
    import textworld

    from agentgym.envs.textworld.games import GameSpec, game_path, task_for

    specs = [GameSpec("cooking", 2, "train", 0), GameSpec("cooking", 1, "train", 0),
             GameSpec("household", 1, "train", 0)]
    tasks = [task_for(s) for s in specs]
    env = gym.make("agentgym/TextWorld-v0")
    plans = [(task, _reference_actions(env, task)) for task in tasks]
    infos = textworld.EnvInfos(score=True, max_score=True, won=True, lost=True, facts=True, policy_commands=True,
                               extras=["walkthrough"])
    raw_envs = [textworld.start(str(game_path(s)), request_infos=infos) for s in specs]
    steps = repeats * sum(len(p) for _, p in plans)

    def ours() -> None:
        for task, actions in plans * repeats:
            env.reset(seed=0, options={"task": task})
            for action in actions:
                env.step(action)
                env.unwrapped.state_key()

    def theirs() -> None:
        for raw, (_, actions) in list(zip(raw_envs, plans)) * repeats:
            raw.reset()
            for action in actions:
                raw.step(_command_of(action))

    rows = []
    for name, fn in (("TextWorld-v0", ours), ("textworld.start loop", theirs)):
        best = min((_time(fn) for _ in range(rounds)), key=lambda t: t[0])
        rows.append((name, steps / best[0], steps / max(best[1], 1e-9), steps))
    env.close()
    for raw in raw_envs:
        raw.close()
    return rows


def bench_scienceworld(rounds: int, repeats: int) -> list[tuple[str, float, float, int]]:
    from scienceworld import ScienceWorldEnv

    from agentgym.envs.scienceworld.env import task_for

    tasks = [task_for("find-living-thing", 0, "train"), task_for("boil", 0, "train")]
    env = gym.make("agentgym/ScienceWorld-v0")
    plans = [(task, _reference_actions(env, task)) for task in tasks]
    raw = ScienceWorldEnv("", envStepLimit=10_000)
    steps = repeats * sum(len(p) for _, p in plans)

    def ours() -> None:
        for task, actions in plans * repeats:
            env.reset(seed=0, options={"task": task})
            for action in actions:
                env.step(action)
                env.unwrapped.state_key()

    def theirs() -> None:
        for task, actions in plans * repeats:
            raw.load(task.metadata["task_name"], int(task.metadata["variation"]), "", generateGoldPath=False)
            raw.reset()
            for action in actions:
                raw.step(_command_of(action))

    rows = []
    for name, fn in (("ScienceWorld-v0", ours), ("ScienceWorldEnv loop", theirs)):
        best = min((_time(fn) for _ in range(rounds)), key=lambda t: t[0])
        rows.append((name, steps / best[0], steps / max(best[1], 1e-9), steps))
    env.close()
    raw.close()
    return rows


def main() -> None:
    from _results import figure, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per side; the fastest is reported.")
    parser.add_argument("--repeats", type=int, default=5, help="Episodes of each game per round.")
    parser.add_argument("--only", choices=["textworld", "scienceworld"], default=None)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    rows: list[tuple[str, float, float, int]] = []
    if args.only in (None, "textworld"):
        rows += bench_textworld(args.rounds, args.repeats)
    if args.only in (None, "scienceworld"):
        rows += bench_scienceworld(args.rounds, args.repeats)
    print(f"{'loop':<24} {'steps':>6} {'steps/s (wall)':>15} {'steps/s (CPU)':>14}")
    for name, wall, cpu, steps in rows:
        print(f"{name:<24} {steps:>6} {wall:>15.1f} {cpu:>14.1f}")
    for ours, theirs in zip(rows[::2], rows[1::2]):
        print(f"{ours[0]}: {ours[1] / theirs[1]:.2f}x the steps/s of {theirs[0]} (wall; >1 is faster)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    write_results("text_games", [
        figure(f"{ours[0]}, {ours[3]} reference-solver steps a round, best of {args.rounds}; baseline: {theirs[0]}",
               ours[1], theirs[1], unit="steps/s (wall)", ratio=ours[1] / theirs[1],
               note=f"CPU: {ours[2]:.1f} vs {theirs[2]:.1f} steps/s")
        for ours, theirs in zip(rows[::2], rows[1::2])])


if __name__ == "__main__":
    main()
