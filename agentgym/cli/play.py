"""``agentgym play ENV_ID``: act in an environment yourself, one line of input per action."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``play`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("play", help="act in an environment yourself, from the terminal")
    p.add_argument("env_id", help="an id from 'agentgym list', e.g. agentgym/GuessNumber-v0")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read actions from stdin until the episode ends, ``:q`` or end of input; ``:tools`` lists the tools."""
    import agentgym
    from agentgym.utils.terminal import TerminalSafeWriter

    env = agentgym.make(args.env_id)
    try:
        observation, info = env.reset(seed=args.seed)
        out = TerminalSafeWriter(sys.stdout)  # env text may hold terminal escape sequences
        out.write(f"== {args.env_id} (task {info['task_id']}) ==\n{info['instructions']}\n\n")
        out.write("Type an action and press Enter. ':q' quits, ':tools' lists tools.\n\n")
        while True:
            out.write(f"{_obs_text(observation)}\n> ")
            out.flush()
            line = sys.stdin.readline()
            if not line or line.strip() == ":q":
                out.write("\nbye\n")
                return 0
            if line.strip() == ":tools":
                out.write(json.dumps(info["tools"], indent=1) + "\n")
                continue
            observation, reward, terminated, truncated, step_info = env.step(line.rstrip("\n"))
            out.write(f"[{step_info['turn']['kind']}] reward={reward:g}\n")
            if terminated or truncated:
                out.write(f"{_obs_text(observation)}\nepisode over: {json.dumps(step_info['outcome'])}\n")
                return 0
    finally:
        env.close()


def _obs_text(observation: Any) -> str:
    return str(observation.get("text", "")) if isinstance(observation, dict) else str(observation)
