"""Can ArCHer's critic tell good turns from bad ones? Its held-out fit against simple predictors.

ArCHer's actor is only as good as its advantage ``min(Q) - min(V)``, so a critic that cannot predict
returns gives the actor noise. This script takes the replay buffer an ArCHer run wrote (``replay.jsonl``:
every turn with its Monte-Carlo return), holds out a fifth of the episodes, and trains the critic on the
rest by direct regression onto those returns: the easiest target a critic can get (TD learning must also
bootstrap its own estimates), so its held-out fit is an upper bound on what TD reaches with the same steps.
Side by side, two predictors that read no text: the mean return at each turn index, and (on the maze) the
mean return at each remaining shortest-path distance to the exit, parsed from the last grid of the state.
All fits are explained variance on the held-out turns (1 = perfect, 0 = no better than the mean).

    python benchmarks/archer_vs_bc.py --suite games-maze --methods archer      # writes the buffers
    python benchmarks/archer_critic_fit.py --replay runs/archer_vs_bc/games-maze/archer/seed0/replay.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

_GRID = re.compile(r"^#+\n(?:[#.@E]+\n)+#+$", re.MULTILINE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replay", required=True, help="replay.jsonl written by an ArCHer run")
    p.add_argument("--train-replay", action="append", default=[], metavar="PATH",
                   help="another run's replay.jsonl whose turns join the training turns only (repeatable): does the "
                        "fit grow with data? The held-out fifth stays --replay's")
    p.add_argument("--model", help="policy model whose backbone the critic copies (--encoder policy; default: the "
                                   "run's starting model, from the config.json beside the replay buffer)")
    p.add_argument("--encoder", choices=("policy", "minilm", "bytes", "grid"), default="policy",
                   help="critic text encoder: a copy of the policy's backbone, MiniLM, a byte-level transformer "
                        "trained from scratch (give it --max-tokens that hold a state in bytes), or grid: a recurrent "
                        "convolution over the text's last character grid and a GRU over the rest")
    p.add_argument("--pooling", choices=("mean", "last"), default="mean",
                   help="critic pooling (not with --encoder grid, which pools its cells itself)")
    p.add_argument("--action-view", choices=("separate", "joint"), default="separate",
                   help="what the Q heads read of an action: its text alone, or the state's text followed by it")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens the critic reads per state or utterance")
    p.add_argument("--steps", type=int, default=400, help="critic regression steps")
    p.add_argument("--batch-size", type=int, default=32, help="turns per step")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate of the critic")
    p.add_argument("--evals", type=int, default=4, help="held-out evaluations along the way")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode split and the batches")
    args = p.parse_args(argv)
    if not Path(args.replay).is_file():
        p.error(f"--replay {args.replay} does not exist; run an ArCHer config or benchmarks/archer_vs_bc.py first.")
    for extra in args.train_replay:
        if not Path(extra).is_file():
            p.error(f"--train-replay {extra} does not exist; give another ArCHer run's replay.jsonl.")
    run_config = Path(args.replay).with_name("config.json")
    if args.model is None and run_config.is_file():
        args.model = json.loads(run_config.read_text(encoding="utf-8")).get("model")
    if args.encoder == "policy" and not (args.model and (Path(args.model) / "config.json").is_file()):
        p.error("--encoder policy needs --model, a model directory with config.json (the run's starting model).")
    for name in ("steps", "batch_size", "evals", "max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    return args


def explained(predictions: Sequence[float], returns: Sequence[float]) -> float:
    from agentgym.trainers.algorithms.archer import explained_variance

    return explained_variance(torch.tensor(list(predictions)), torch.tensor(list(returns)))


def tabulated(train: Sequence, key: Callable) -> Callable:
    """Predict the mean return of the training turns that share ``key`` (the overall mean for unseen keys)."""
    groups: dict = defaultdict(list)
    for t in train:
        groups[key(t)].append(t.mc_return)
    overall = statistics.mean(t.mc_return for t in train)
    return lambda t: statistics.mean(groups[key(t)]) if groups.get(key(t)) else overall


MOVES = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}
"""The maze's move directions as (row, column) steps on the rendered grid, where a wall-or-gap cell sits between
two cells."""


def _maze(state: str) -> tuple[dict[tuple[int, int], str], tuple[int, int], tuple[int, int]] | None:
    """The last maze grid of the state as ``(cells, start, exit)``, or None without one."""
    grids = _GRID.findall(state)
    if not grids:
        return None
    rows = grids[-1].split("\n")
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    start = next((rc for rc, ch in cells.items() if ch == "@"), None)
    goal = next((rc for rc, ch in cells.items() if ch == "E"), None)
    return None if start is None or goal is None else (cells, start, goal)


def _moves_to(cells: dict[tuple[int, int], str], start: tuple[int, int], goal: tuple[int, int]) -> int | None:
    """Shortest-path moves from ``start`` to ``goal`` (grid steps halved: each move crosses a gap cell)."""
    seen, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if cells.get(nxt, "#") != "#" and nxt not in seen:
                seen[nxt] = seen[(r, c)] + 1
                queue.append(nxt)
    return seen[goal] // 2 if goal in seen else None


def maze_distance(state: str) -> int | None:
    """Shortest-path moves from ``@`` to ``E`` in the last maze grid of the state, or None without one."""
    maze = _maze(state)
    return None if maze is None else _moves_to(*maze)


def heads_for_exit(turn: Any) -> bool | None:
    """Whether a turn's move shortened its path to the exit (or reached it), from the grids of its state and next
    state; None when the state shows no grid."""
    here = maze_distance(turn.state)
    if here is None:
        return None
    if turn.terminated and turn.reward > 0:
        return True
    after = maze_distance(turn.next_state) if turn.next_state else None
    return after is not None and after < here


def maze_moves(state: str) -> dict[str, int | None] | None:
    """Per direction, the shortest-path distance to the exit after that move from the state's last grid (None
    where a wall blocks it), or None without a grid: a move whose distance is below the state's own heads for the
    exit, every other one wastes a turn or leads away."""
    maze = _maze(state)
    if maze is None:
        return None
    cells, (r, c), goal = maze
    return {name: (_moves_to(cells, (r + 2 * dr, c + 2 * dc), goal) if cells.get((r + dr, c + dc), "#") != "#"
                   else None)
            for name, (dr, dc) in MOVES.items()}


def move_ranking(critic: Any, turns: list[Any], actions: list[str], chunk: int = 64) -> dict[str, Any]:
    """``{move_ranking, move_pairs, move_states}``: how often the critic's ``min(Q1, Q2)`` puts a move towards the
    exit above a move that is not, at the same maze state (ties count half; 0.5 is chance, ``None`` off the maze).

    Explained variance asks whether the critic predicts returns; the actor needs less and more: only that, at one
    state, the better utterance gets the higher Q (any baseline of the state cancels in that comparison). Each
    distinct state of ``turns`` is scored with its taken action's text (``actions``, as the critic reads it), the
    direction swapped for each of the four, against the grid's shortest path: a move whose distance to the exit
    drops is towards it; a blocked one, or one that does not shorten the path, is not.
    """
    pattern = "|".join(MOVES)
    candidates: dict[str, tuple[list[str], list[bool]]] = {}
    for t, action in zip(turns, actions, strict=True):
        moves, here = maze_moves(t.state), maze_distance(t.state)
        if t.state in candidates or moves is None or here is None or len(re.findall(pattern, action)) != 1:
            continue
        towards = [moves[name] is not None and moves[name] < here for name in MOVES]
        if any(towards) and not all(towards):
            candidates[t.state] = ([re.sub(pattern, name, action) for name in MOVES], towards)
    if not candidates:
        return {"move_ranking": None, "move_pairs": 0, "move_states": 0}
    rows = [(state, text) for state, (texts, _) in candidates.items() for text in texts]
    values: list[float] = []
    with torch.no_grad():
        for i in range(0, len(rows), chunk):
            q, _ = critic([state for state, _ in rows[i:i + chunk]], [text for _, text in rows[i:i + chunk]])
            values += q.min(dim=0).values.cpu().tolist()
    wins = pairs = 0.0
    for k, (_, towards) in enumerate(candidates.values()):
        q = values[k * len(MOVES):(k + 1) * len(MOVES)]
        for good in (q[i] for i in range(len(MOVES)) if towards[i]):
            for bad in (q[i] for i in range(len(MOVES)) if not towards[i]):
                wins += 1.0 if good > bad else 0.5 if good == bad else 0.0
                pairs += 1
    return {"move_ranking": wins / pairs, "move_pairs": int(pairs), "move_states": len(candidates)}


def build_critic(args: argparse.Namespace):  # noqa: ANN201 (returns UtteranceCritic)
    from agentgym.trainers.critic import UtteranceCritic

    if args.encoder == "minilm":
        return UtteranceCritic.from_minilm(max_tokens=args.max_tokens, pooling=args.pooling,
                                           action_view=args.action_view)
    if args.encoder == "bytes":
        return UtteranceCritic.from_bytes(seed=args.seed, max_tokens=args.max_tokens, pooling=args.pooling,
                                          action_view=args.action_view)
    if args.encoder == "grid":
        return UtteranceCritic.from_grid(seed=args.seed, max_tokens=args.max_tokens, action_view=args.action_view)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    return UtteranceCritic.from_policy(model, tokenizer, max_tokens=args.max_tokens, pooling=args.pooling,
                                       action_view=args.action_view)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from agentgym.trainers.replay import ReplayBuffer

    torch.manual_seed(args.seed)
    turns = list(ReplayBuffer(Path(args.replay)).items())
    episodes = sorted({t.episode for t in turns})
    if len(episodes) < 5:
        sys.exit(f"{args.replay} holds {len(episodes)} episodes; at least 5 are needed for a held-out fifth.")
    random.Random(args.seed).shuffle(episodes)
    held = set(episodes[: len(episodes) // 5])
    train = [t for t in turns if t.episode not in held]
    test = [t for t in turns if t.episode in held]
    returns = [t.mc_return for t in test]
    sys.stdout.write(f"{len(turns)} turns of {len(episodes)} episodes; {len(test)} held-out turns of {len(held)} "
                     f"episodes, {sum(r > 0 for r in returns) / len(returns):.0%} with a positive return\n")
    for extra in args.train_replay:
        more = list(ReplayBuffer(Path(extra)).items())
        train += more
        sys.stdout.write(f"+ {len(more)} training turns of {extra}\n")

    rows: list[tuple[str, float]] = []
    by_turn = tabulated(train, lambda t: t.turn)
    rows.append(("mean return per turn index (reads no text)", explained([by_turn(t) for t in test], returns)))
    if any(maze_distance(t.state) is not None for t in turns[:50]):  # a maze (an error observation shows no grid)
        by_distance = tabulated(train, lambda t: maze_distance(t.state))
        rows.append(("mean return per shortest-path distance to the exit (maze oracle)",
                     explained([by_distance(t) for t in test], returns)))
        by_move = tabulated(train, lambda t: (maze_distance(t.state), heads_for_exit(t)))
        rows.append(("mean return per distance and whether the move heads for the exit (maze oracle of state and "
                     "action)", explained([by_move(t) for t in test], returns)))
    text_free = len(rows)

    critic = build_critic(args)
    optimizer = torch.optim.Adam(critic.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    checkpoints = {round(args.steps * (i + 1) / args.evals) for i in range(args.evals)}
    curve: list[tuple[int, float]] = []
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        critic.train()
        batch = [train[i] for i in torch.randint(len(train), (args.batch_size,), generator=generator).tolist()]
        target = torch.tensor([t.mc_return for t in batch])
        q, v = critic([t.state for t in batch], [t.action for t in batch])
        loss = ((q - target) ** 2).mean() + ((v - target) ** 2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step in checkpoints:
            critic.eval()
            fitted: list[float] = []
            with torch.no_grad():
                for i in range(0, len(test), 64):
                    chunk = test[i:i + 64]
                    q, _ = critic([t.state for t in chunk], [t.action for t in chunk])
                    fitted += q.min(dim=0).values.tolist()
            curve.append((step, explained(fitted, returns)))
            sys.stdout.write(f"critic step {step}: held-out EV {curve[-1][1]:.3f} "
                             f"({time.perf_counter() - started:.0f} s)\n")
            sys.stdout.flush()
    critic.eval()
    ranking = move_ranking(critic, test, [t.action for t in test])
    if ranking["move_ranking"] is not None:
        sys.stdout.write(f"the critic puts a move towards the exit above one that is not at "
                         f"{ranking['move_ranking']:.3f} of {ranking['move_pairs']} pairs at {ranking['move_states']} "
                         "held-out states (0.5: chance)\n")
    label = (f"critic ({args.encoder}, {args.pooling} pooling, {args.action_view} action, {args.steps} x "
             f"{args.batch_size} regression on returns of {len(train)} training turns)")
    rows.append((label, curve[-1][1]))
    rows.append((f"critic, best held-out EV along the way (step {max(curve, key=lambda c: c[1])[0]})",
                 max(v for _, v in curve)))

    reference = max(value for _, value in rows[:text_free])
    sys.stdout.write("\n| predictor | held-out explained variance | ratio to the best text-free predictor |\n"
                     "|---|---|---|\n")
    for name, value in rows:
        ratio = f"{value / reference:.2f}" if reference > 0 else "n/a"
        sys.stdout.write(f"| {name} | {value:.3f} | {ratio} |\n")
    out = Path(args.replay).with_name("critic_fit.json")
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "curve": curve, **ranking}, indent=2))
    sys.stdout.write(f"written {out}\n")
    if argv is None:  # a run from the command line records its figures; a test calling main() does not
        from _results import figure, write_results

        best = max(rows[:text_free], key=lambda r: r[1])[0]
        write_results("archer_critic_fit", [
            figure(f"{name}: held-out explained variance, {len(test)} turns of {len(held)} held-out episodes of "
                   f"{args.replay}; baseline: {best}", value, reference, unit="explained variance",
                   ratio=value / reference if reference > 0 else None)
            for name, value in rows[text_free:]], details={"rows": rows, "curve": curve, **ranking})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
