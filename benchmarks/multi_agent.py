"""Env steps per second of the multi-agent games, against a naive rebuild-every-turn loop, in one run.

For each game, scripted players (each game's rule-based bot: win/block for the board games, capture-first
for chess, the aspiration negotiator, the literal speaker/listener, tit for tat) play whole games through
the text API: every turn the player to move reads its text observation (board, legal moves), its bot
picks a move, and the move goes to ``step`` as text. Two ways of driving the same games:

* ``ours``: one env per game, updated in place (PettingZoo AEC / Parallel API).
* ``naive``: what a stateless text-game server does: every turn it rebuilds the game from the seed and the
  move history (a fresh env, ``reset`` and a replay of every earlier move), then renders the observation
  and applies the new move. Same games, same moves, same bots.

A second table measures Stockfish as an opponent: ``agentgym/Chess-vs-Stockfish-v0`` (one persistent
UCI process per env) against starting a fresh ``stockfish`` process for every engine move (handshake,
position, search, quit), with the same learner (the capture-first bot) and the same skill-0 settings.

Run: python benchmarks/multi_agent.py [--games 20] [--stockfish-games 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from agentgym.envs.multi_agent import make_multi_agent, make_multi_agent_parallel
from agentgym.envs.multi_agent.selfplay import ChessVsStockfishEnv
from agentgym.envs.multi_agent.stockfish import find_stockfish

AEC_GAMES = ["agentgym/TicTacToe-v0", "agentgym/ConnectFour-v0", "agentgym/Chess-v0", "agentgym/Negotiation-v0",
             "agentgym/Referential-v0", "agentgym/PrisonersDilemma-v0"]


def play_aec_ours(env_id: str, seeds: list[int]) -> tuple[int, float]:
    """Whole games on one env (built once, outside the timing); returns (steps, seconds)."""
    env = make_multi_agent(env_id)
    steps, start = 0, time.perf_counter()
    for seed in seeds:
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        while not env.game_over:
            agent = env.agent_selection
            env.observe(agent)  # the text the player reads
            env.step(env.scripted_action(agent, rng))
            steps += 1
    elapsed = time.perf_counter() - start
    env.close()
    return steps, elapsed


def play_aec_naive(env_id: str, seeds: list[int]) -> tuple[int, float]:
    """The same games, rebuilding the game from seed + history before every move."""
    steps, start = 0, time.perf_counter()
    for seed in seeds:
        rng = np.random.default_rng(seed)
        history: list[str] = []
        while True:
            env = make_multi_agent(env_id)
            env.reset(seed=seed)
            for action in history:
                env.step(action)
            if env.game_over:
                break
            agent = env.agent_selection
            env.observe(agent)
            action = env.scripted_action(agent, rng)
            env.step(action)
            history.append(action)
            steps += 1
            env.close()
    return steps, time.perf_counter() - start


def play_parallel(seeds: list[int], naive: bool) -> tuple[int, float]:
    """Prisoner's dilemma, simultaneous form; ``naive`` rebuilds from the history every round."""
    env = make_multi_agent_parallel("agentgym/PrisonersDilemma-v0")
    steps, start = 0, time.perf_counter()
    for seed in seeds:
        rng = np.random.default_rng(seed)
        history: list[dict[str, str]] = []
        obs, _ = env.reset(seed=seed)
        while env.agents:
            if naive:
                env = make_multi_agent_parallel("agentgym/PrisonersDilemma-v0")
                obs, _ = env.reset(seed=seed)
                for actions in history:
                    obs, *_ = env.step(actions)
            actions = {a: env.scripted_action(a, rng) for a in env.agents}
            _ = [obs[a]["text"] for a in env.agents]
            obs, *_ = env.step(actions)
            history.append(actions)
            steps += 1
    return steps, time.perf_counter() - start


