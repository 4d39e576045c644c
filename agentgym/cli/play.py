"""``agentgym play ENV_ID``: act in an environment yourself, one line of input per action.

``ENV_ID`` may be any registered id (``agentgym list``), an id a suite YAML registers (its ``entry_point``:
``--suite path/to/suite.yaml``, or found among the shipped and plugin suites), or a suite itself (a name or a YAML
path), whose env is then played on one of its tasks (``--split``, ``--task``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``play`` command to the ``agentgym`` subcommands ``sub``."""
    p = sub.add_parser("play", help="act in an environment yourself, from the terminal",
                       description="Act in an environment yourself, one line of input per action. ENV_ID is an id "
                                   "from 'agentgym list', an id a suite YAML registers, or a suite (name or .yaml).")
    p.add_argument("env_id", help="an id from 'agentgym list' (e.g. agentgym/GuessNumber-v0), an env id a suite YAML "
                                  "registers, or a suite name / .yaml path")
    p.add_argument("--suite", default=None, help="load this suite first (registers its env; tasks come from it)")
    p.add_argument("--split", default=None, help="with a suite: the split to take the task from (default: test, "
                                                 "else the first)")
    p.add_argument("--task", type=int, default=0, help="with a suite: the task's index in the split (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def _resolve(args: argparse.Namespace) -> tuple[str, Any]:
    """``(env_id, suite or None)``: registers a suite's env on the way; unknown ids fail with a 'did you mean'."""
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the catalogue ids
    from agentgym.errors import TaskError
    from agentgym.registration.suites import list_suites, load_suite

    suite = None
    if args.suite is not None:
        try:
            suite = load_suite(args.suite)
        except TaskError as exc:
            raise ConfigError(str(exc)) from None
    env_id = args.env_id
    looks_like_suite = env_id.endswith((".yaml", ".yml", ".jsonl")) or (suite is None and env_id in list_suites())
    if looks_like_suite and env_id not in gym.registry:
        try:
            suite = load_suite(env_id)
        except TaskError as exc:
            raise ConfigError(str(exc)) from None
        return suite.env_id, suite
    if env_id not in gym.registry and not env_id.startswith("agentgym"):
        found = _suite_registering(env_id)  # an id a shipped or plugin suite registers when it loads
        if found is not None:
            try:
                suite = suite or load_suite(str(found))
            except TaskError as exc:
                raise ConfigError(str(exc)) from None
    if env_id.startswith("agentgym"):
        from agentgym.registration.catalogue import get_entry

        get_entry(env_id)  # RegistrationError with a 'did you mean' for unknown agentgym ids
    if env_id not in gym.registry:
        known = sorted(gym.registry)
        hint = did_you_mean(env_id, [k for k in known if "/" in k or k.startswith("agentgym")] + list_suites())
        raise ConfigError(f"Unknown environment id {env_id!r}.{hint} Run 'agentgym list' to see all ids; an env that "
                          "a suite YAML registers (entry_point) plays with --suite PATH.yaml or by the suite's path.")
    return env_id, suite if suite is not None and suite.env_id == env_id else None


def _suite_registering(env_id: str) -> Path | None:
    """The shipped or plugin suite file whose ``entry_point`` registers ``env_id`` (see :mod:`agentgym.cli.env_lookup`)."""
    from agentgym.cli.env_lookup import suite_registering

    return suite_registering(env_id)


def _task(suite: Any, args: argparse.Namespace) -> Any:
    splits = list(suite.splits)
    split = args.split or ("test" if "test" in splits else splits[0])
    if split not in suite.splits:
        raise ConfigError(f"Suite {suite.name!r} has no split {split!r}; choose one of {sorted(splits)}.")
    tasks = suite.split(split)
    if not 0 <= args.task < len(tasks):
        raise ConfigError(f"--task {args.task}: split {split!r} of {suite.name!r} has tasks 0..{len(tasks) - 1}.")
    return tasks[args.task]


def run(args: argparse.Namespace) -> int:
    """Read actions from stdin until the episode ends, ``:q`` or end of input; ``:tools`` lists the tools."""
    import agentgym
    from agentgym.utils.terminal import TerminalSafeWriter

    env_id, suite = _resolve(args)
    options = {"task": _task(suite, args)} if suite is not None else None
    env = suite.make_env() if suite is not None else agentgym.make(env_id)
    try:
        observation, info = env.reset(seed=args.seed, options=options)
        out = TerminalSafeWriter(sys.stdout)  # env text may hold terminal escape sequences
        out.write(f"== {env_id} (task {info.get('task_id', '?')}) ==\n{info.get('instructions', '')}\n\n")
        out.write("Type an action and press Enter. ':q' quits, ':tools' lists tools.\n\n")
        while True:
            out.write(f"{_obs_text(observation)}\n> ")
            out.flush()
            line = sys.stdin.readline()
            if not line or line.strip() == ":q":
                out.write("\nbye\n")
                return 0
            if line.strip() == ":tools":
                out.write(json.dumps(info.get("tools", []), indent=1) + "\n")
                continue
            observation, reward, terminated, truncated, step_info = env.step(line.rstrip("\n"))
            kind = step_info.get("turn", {}).get("kind", "step") if isinstance(step_info, dict) else "step"
            out.write(f"[{kind}] reward={reward:g}\n")
            if terminated or truncated:
                out.write(f"{_obs_text(observation)}\nepisode over: {json.dumps(step_info.get('outcome', {}))}\n")
                return 0
    finally:
        env.close()


def _obs_text(observation: Any) -> str:
    return str(observation.get("text", "")) if isinstance(observation, dict) else str(observation)

