"""Steps per second of Sokoban-v0 and BabyAI-v0 against their engines' own loops: the cost of our text layer.

Each env runs the same seeded stream of random actions twice: once through ``gym.make("agentgym/...")`` as an
agent would drive it (the action is model text, parsed into a tool call; the observation is rendered text), and
once through the engine underneath with integer actions and no text at all:

* BabyAI: minigrid's own ``gym.make("BabyAI-...")`` loop (``env.step(int)``, the level's array observation);
* Sokoban: our ``Puzzle.push`` (we have no third-party engine: the puzzles and rules are ours).

Both reset to the next task whenever an episode ends, so both loops pay the same level generation. Time is
measured as CPU seconds of this process (``time.process_time``), which does not depend on how busy the machine
is; the best of ``--rounds`` is kept. The ratio of the two is the wrapper's overhead per step.

Run: ``python benchmarks/new_envs.py [--steps 3000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import time
from collections.abc import Callable

import gymnasium as gym

import agentgym  # noqa: F401  (registers the agentgym ids)
from agentgym.envs.games import sokoban
from agentgym.suite import Task


def _best_cpu(run: Callable[[], int], rounds: int) -> tuple[float, int]:
    best = float("inf")
    steps = 0
    for _ in range(rounds):
        start = time.process_time()
        steps = run()
        best = min(best, time.process_time() - start)
    return best, steps


def sokoban_rows(steps: int, rounds: int) -> tuple[float, float]:
    """(ours, engine) CPU seconds per step on 6x6 puzzles with 1-2 boxes."""
    tasks = sokoban.generate_tasks(random.Random(0), 20, boxes=[1, 2])
    names = list(sokoban.DIRECTIONS)
    moves = [names[random.Random(i).randrange(4)] for i in range(steps)]

    def ours() -> int:
        env = gym.make("agentgym/Sokoban-v0", max_turns=10_000)
        k, done = 0, True
        for move in moves:
            if done:
                env.reset(seed=k, options={"task": tasks[k % len(tasks)]})
                k += 1
            _, _, term, trunc, _ = env.step(f'move("{move}")')
            done = term or trunc
        env.close()
        return len(moves)

    def engine() -> int:
        k, puzzle = 0, None
        for move in moves:
            if puzzle is None or puzzle.solved():
                puzzle = sokoban.Puzzle.parse(tasks[k % len(tasks)].metadata["rows"])
                k += 1
            result = puzzle.push(move)
            if result is not None:
                puzzle = result[0]
        return len(moves)

    t_ours, n = _best_cpu(ours, rounds)
    t_engine, _ = _best_cpu(engine, rounds)
    return t_ours / n, t_engine / n


def babyai_rows(steps: int, rounds: int, level: str) -> tuple[float, float]:
    """(ours, minigrid) CPU seconds per step of random actions on ``level``."""
    from agentgym.envs.babyai.env import ACTIONS

    names = list(ACTIONS)[:6]  # done is a no-op in these levels; leave it out of both loops
    actions = [random.Random(i).randrange(len(names)) for i in range(steps)]

    def ours() -> int:
        env = gym.make("agentgym/BabyAI-v0", levels=[level])
        k, done = 0, True
        for a in actions:
            if done:
                env.reset(seed=0, options={"task": Task(f"t{k}", "go", None, {"level": level, "seed": k})})
                k += 1
            _, _, term, trunc, _ = env.step(f"{names[a]}()")
            done = term or trunc
        env.close()
        return len(actions)

    def engine() -> int:
        env = gym.make(level)
        k, done = 0, True
        for a in actions:
            if done:
                with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints rejected level samples
                    env.reset(seed=k)
                k += 1
            _, _, term, trunc, _ = env.step(a)
            done = term or trunc
        env.close()
        return len(actions)

    t_ours, n = _best_cpu(ours, rounds)
    t_engine, _ = _best_cpu(engine, rounds)
    return t_ours / n, t_engine / n


def main() -> None:
    from _results import figure, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="random actions per loop")
    parser.add_argument("--rounds", type=int, default=3, help="repeats; the fastest is kept")
    args = parser.parse_args()
    rows = [("Sokoban-v0 (6x6, 1-2 boxes)", "Puzzle.push", *sokoban_rows(args.steps, args.rounds))]
    for level in ("BabyAI-GoToLocal-v0", "BabyAI-PutNextLocal-v0"):
        rows.append((f"BabyAI-v0 ({level.removeprefix('BabyAI-')})", "minigrid env.step",
                     *babyai_rows(args.steps, args.rounds, level)))
    print(f"{'env':38} {'engine loop':18} {'ours steps/s':>12} {'engine steps/s':>14} {'overhead/step':>14} {'ratio':>6}")
    for name, engine, ours, base in rows:
        print(f"{name:38} {engine:18} {1 / ours:12.0f} {1 / base:14.0f} {(ours - base) * 1e6:11.0f} us "
              f"{ours / base:6.1f}")
    write_results("new_envs", [
        figure(f"{name}, {args.steps} random actions, best of {args.rounds}; baseline: {engine}", 1 / ours, 1 / base,
               unit="steps/s (CPU time)", ratio=ours / base,
               note=f"ratio is CPU time per step, ours / engine (lower is better); +{(ours - base) * 1e6:.0f} us per step")
        for name, engine, ours, base in rows])


if __name__ == "__main__":
    main()