class _FreshProcessStockfish:
    """Baseline engine: one new stockfish process per move, driven with the same UCI commands."""

    def __init__(self) -> None:
        self.binary = find_stockfish()

    def best_move(self, moves: list[str]) -> str:
        script = "uci\nsetoption name Skill Level value 0\nisready\n"
        script += "position startpos" + (" moves " + " ".join(moves) if moves else "") + "\ngo depth 1\n"
        proc = subprocess.Popen([self.binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(script)
        proc.stdin.flush()
        move = ""
        for line in proc.stdout:
            if line.startswith("bestmove"):
                move = line.split()[1]
                break
        proc.stdin.write("quit\n")
        proc.stdin.close()
        proc.wait()
        return move


def play_vs_stockfish(seeds: list[int], fresh_process: bool) -> tuple[int, float]:
    """The learner (capture-first bot) against Stockfish skill 0 as White; returns learner steps."""
    env = ChessVsStockfishEnv(learner="player_0", deterministic=not fresh_process)
    fresh = _FreshProcessStockfish() if fresh_process else None
    if fresh is not None:
        # Swap the opponent's engine for the per-move process; everything else stays identical.
        env.stockfish.engine.best_move = lambda moves, **_: fresh.best_move(list(moves))  # type: ignore[method-assign]
    steps, start = 0, time.perf_counter()
    for seed in seeds:
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        done = False
        while not done:
            action = env.game.scripted_action(env.learner, rng)
            _, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            steps += 1
    elapsed = time.perf_counter() - start
    env.close()
    return steps, elapsed


def row(name: str, ours: tuple[int, float], naive: tuple[int, float]) -> str:
    ours_rate, naive_rate = ours[0] / ours[1], naive[0] / naive[1]
    return (f"  {name:<28} {ours[0]:>7} {ours_rate:>12,.0f} {naive_rate:>12,.0f} {ours_rate / naive_rate:>9.1f}x")


def main() -> None:
    from _results import figure, write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=20, help="games per env (same seeds for both methods)")
    parser.add_argument("--stockfish-games", type=int, default=4, help="games against Stockfish per method")
    args = parser.parse_args()
    if args.games < 1 or args.stockfish_games < 0:
        parser.error("--games must be >= 1 and --stockfish-games >= 0")
    seeds = list(range(args.games))

    print(f"\nMulti-agent env steps/s with scripted players ({args.games} games each, {os.cpu_count()} cores)")
    header = f"  {'game':<28} {'steps':>7} {'ours/s':>12} {'naive/s':>12} {'speedup':>10}"
    print(header + "\n  " + "-" * (len(header) - 2))
    runs: list[tuple[str, Callable[[], tuple[int, float]], Callable[[], tuple[int, float]]]] = [
        (env_id.split("/")[1], lambda e=env_id: play_aec_ours(e, seeds), lambda e=env_id: play_aec_naive(e, seeds))
        for env_id in AEC_GAMES
    ]
    runs.append(("PrisonersDilemma-v0 (parallel)", lambda: play_parallel(seeds, False), lambda: play_parallel(seeds, True)))
    figures = []
    for name, ours_fn, naive_fn in runs:
        ours_fn()  # warm-up (imports, OpenSpiel game loading)
        ours = ours_fn()
        naive = naive_fn()
        if ours[0] != naive[0]:
            raise SystemExit(f"{name}: the two methods played different games ({ours[0]} vs {naive[0]} steps)")
        print(row(name, ours, naive))
        figures.append(figure(f"{name}, {args.games} games with scripted players; baseline: rebuild the game every turn",
                              ours[0] / ours[1], naive[0] / naive[1], unit="env steps/s"))

    if args.stockfish_games:
        try:
            find_stockfish()
        except Exception as exc:  # noqa: BLE001
            print(f"\n  (Stockfish table skipped: {exc})")
            write_results("multi_agent", figures, note=f"Stockfish rows skipped: {exc}")
            return
        sf_seeds = list(range(args.stockfish_games))
        ours: Any = play_vs_stockfish(sf_seeds, fresh_process=False)
        naive: Any = play_vs_stockfish(sf_seeds, fresh_process=True)
        print(f"\nChess-vs-Stockfish-v0, learner steps/s ({args.stockfish_games} games, Stockfish skill 0, depth 1)")
        print(f"  {'method':<40} {'steps':>7} {'steps/s':>10}")
        print(f"  {'ours: one UCI process per env':<40} {ours[0]:>7} {ours[0] / ours[1]:>10,.1f}")
        print(f"  {'naive: a new stockfish process per move':<40} {naive[0]:>7} {naive[0] / naive[1]:>10,.1f}")
        print(f"  speedup: {(ours[0] / ours[1]) / (naive[0] / naive[1]):.1f}x (games differ: the baseline's engine is "
              "not seeded)")
        figures.append(figure(f"Chess-vs-Stockfish-v0, {args.stockfish_games} games (skill 0, depth 1), learner steps; "
                              "baseline: a new stockfish process per move", ours[0] / ours[1], naive[0] / naive[1],
                              unit="learner steps/s", note="games differ: the baseline's engine is not seeded"))
    write_results("multi_agent", figures)


if __name__ == "__main__":
    main()
