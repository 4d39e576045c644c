"""The ``agentgym`` command line: list, play, eval, train, serve, serve-env, view, new-env.

Every argument is validated before work starts, and a bad one exits with status 2 and a message that
says how to fix it (never a traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.errors import AgentGymError, ConfigError

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from agentgym.registration.catalogue import all_entries
    from agentgym.registration.env_docs import entry_point_summary
    from agentgym.registration.plugins import plugin_errors
    from agentgym.registration.suites import list_suites

    table = Table(title="agentgym environments")
    table.add_column("id")
    table.add_column("family")
    table.add_column("description")
    for entry in all_entries():  # ours, then those of installed plugins; summaries read from source, no env imported
        table.add_row(entry.id, entry.family, entry.summary)
    console = Console(width=max(100, Console().width))
    console.print(table)
    from agentgym.registration.multi_agent import MULTI_AGENT_CATALOGUE

    games = Table(title="multi-agent games (PettingZoo; agentgym.make_multi_agent)")
    for column in ("id", "forms", "description"):
        games.add_column(column)
    for game in MULTI_AGENT_CATALOGUE:
        games.add_row(game.id, "AEC + parallel" if game.parallel_entry_point else "AEC",
                      entry_point_summary(game.aec_entry_point))
    console.print(games)
    console.print("suites: " + ", ".join(list_suites()))
    for error in plugin_errors():
        console.print(f"[yellow]skipped a broken plugin:[/yellow] {escape(str(error))}", markup=True, highlight=False)
    return 0


def _cmd_play(args: argparse.Namespace) -> int:
    import agentgym

    env = agentgym.make(args.env_id)
    try:
        observation, info = env.reset(seed=args.seed)
        out = sys.stdout
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


def _cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agentgym.policies import SamplingParams, make_policy
    from agentgym.cli.report import render_summary_table, write_html_report
    from agentgym.rollout import (
        RolloutConfig,
        RolloutEngine,
        episodes_for_suite,
        summarize,
    )
    from agentgym.storage import TrajectoryWriter
    from agentgym.registration.suites import load_suite

    suite = load_suite(args.suite)
    if args.split not in suite.splits:
        raise ConfigError(f"Suite {suite.name!r} has no split {args.split!r}; choose one of {sorted(suite.splits)}.")
    defaults: dict[str, Any] = {}
    if args.policy.startswith(("hf:", "vllm:")):
        from agentgym.policies.rollout_defaults import load_rollout_defaults

        defaults = load_rollout_defaults(args.policy.split(":", 1)[1])
    system_prompt = args.system_prompt if args.system_prompt is not None else defaults.get("system_prompt")
    max_tokens = args.max_tokens if args.max_tokens is not None else int(defaults.get("max_tokens", 256))
    sampling = SamplingParams(max_tokens=max_tokens, temperature=args.temperature, seed=args.seed)
    constrain = args.constrain_actions if args.constrain_actions is not None else bool(defaults.get("constrain_actions"))
    config = RolloutConfig(max_in_flight=args.max_in_flight, sampling=sampling,
                           progress=False if args.no_progress else "auto", system_prompt=system_prompt,
                           constrain_actions=constrain)
    out_dir = Path(args.out) if args.out else _new_default_out_dir(suite.name)
    run = {"suite": suite.name, "split": args.split, "policy": args.policy, "seed": args.seed,
           "group_size": args.group_size}
    # The policy loads first: a bad --policy must not leave a half-made run directory behind.
    policy = make_policy(args.policy)
    started = time.perf_counter()
    try:
        previous = _prepare_run_dir(out_dir, run, resume=args.resume, overwrite=args.overwrite)
        done = {(t.task_id, t.seed) for t in previous}
        specs = [s for s in episodes_for_suite(suite, args.split, group_size=args.group_size, seed=args.seed,
                                               limit=args.limit)
                 if (s.task.id if s.task is not None else "", s.seed) not in done]
        console = Console()
        if previous:
            console.print(f"resuming {out_dir}: {len(previous)} episodes already done, {len(specs)} to run")
        with TrajectoryWriter(out_dir / "trajectories.jsonl") as writer:
            trajectories = previous + RolloutEngine(policy, config).run(specs, writer=writer)
    finally:
        policy.close()
    summary = summarize(trajectories)
    summary["write_failures"] = writer.failed
    summary["wall_s"] = time.perf_counter() - started
    summary.update({"suite": suite.name, "split": args.split, "policy": args.policy})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    title = f"{suite.name} [{args.split}] with {args.policy}"
    write_html_report(out_dir / "report.html", summary, trajectories, title)
    console.print(render_summary_table(summary, title=title))
    console.print(f"trajectories: {out_dir / 'trajectories.jsonl'}\nsummary: {out_dir / 'summary.json'}\n"
                  f"report: {out_dir / 'report.html'}")
    return 0


def _new_default_out_dir(suite_name: str) -> Path:
    """``runs/eval-SUITE-TIME``, with ``-2``, ``-3``... when runs started in the same second already made it."""
    base = Path(f"runs/eval-{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


_RUN_FILES = ("trajectories.jsonl", "trajectories.errors.jsonl", "summary.json", "report.html", "run.json")


def _prepare_run_dir(out_dir: Path, run: dict[str, Any], *, resume: bool, overwrite: bool) -> list[Any]:
    """Make ``out_dir`` ready for an eval run and return the trajectories a resumed run already has.

    Appending to an existing run silently duplicated its episodes, so a non-empty directory is refused unless
    the user says what they want: ``--resume`` (keep what is there, run the rest; only with the same suite,
    split, policy, seed and group size) or ``--overwrite`` (delete the previous run's files, nothing else).
    """
    from agentgym.storage import read_trajectories

    existing = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if existing and not (resume or overwrite):
        shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
        raise ConfigError(
            f"{out_dir} is not empty ({shown}). Pass --resume to run only the episodes missing from its "
            "trajectories.jsonl, --overwrite to replace its results, or choose a new --out directory."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file = out_dir / "run.json"
    if overwrite:
        for name in _RUN_FILES:
            (out_dir / name).unlink(missing_ok=True)
    elif resume and run_file.is_file():
        before = json.loads(run_file.read_text(encoding="utf-8"))
        changed = {k: (before.get(k), v) for k, v in run.items() if before.get(k) != v}
        if changed:
            detail = "; ".join(f"{k}: {old!r} then, {new!r} now" for k, (old, new) in changed.items())
            raise ConfigError(f"--resume needs the same settings as the run in {out_dir} ({detail}). Use them, "
                              "or --overwrite to start that run again.")
    run_file.write_text(json.dumps(run, indent=2), encoding="utf-8")
    trajectories = out_dir / "trajectories.jsonl"
    return list(read_trajectories(trajectories)) if resume and trajectories.is_file() else []


def _cmd_train(args: argparse.Namespace) -> int:
    import yaml

    from agentgym.trainers.config import load_config

    config = load_config(args.config)
    overrides: dict[str, Any] = {}
    for item in args.set or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects FIELD=VALUE (e.g. --set steps=10), got {item!r}.")
        overrides[key.strip()] = yaml.safe_load(raw)
    if args.warmstart is not None:
        overrides["warmstart"] = args.warmstart
    if args.output_dir is not None:
        overrides["output_dir"] = args.output_dir
    if overrides:
        config = type(config).from_dict({**config.to_dict(), **overrides})
    from agentgym.trainers import make_trainer

    name = config.display_name
    logging.getLogger("agentgym").setLevel(logging.INFO)
    summary = make_trainer(config).train()
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 evaluates and reports
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    sys.stdout.write(
        f"held-out success: {before.get('success_rate', float('nan')):.3f} before {name} -> "
        f"{after.get('success_rate', float('nan')):.3f} after ({config.output_dir})\n"
    )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.proxy is not None:  # the recording gateway in front of another server (e.g. vllm serve)
        if args.record is None or args.model_dir is not None:
            raise ConfigError("--proxy URL records another server's sessions: give --record DIR and no MODEL_DIR.")
        from agentgym.serving.gateway import run_gateway

        run_gateway(args.proxy, args.record, host=args.host, port=args.port, tokenizer=args.tokenizer)
        return 0
    if args.model_dir is None:
        raise ConfigError("agentgym serve needs a MODEL_DIR (or --proxy URL --record DIR to record another server).")
    from agentgym.serving.openai_server import run_server

    run_server(args.model_dir, host=args.host, port=args.port, model_name=args.model_name,
               max_batch_size=args.max_batch_size, record_dir=args.record)
    return 0


def _cmd_serve_env(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the ids
    from agentgym.registration.catalogue import get_entry

    if args.env_id is None:
        args.env_id = os.environ.get("AGENTGYM_ENV_ID") or None
        if args.env_id is None:
            raise ConfigError("serve-env needs an env id: 'agentgym serve-env agentgym/Calculator-v0' (or set "
                              "AGENTGYM_ENV_ID, as the env-server images do); 'agentgym list' shows the ids.")
    if args.env_id not in gym.registry:
        get_entry(args.env_id)  # unknown id: RegistrationError with "did you mean"
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0 picks a free port), got {args.port}.")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-kwargs must be a JSON object such as '{{\"max_turns\": 5}}', got {args.env_kwargs!r} "
                          f"({exc.msg}).") from None
    if not isinstance(env_kwargs, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object (keyword arguments for gym.make), got {args.env_kwargs!r}.")
    from agentgym.serving.env_server import serve_env
    from agentgym.serving.http import bind_socket

    sock = bind_socket(args.host, args.port)

    def ready(url: str) -> None:
        sys.stdout.write(f"agentgym env server: {args.env_id} on {url} (max {args.max_sessions} sessions; "
                         f"OpenEnv clients connect to {url.replace('http', 'ws', 1)}/ws)\n")
        sys.stdout.flush()

    serve_env(args.env_id, env_kwargs=env_kwargs, max_sessions=args.max_sessions, idle_timeout_s=args.idle_timeout,
              sock=sock, on_ready=ready)
    return 0


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def _cmd_new_env(args: argparse.Namespace) -> int:
    from agentgym.cli.scaffold import write_env_package

    root = write_env_package(args.name, args.dir, force=args.force)
    sys.stdout.write(f"wrote {root}: cd {root} && python -m pytest -q (then pip install -e . to register it)\n")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from agentgym.storage import read_trajectories
    from agentgym.trajectory import utf8_safe

    path = Path(args.path)
    if not path.is_file():
        raise ConfigError(f"No trajectory file at {path}; pass the trajectories.jsonl written by 'agentgym eval'.")
    console = Console()

    def shown(text: str) -> str:  # model text is neither rich markup nor always valid UTF-8
        return escape(utf8_safe(text))

    records = read_trajectories(path)
    viewed = []
    for i in range(args.limit if args.limit is not None else sys.maxsize):
        try:
            traj = next(records, None)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not a trajectory record
            raise ConfigError(_not_a_trajectory_file(path, i + 1, exc)) from None
        if traj is None:
            if i == 0 and path.read_bytes().strip():
                raise ConfigError(_not_a_trajectory_file(path, 1, ValueError("no complete JSON line")))
            break
        viewed.append(traj)
        console.rule(shown(f"{traj.env_id} {traj.task_id} seed={traj.seed} success={traj.success} ({traj.end_reason})"))
        for turn in traj.turns:
            console.print(f"[cyan]observation[/cyan] {shown(turn.observation)}", markup=True, highlight=False)
            for image in turn.images:  # the PNG beside the JSONL; --html shows them inline
                console.print(f"[magenta]image[/magenta] {shown(str(path.parent / image.path))} "
                              f"({image.width}x{image.height})", markup=True, highlight=False)
            console.print(f"[yellow]action[/yellow] ({turn.kind}) {shown(turn.action)}", markup=True, highlight=False)
        if traj.final_observation is not None:
            console.print(f"[cyan]final observation[/cyan] {shown(traj.final_observation)}", markup=True, highlight=False)
            for image in traj.final_images:
                console.print(f"[magenta]image[/magenta] {shown(str(path.parent / image.path))} "
                              f"({image.width}x{image.height})", markup=True, highlight=False)
        if traj.error:
            console.print(f"[red]error[/red] {shown(traj.error)}", markup=True)
    if args.html:
        from agentgym.cli.report import write_html_report
        from agentgym.rollout import summarize

        report = write_html_report(args.html, summarize(viewed), viewed, title=str(path))
        console.print(f"report: {shown(str(report))}", markup=True, highlight=False)
    return 0


def _not_a_trajectory_file(path: Path, record: int, exc: Exception) -> str:
    """The message for a file ``view`` cannot read: where it failed, why, and what to pass instead."""
    why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
    return (f"{path} is not a trajectories file (record {record}: {why}). Pass the trajectories.jsonl that "
            "'agentgym eval' or a trainer wrote (one JSON trajectory per line).")


def _version() -> str:
    """The installed distribution's version (importlib.metadata), else the source tree's ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentgym")
    except PackageNotFoundError:
        import agentgym

        return agentgym.__version__


def _cmd_tasks(args: argparse.Namespace) -> int:
    """``agentgym tasks build|verify swe``: generate or re-check task data (family builders live in tasks/)."""
    if args.family != "swe":
        raise AgentGymError(f"No task builder for {args.family!r}; available: swe.")
    from agentgym.tasks.swe import builder
    from agentgym.tasks.swe.libraries import load_library_file

    for declared in args.library_file or ():  # libraries a user declares, see agentgym.tasks.swe.libraries
        load_library_file(declared)

    if args.action == "build":
        out = Path(args.out or builder.DATA_FILE)
        progress = out.with_name(out.name + ".partial")  # survives a crash; a rerun resumes from it
        specs = builder.build_tasks(args.libraries or list(builder.LIBRARIES), per_library=args.per_library,
                                    seed=args.seed, workers=args.workers, progress_file=progress)
        path = builder.write_specs(specs, out)
        progress.unlink(missing_ok=True)
        print(f"wrote {len(specs)} tasks to {path}")
        return 0
    specs = builder.load_specs(args.out or builder.DATA_FILE)
    if args.libraries:
        specs = [s for s in specs if s.library in args.libraries]
    problems = builder.verify_tasks(specs[: args.limit] if args.limit else specs)
    for task_id, why in problems:
        print(f"FAILED {task_id}: {why}")
    print(f"{len(problems)} problem(s) in {len(specs[: args.limit] if args.limit else specs)} tasks")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgym", description="Environments, policies and trainers for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"agentgym {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list registered environments and task suites")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("play", help="act in an environment yourself, from the terminal")
    p.add_argument("env_id", help="an id from 'agentgym list', e.g. agentgym/GuessNumber-v0")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_play)

    p = sub.add_parser("eval", help="run a policy on a task suite and report success, turns, tokens and time")
    p.add_argument("--suite", required=True, help="suite name (see 'agentgym list') or path to a suite .yaml")
    p.add_argument("--policy", required=True, help="reference | hf:MODEL (a model directory or a cached Hub id such as "
                   "Qwen/Qwen2.5-0.5B-Instruct) | vllm:MODEL (GPU) | openai:BASE_URL[#MODEL]")
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=_positive_int, default=None, help="evaluate only the first N tasks")
    p.add_argument("--group-size", type=_positive_int, default=1, help="rollouts per task")
    p.add_argument("--max-in-flight", type=_positive_int, default=64)
    p.add_argument("--max-tokens", type=_positive_int, default=None,
                   help="tokens per turn (default: what the model was trained with, else 256)")
    p.add_argument("--system-prompt", default=None,
                   help="system prompt (default: the one the model was trained with, else the env's instructions)")
    p.add_argument("--constrain-actions", action=argparse.BooleanOptionalAction, default=None,
                   help="decode every reply as one of the env's valid actions (envs with a finite action set, hf: "
                        "policies); default: as the model was trained (its agentgym.json), else off")
    p.add_argument("--temperature", type=_non_negative_float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default runs/eval-SUITE-TIME); must be new or "
                   "empty unless --resume or --overwrite")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue the run in --out: skip (task, sample) pairs it already holds")
    existing.add_argument("--overwrite", action="store_true", help="delete the results of the run in --out first")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (by default one is drawn when stderr is a terminal)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("train", help="train a policy with a trainer config (YAML; see configs/)")
    p.add_argument("config", help="trainer config file, e.g. configs/quickstart_calc.yaml")
    p.add_argument("--warmstart", choices=["none", "bc"], default=None, help="behaviour-cloning warm start first")
    p.add_argument("--output-dir", default=None)
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field (repeatable)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("serve", help="serve a local HF model directory as an OpenAI-compatible API")
    p.add_argument("model_dir", nargs="?", default=None)
    p.add_argument("--record", default=None, metavar="DIR",
                   help="record every session's token-exact calls here (the recording gateway, agentgym.serving.gateway)")
    p.add_argument("--proxy", default=None, metavar="URL",
                   help="with --record: record the sessions of another OpenAI-compatible server (e.g. vllm serve)")
    p.add_argument("--tokenizer", default=None, help="with --proxy: tokenizer for servers that return no token ids")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_positive_int, default=8000)
    p.add_argument("--model-name", default=None, help="name clients use (default: the directory name)")
    p.add_argument("--max-batch-size", type=_positive_int, default=32)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("serve-env", help="serve an env over HTTP/WebSocket with OpenEnv's protocol (one env per session)")
    p.add_argument("env_id", nargs="?", default=None,
                   help="an id from 'agentgym list', e.g. agentgym/Calculator-v0 (default: $AGENTGYM_ENV_ID)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 picks a free one; the URL is printed)")
    p.add_argument("--max-sessions", type=_positive_int, default=64,
                   help="concurrent sessions (envs); more connections get OpenEnv's CAPACITY_REACHED error")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of gym.make keyword arguments, e.g. '{\"max_turns\": 5}'")
    p.add_argument("--idle-timeout", type=_positive_float, default=None,
                   help="close sessions idle this many seconds (default: keep them while connected)")
    p.set_defaults(func=_cmd_serve_env)

    p = sub.add_parser("tasks", help="build or verify generated task data (e.g. 'agentgym tasks build swe')")
    p.add_argument("action", choices=["build", "verify"])
    p.add_argument("family", help="task family; 'swe' builds SWE tasks from pinned PyPI libraries")
    p.add_argument("--libraries", nargs="+", default=None, help="only these libraries (default: all pinned)")
    p.add_argument("--library-file", action="append", default=None,
                   help="TOML file declaring more libraries ([[library]] tables; also $AGENTGYM_SWE_LIBRARIES)")
    p.add_argument("--per-library", type=_positive_int, default=45, help="tasks to keep per library")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=_positive_int, default=2, help="sandboxes running tests at once")
    p.add_argument("--limit", type=_positive_int, default=None, help="verify only the first N tasks")
    p.add_argument("--out", default=None, help="task file (default: the shipped tasks/data/swe_tasks.jsonl)")
    p.set_defaults(func=_cmd_tasks)

    p = sub.add_parser("view", help="print saved trajectories")
    p.add_argument("path", help="a trajectories.jsonl file")
    p.add_argument("--limit", type=_positive_int, default=None)
    p.add_argument("--html", default=None, help="also write these trajectories as an HTML report (observation "
                   "images inline, copied to images/ beside it)")
    p.set_defaults(func=_cmd_view)

    p = sub.add_parser("new-env", help="write the skeleton of an env plugin package (env, suite, passing tests)")
    p.add_argument("name", help="package name, e.g. word-game (env id word_game/WordGame-v0)")
    p.add_argument("--dir", default=None, help="where to write it (default ./NAME); must be new or empty")
    p.add_argument("--force", action="store_true", help="overwrite the skeleton's files in a non-empty --dir")
    p.set_defaults(func=_cmd_new_env)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except AgentGymError as exc:
        sys.stderr.write(f"agentgym {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
