"""The most of the return variance any critic of a policy can explain on held-out mazes, measured.

ArCHer's critic is judged by ``1 - Var(G - Q) / Var(G)`` on held-out turns, where ``G`` is a turn's Monte-Carlo
return. Even the true ``Q(s, a) = E[G | s, a]`` does not reach 1: the rest of the episode is sampled (at the
training temperature), so ``G`` scatters around ``Q`` by the variance of that sampling, and the best any critic can
do is ``1 - E[Var(G | s, a)] / Var(G)``. This script measures that ceiling for a policy instead of guessing it.

The policy plays ``--per-task`` episodes of each of the first ``--tasks`` held-out mazes. A turn's key is what a
critic reads: the maze (task), the state in the critic's view (``critic_input``), and the action's text. Turns
that share a key have the same ``Q(s, a)``, so the spread of their returns is sampling noise alone; its unbiased
variance, pooled over every key seen in at least two episodes, estimates ``E[Var(G | s, a)]``. Only each
episode's first turn with a key counts: a move repeated within one episode (a wall bumped twice) shares that
episode's future, and its near-equal returns would understate the noise. Keys seen twice are mostly
early states, which have more of the episode left to sample than rare late ones, so the noise is also pooled within
each (distance to the exit, whether the move heads for it) stratum and averaged over all turns by their stratum.
The same turns get the (distance, move) table's fit (``studies.critic_fit.maze_oracles``) for scale.

    python benchmarks/critic_ceiling.py --run runs/studies/archer_joint_vs_filtered_bc-goal/archer_joint/seed0 \\
        --run runs/studies/archer_joint_vs_filtered_bc-goal/archer_joint/seed1 --tasks 200 --per-task 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["main", "return_ceiling"]


def _pooled_noise(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """``(pooled unbiased within-group variance, its degrees of freedom)`` over groups of two or more returns."""
    total, dof = 0.0, 0
    for returns in groups:
        if len(returns) >= 2:
            total += statistics.variance(returns) * (len(returns) - 1)
            dof += len(returns) - 1
    return (total / dof if dof else float("nan")), dof


def return_ceiling(turns: Sequence[Any], key: Callable[[Any], Hashable],
                   stratum: Callable[[Any], Hashable]) -> dict[str, Any]:
    """The explained-variance ceiling of a critic whose input is ``key(turn)`` (turns with one key share their
    true ``Q``), from the turns' ``mc_return``; the noise is measured across episodes (``turn.episode``), one
    turn of each episode per key.

    Returns ``ceiling`` (noise pooled per ``stratum`` and averaged over all turns; a stratum without a repeated key
    takes the overall pooled noise), ``ceiling_pooled`` (one pooled noise for all), ``repeated_turns`` (the share of
    turns whose key recurs in another episode) and ``noise_dof``.
    """
    returns = [t.mc_return for t in turns]
    if len(returns) < 2 or statistics.pvariance(returns) == 0:
        return {"ceiling": None, "ceiling_pooled": None, "repeated_turns": 0.0, "noise_dof": 0, "turns": len(turns)}
    total = statistics.pvariance(returns)
    by_key: dict[Hashable, list[Any]] = defaultdict(list)
    seen: set[tuple[Hashable, str]] = set()
    for t in turns:
        if (key(t), t.episode) not in seen:
            seen.add((key(t), t.episode))
            by_key[key(t)].append(t)
    overall, dof = _pooled_noise([[t.mc_return for t in group] for group in by_key.values()])
    by_stratum: dict[Hashable, list[list[float]]] = defaultdict(list)
    for group in by_key.values():
        by_stratum[stratum(group[0])].append([t.mc_return for t in group])
    noise = {s: _pooled_noise(groups)[0] for s, groups in by_stratum.items()}
    per_turn = [noise[stratum(t)] if noise[stratum(t)] == noise[stratum(t)] else overall for t in turns]
    repeated = sum(1 for t in turns if len(by_key[key(t)]) >= 2) / len(turns)
    if dof == 0:
        return {"ceiling": None, "ceiling_pooled": None, "repeated_turns": repeated, "noise_dof": 0,
                "turns": len(turns)}
    return {"ceiling": 1 - statistics.fmean(per_turn) / total, "ceiling_pooled": 1 - overall / total,
            "repeated_turns": repeated, "noise_dof": dof, "turns": len(turns), "return_variance": total}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, action="append",
                   help="a finished maze ArCHer run (its config.json sets the split, temperature, gamma and the "
                        "critic's view); repeat for several runs")
    p.add_argument("--policies", default="start,final",
                   help="which policies play, comma-separated: 'start' (the runs' starting model, measured once "
                        "per distinct one), 'final' (each run's final model), or model directories")
    p.add_argument("--tasks", type=int, default=200, help="held-out mazes (the split's first)")
    p.add_argument("--per-task", type=int, default=8, help="episodes per maze (>= 2: repeated keys measure noise)")
    args = p.parse_args(argv)
    for run in args.run:
        if not (Path(run) / "config.json").is_file():
            p.error(f"--run {run}: no config.json there; pass a run directory of an ArCHer study "
                    "(runs/studies/<study>-goal/<method>/seed<k>)")
    args.policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    for policy in args.policies:
        if policy not in ("start", "final") and not (Path(policy) / "config.json").is_file():
            p.error(f"--policies: {policy!r} is neither 'start', 'final' nor a model directory with config.json")
    if not args.policies:
        p.error("--policies is empty; pass start, final or a model directory")
    if args.tasks < 1:
        p.error(f"--tasks must be >= 1, got {args.tasks}")
    if args.per_task < 2:
        p.error(f"--per-task must be >= 2 (one episode a maze repeats no state), got {args.per_task}")
    return args


def measure(run: Path, model_dir: Path, tasks: int, per_task: int) -> dict[str, Any]:
    """One policy's ceiling on the run's held-out split, with the (distance, move) table's fit on the same turns."""
    from archer_critic_fit import heads_for_exit, maze_distance
    from studies.critic_fit import archer_trainer, held_out_turns, maze_oracles

    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"{model_dir}: no model there; finish the run first or name another policy")
    started = time.perf_counter()
    trainer = archer_trainer(config, model_dir)
    trajectories, turns, actions = held_out_turns(trainer, tasks, per_task)
    text = dict(zip(map(id, turns), actions, strict=True))
    n_tasks = min(tasks, len(trajectories) // per_task)

    def task_of(t: Any) -> int:
        return int(t.episode.rsplit(":", 1)[1]) % n_tasks

    ceiling = return_ceiling(turns, key=lambda t: (task_of(t), t.state, text[id(t)]),
                             stratum=lambda t: (maze_distance(t.state), heads_for_exit(t)))
    return {"run": str(run), "model": str(model_dir), "critic_input": config.get("critic_input"),
            "temperature": config.get("temperature"), "gamma": config.get("gamma"),
            "split": config.get("eval_split"), "tasks": n_tasks, "per_task": per_task,
            "episodes": len(trajectories), "success": sum(t.success for t in trajectories) / max(len(trajectories), 1),
            **ceiling, **maze_oracles(turns), "seconds": round(time.perf_counter() - started, 1)}


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from _results import figure, write_results

    plays: list[tuple[Path, Path]] = []  # (run whose config and critic view apply, the policy that plays)
    for policy in args.policies:
        for run in map(Path, args.run):
            start = Path(json.loads((run / "config.json").read_text(encoding="utf-8"))["model"])
            model = start if policy == "start" else run / "model" if policy == "final" else Path(policy)
            if all(model.resolve() != m.resolve() for _, m in plays):
                plays.append((run, model))
    rows = []
    for run, model in plays:
        print(f"{model} plays {args.per_task} episodes of each of {args.tasks} held-out mazes (the settings and "
              f"critic view of {run}) ...", flush=True)
        row = measure(run, model, args.tasks, args.per_task)
        rows.append(row)
        print(f"{run} ({row['model']}): success {row['success']:.3f}, ceiling {_shown(row['ceiling'])} "
              f"(one pooled noise: {_shown(row['ceiling_pooled'])}; {row['repeated_turns']:.0%} of {row['turns']} "
              f"turns repeat a key in another episode), (distance, move) table "
              f"{_shown(row['move_explained_variance'])}", flush=True)
    figures = [figure(f"{Path(r['run']).parent.name}/{Path(r['run']).name}'s critic view, {r['model']} playing "
                      f"{r['episodes']} held-out episodes ({r['per_task']} a maze): the explained variance of the "
                      "true Q; baseline: the (distance, move) table on the same turns", r["ceiling"],
                      r["move_explained_variance"], unit="explained variance",
                      goal="ArCHer's goal: the critic explains >= 0.5",
                      met=None if r["ceiling"] is None else r["ceiling"] >= 0.5,
                      note="met: whether a perfect critic could reach the goal")
               for r in rows]
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        write_results("critic_ceiling", figures, details={"runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
