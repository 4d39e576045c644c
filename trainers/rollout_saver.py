"""Keep a training step's episodes on disk, so what the policy did while it trained can be looked at later.

Every ``save_rollouts`` steps the step's trajectories go to ``rollouts/step-NNNNNN.jsonl`` in the output
directory, written by :class:`agentgym.storage.TrajectoryWriter` (the same lines, and the same ``images/`` folder
beside them, as eval's trajectories.jsonl), each with ``metadata["train_step"]``. Beside it,
``step-NNNNNN.tokens.jsonl`` holds one line per trajectory with what the token view of ``agentgym view`` colours:

``{"traj_id", "train_step", "tokens": [text of each token], "mask": [[value, run length], ...],
"logprob": [sampling log-prob per token, 3 decimals], "advantage": [[value, run length], ...]}``

An episode whose history a context strategy rewrote is several token sequences, its segments (one training row
each): its record holds them one after the other in those same fields and adds ``"segments": [length, ...]``, the
number of tokens of each segment in order (absent for an unsegmented episode, whose record is as it always was).

The loss mask and advantages are run-length encoded: GRPO puts one advantage on every token of an episode and
the mask changes only at turn boundaries, so a 2,000-token episode takes a handful of pairs instead of 2,000
numbers. Token texts are each id decoded on its own (cached per id), so they need no tokenizer to read.

Saving is a side product of training: a disk that fills up costs the saved rollouts (one warning), never the run.
Under ``torchrun`` each rank writes its own shard of the groups (``step-NNNNNN-rank1.jsonl`` and so on).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.storage import TrajectoryWriter, encode_line
from agentgym.trajectory import Trajectory
from agentgym.utils.durable import LineAppender

__all__ = ["RolloutSaver", "StepTokens", "run_length", "save_step_rollouts"]

logger = logging.getLogger(__name__)

ROLLOUTS_DIR = "rollouts"
#: Decimals kept of log-probs and advantages: enough to tell tokens apart on a colour scale, a third of the bytes.
DECIMALS = 3


@dataclasses.dataclass
class StepTokens:
    """Per-token training data of one step, rows aligned with the trajectories that have token views.

    Attributes:
        rows: For each row, the index of its trajectory in the step's list.
        loss_mask: Per row, the loss mask the update used (0 where the episode was masked out).
        advantages: Per row, the advantage on each token.
    """

    rows: list[int]  # an episode in segments has one row per segment, in segment order
    loss_mask: list[list[float]]
    advantages: list[list[float]]


def save_step_rollouts(trainer: Any, step: int, trajectories: Sequence[Trajectory]) -> Path | None:
    """Save step ``step``'s episodes of an online trainer, with the loss mask and advantages of its last update
    when the method left them (``trainer._learned_batch``: the GRPO family's ``(rows, TrainingBatch)``)."""
    saver = getattr(trainer, "_rollout_saver", None)
    if saver is None:
        saver = RolloutSaver(trainer.output_dir, trainer.config.save_rollouts, getattr(trainer, "tokenizer", None),
                             rank=trainer.world.rank)
        trainer._rollout_saver = saver
    learned = getattr(trainer, "_learned_batch", None)
    tokens = None
    if learned is not None:
        rows, batch = learned  # rows: the trajectory of each episode the batch was built from
        owners = list(rows) if batch.episode_index is None else [rows[e] for e in batch.episode_index.tolist()]
        tokens = StepTokens(owners, batch.loss_mask.tolist(), batch.advantages.tolist())
    trainer._learned_batch = None  # never paired with a later step's episodes
    return saver.save(step, trajectories, tokens)


def _compact(value: float) -> float | int:
    """``value`` rounded to :data:`DECIMALS`, and a whole number as an int (``0``, not ``0.0``: most tokens)."""
    v = round(float(value), DECIMALS) + 0.0
    return int(v) if v.is_integer() else v


def run_length(values: Sequence[float], decimals: int = DECIMALS) -> list[list[float]]:
    """``[[value, count], ...]`` of ``values`` rounded to ``decimals`` (equal neighbours merged)."""
    runs: list[list[float]] = []
    for value in values:
        v: float = round(float(value), decimals) + 0.0  # + 0.0: no "-0.0" in the file
        v = int(v) if v.is_integer() else v
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return runs


class RolloutSaver:
    """Writes every ``every``-th step's episodes (and their token data) under ``output_dir/rollouts``.

    Args:
        output_dir: The run's output directory.
        every: Save steps whose number (counted from 1) is a multiple of this; 0 saves none.
        tokenizer: Decodes token ids to the text the token view shows (``None``: ids are shown as numbers).
        rank: This process's rank; ranks other than 0 add ``-rank<r>`` to their file names.
    """

    def __init__(self, output_dir: str | Path, every: int, tokenizer: Any = None, rank: int = 0) -> None:
        self.folder = Path(output_dir) / ROLLOUTS_DIR
        self.every = every
        self.tokenizer = tokenizer
        self.rank = rank
        self._pieces: dict[int, str] = {}
        self._warned = False

    def wants(self, step: int) -> bool:
        """Whether step ``step`` (counted from 1) is saved."""
        return self.every > 0 and step % self.every == 0

    def paths(self, step: int) -> tuple[Path, Path]:
        """The trajectories file and its token sidecar for ``step``."""
        stem = f"step-{step:06d}" + (f"-rank{self.rank}" if self.rank else "")
        return self.folder / f"{stem}.jsonl", self.folder / f"{stem}.tokens.jsonl"

    def save(self, step: int, trajectories: Sequence[Trajectory], tokens: StepTokens | None = None) -> Path | None:
        """Write step ``step``'s episodes when it is due; returns the trajectories file (``None``: not due, or the
        disk refused it, which is logged once and leaves the run going)."""
        if not self.wants(step):
            return None
        path, sidecar = self.paths(step)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in (path, sidecar):  # a resumed run samples the step again: its episodes replace the old ones
                stale.unlink(missing_ok=True)
            with TrajectoryWriter(path, fsync=False) as writer:
                for t in trajectories:
                    writer.write(dataclasses.replace(t, metadata={**dict(t.metadata), "train_step": step}))
            lines = LineAppender(sidecar, fsync=False)
            try:
                for record in self._token_records(step, trajectories, tokens):
                    lines.append(encode_line(record))
            finally:
                lines.close()
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("could not save step %d's rollouts in %s (%s); training goes on without them", step,
                               self.folder, exc)
            return None
        return path

    def _token_records(self, step: int, trajectories: Sequence[Trajectory], tokens: StepTokens | None) -> list[dict[str, Any]]:
        rows_of: dict[int, list[int]] = {}
        for r, i in enumerate(tokens.rows if tokens is not None else ()):
            rows_of.setdefault(i, []).append(r)
        records = []
        for i, t in enumerate(trajectories):
            if not t.has_tokens:
                continue
            try:
                views = t.token_views()
            except ValueError:  # inconsistent token records: the episode is shown as text only
                continue
            rows = rows_of.get(i, [])
            trained = tokens is not None and len(rows) == len(views)
            ids: list[int] = []
            mask: list[float] = []
            logprob: list[float] = []
            advantage: list[float] = []
            for k, view in enumerate(views):
                n = len(view)
                ids += view.input_ids
                logprob += view.logprobs
                if trained:
                    mask += tokens.loss_mask[rows[k]][:n]  # type: ignore[union-attr]
                    advantage += tokens.advantages[rows[k]][:n]  # type: ignore[union-attr]
                else:
                    mask += view.loss_mask
                    advantage += [0.0] * n
            record: dict[str, Any] = {
                "traj_id": t.traj_id, "train_step": step, "tokens": [self._piece(tid) for tid in ids],
                "mask": run_length(mask, 0), "logprob": [_compact(x) for x in logprob],
                "advantage": run_length(advantage), "trained": trained}
            if len(views) > 1:
                record["segments"] = [len(v) for v in views]
            records.append(record)
        return records

    def _piece(self, token_id: int) -> str:
        """The text of one token id, decoded on its own (cached: a vocabulary repeats)."""
        piece = self._pieces.get(token_id)
        if piece is None:
            try:
                piece = self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"<{token_id}>"
                if "\ufffd" in piece:  # one byte of a multi-byte character: the byte-level name says which
                    piece = str(self.tokenizer.convert_ids_to_tokens(token_id))
            except Exception:  # noqa: BLE001 - an id the tokenizer cannot decode is still shown
                piece = f"<{token_id}>"
            self._pieces[token_id] = piece
        return piece
