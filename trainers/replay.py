"""A persistent replay buffer of turns for off-policy utterance-level critics (ArCHer, Zhou et al., 2024).

Each transition is one agent turn ``(s, a, r, s', terminated, truncated)``, kept as text for the critic and
as the policy's exact token ids for the actor (which samples fresh utterances at buffer states and must not
re-tokenise them). Transitions are appended to ``replay.jsonl``, one JSON object per line, flushed and
fsynced per batch, so a SIGKILL loses at most the batch being written; a torn last line is dropped on load.
A checkpoint records how many transitions it had seen, and :meth:`ReplayBuffer.truncate` rolls the file
back to that count on resume, so a resumed run sees exactly the buffer of an uninterrupted one.

Under torchrun every rank holds the same buffer (the trainers gather each rank's new transitions), but only one
rank writes the file: the others open it with ``persist=False``, read it on start and resume (the file lives
on storage every rank reads, as the checkpoints do), and never append to it, truncate it or repair it, so the
file holds each transition once.

Memory holds the newest ``capacity`` transitions (FIFO); sampling is uniform with replacement.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.errors import ConfigError
from agentgym.trainers.returns import step_rewards
from agentgym.trajectory import TRUNCATING_END_REASONS, Trajectory

__all__ = ["ReplayBuffer", "Transition", "transitions_from_trajectory"]

logger = logging.getLogger(__name__)

# TRUNCATING_END_REASONS (from the one termination table, agentgym.trajectory.TERMINATION): end reasons that stop an
# episode from outside (bootstrapped through); the others are end states.


@dataclass(frozen=True)
class Transition:
    """One agent turn of the replay buffer.

    Attributes:
        state: Critic view of the state: the conversation so far as text (chat template included).
        action: The utterance text the policy produced.
        reward: This step's share of the episode's return (:func:`agentgym.trainers.returns.step_rewards`).
        next_state: Critic view of the next state; for the last turn, the state, the action and the final
            observation (trajectory metadata ``final_prompt_token_ids``; older trajectories without it give
            the state followed by the action).
        terminated: The episode reached an end state after this turn (no bootstrap).
        truncated: The episode was stopped from outside after this turn (turn or context limit: bootstrap).
        state_ids: The policy's exact prompt token ids for this turn (the actor samples from them).
        action_ids: The sampled utterance's token ids.
        mc_return: Discounted return-to-go from this turn (stored as the reference code does; unused by the losses).
        episode: Which episode (``traj_id``) the turn came from.
        turn: Turn index within the episode.
    """

    state: str
    action: str
    reward: float
    next_state: str
    terminated: bool
    truncated: bool
    state_ids: tuple[int, ...] = ()
    action_ids: tuple[int, ...] = ()
    mc_return: float = 0.0
    episode: str = ""
    turn: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state_ids"], d["action_ids"] = list(self.state_ids), list(self.action_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Transition:
        return cls(state=d["state"], action=d["action"], reward=float(d["reward"]), next_state=d["next_state"],
                   terminated=bool(d["terminated"]), truncated=bool(d["truncated"]),
                   state_ids=tuple(d.get("state_ids") or ()), action_ids=tuple(d.get("action_ids") or ()),
                   mc_return=float(d.get("mc_return", 0.0)), episode=str(d.get("episode", "")),
                   turn=int(d.get("turn", 0)))


def transitions_from_trajectory(trajectory: Trajectory, decode: Any, *, gamma: float = 0.95,
                                episode: str | None = None) -> list[Transition]:
    """Split an episode into turns; ``decode(ids) -> str`` renders token ids as critic text.

    ``episode`` names the episode in the buffer (default: its ``traj_id``, which is random per process; trainers
    pass a name derived from the iteration so that a resumed run writes the same buffer).

    Episodes that failed for infrastructure reasons (``error``) and turns without token ids give nothing:
    they are not evidence about the policy, so no trainer learns from such episodes.
    """
    if trajectory.error is not None or trajectory.end_reason == "error" or not trajectory.has_tokens:
        return []
    truncated_end = trajectory.end_reason in TRUNCATING_END_REASONS
    turns = trajectory.turns
    contexts: list[tuple[int, ...]] = []
    ids: tuple[int, ...] = ()
    segment = 0
    for turn in turns:
        if turn.segment_index != segment:  # a rewritten history: the new segment's first prompt is all it saw
            segment, ids = turn.segment_index, ()
        ids = ids + tuple(turn.prompt_token_ids or ())
        contexts.append(ids)
        ids = ids + tuple(turn.action_token_ids or ())
    rewards = step_rewards(trajectory)  # they sum to the episode's return (agentgym.trainers.returns)
    returns, running = [0.0] * len(turns), 0.0
    for i in range(len(turns) - 1, -1, -1):
        running = rewards[i] + gamma * running
        returns[i] = running
    texts = [decode(c) for c in contexts]
    final_ids = tuple(trajectory.metadata.get("final_prompt_token_ids") or ())
    out = []
    for i, turn in enumerate(turns):
        last = i == len(turns) - 1
        state_ids, action_ids = contexts[i], tuple(turn.action_token_ids or ())
        next_text = texts[i + 1] if not last else decode(state_ids + action_ids + final_ids)
        out.append(Transition(state=texts[i], action=turn.action, reward=rewards[i], next_state=next_text,
                              terminated=last and not truncated_end, truncated=last and truncated_end,
                              state_ids=state_ids, action_ids=action_ids, mc_return=returns[i],
                              episode=trajectory.traj_id if episode is None else episode, turn=i))
    return out


class ReplayBuffer:
    """Append-only JSONL on disk, newest ``capacity`` transitions in memory.

    Args:
        path: The JSONL file (created if missing; existing records are loaded).
        capacity: Transitions kept for sampling (FIFO ring; ArCHer's reference configs keep 100,000).
        persist: Whether this buffer writes the file. ``False`` (every rank but the first under torchrun) reads
            it but keeps appends and roll-backs in memory, so concurrent ranks never write the same file.
    """

    def __init__(self, path: str | Path, capacity: int = 100_000, *, persist: bool = True) -> None:
        if capacity < 1:
            raise ConfigError(f"ReplayBuffer capacity must be >= 1, got {capacity}.")
        self.path = Path(path)
        self.capacity = capacity
        self.persist = persist
        self._items: deque[Transition] = deque(maxlen=capacity)
        self.total = 0
        """Transitions ever appended (the file's record count), including those evicted from memory."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._load()

    def _load(self, limit: int | None = None) -> None:
        """Read the file's records (the first ``limit`` of them, if given) into memory."""
        if not self.path.is_file():
            return
        good_bytes = 0
        with self.path.open("rb") as fh:
            for raw in fh:
                if limit is not None and self.total == limit:
                    return
                if not raw.endswith(b"\n"):
                    break  # a torn write from a killed process
                try:
                    self._items.append(Transition.from_dict(json.loads(raw)))
                except (ValueError, KeyError):
                    break
                good_bytes += len(raw)
                self.total += 1
        if good_bytes != self.path.stat().st_size and self.persist:
            logger.warning("replay buffer %s: dropping a torn record at byte %d", self.path, good_bytes)
            with self.path.open("r+b") as fh:
                fh.truncate(good_bytes)

    def __len__(self) -> int:
        return len(self._items)

    def extend(self, transitions: Iterable[Transition]) -> None:
        """Append to memory and to disk (one flush + fsync per call)."""
        batch = list(transitions)
        if not batch:
            return
        if self.persist:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(t.to_dict()) + "\n" for t in batch))
                fh.flush()
                os.fsync(fh.fileno())
        self._items.extend(batch)
        self.total += len(batch)

    def truncate(self, total: int) -> None:
        """Roll back to the first ``total`` records ever appended (resume from a checkpoint taken then)."""
        if total > self.total:
            raise ConfigError(f"replay buffer {self.path} holds {self.total} records but the checkpoint expects "
                              f"{total}; the file was deleted or replaced. Restore it, or start a fresh run.")
        if total == self.total:
            return
        if not self.persist:  # the writing rank rolls the file back; this one only forgets what came after
            self._items.clear()
            self.total = 0
            self._load(limit=total)
            return
        tmp = self.path.with_suffix(".jsonl.tmp")
        kept = 0
        with self.path.open("rb") as src, tmp.open("wb") as dst:
            for raw in src:
                if kept == total:
                    break
                dst.write(raw)
                kept += 1
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, self.path)
        self._items.clear()
        self.total = 0
        self._load()

    def sample(self, batch_size: int, generator: torch.Generator) -> list[Transition]:
        """``batch_size`` transitions uniformly with replacement."""
        if not self._items:
            raise ConfigError("cannot sample from an empty replay buffer; collect episodes first.")
        index = torch.randint(len(self._items), (batch_size,), generator=generator).tolist()
        return [self._items[i] for i in index]

    def __iter__(self) -> Any:
        return iter(self._items)

    def items(self) -> Sequence[Transition]:
        return list(self._items)
