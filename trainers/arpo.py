"""ARPO: GRPO over entropy-guided branching rollouts (Dong et al., 2025, arXiv 2507.19849).

``ArpoTrainer(config).train()`` is :class:`~agentgym.trainers.grpo.GrpoTrainer` (the one online loop with the
clipped policy-gradient update) with two parts swapped:

1. Rollouts come from :class:`~agentgym.rollout.branching.BranchingSampler`: ``initial_rollouts`` (N) fresh
   trajectories per task, grown to ``group_size`` (M) by branching after tool results, where the
   entropy of the model's next turn rose relative to its first turn.
2. Advantages reach tokens by ``attribution``: ``soft`` (default, the reference code) keeps each
   trajectory's advantages on its tokens; ``hard`` gives tokens shared by several branches the mean
   advantage of those branches at that token (``hard_dedupe`` also trains each shared token once instead of once
   per copy).

Everything else (scores, masks, the clipped loss with exact global token counts, checkpoints, resume,
evaluation without branching) is the GRPO trainer's. With ``branch_probability = 0`` and
``entropy_weight = 0`` nothing can branch, all M trajectories start fresh, and a step equals a GRPO step
with the same seed (tested).
"""

from __future__ import annotations

import dataclasses

from agentgym.trainers import algorithms as alg
from agentgym.trainers.arpo_config import ArpoConfig
from agentgym.trainers.batch import TrainingBatch, per_row
from agentgym.trainers.grpo import GrpoTrainer
from agentgym.trainers.rollout_worker import RolloutJob
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["ArpoConfig", "ArpoTrainer"]


class ArpoTrainer(GrpoTrainer):
    """``ArpoTrainer(config).train()``; see the module docstring."""

    config: ArpoConfig

    def _rollout_job(self, step: int) -> RolloutJob:
        """M trajectories per task from the branching sampler (the same specs and seeds GRPO would use), run here
        or by the asynchronous rollout worker: a branch taken while weights change mid-step continues with the new
        ones, as any partial rollout does, and inherits its parent's per-turn policy versions."""
        branching = dataclasses.replace(self.config.branching, seed=mix_seed(self.config.seed, step, self.world.rank))
        return dataclasses.replace(super()._rollout_job(step), branching=branching)

    def _attribute(self, batch: TrainingBatch, trajectories: list[Trajectory]) -> TrainingBatch:
        cfg = self.config
        if cfg.attribution == "soft" or len(batch) == 0:
            return batch
        lengths = batch.attention_mask.sum(dim=1).tolist()
        sequences = [row[:n] for row, n in zip(batch.input_ids.tolist(), lengths)]  # padding is never shared
        token_adv, weights = alg.arpo_token_advantages(
            sequences, batch.advantages, per_row(batch, [t.group_id for t in trajectories]), mode="hard",
            dedupe=cfg.hard_dedupe, width=int(batch.input_ids.shape[1]),
            counted=batch.loss_mask.sum(dim=1) > 0)  # masked/crashed rows must not vote on shared prefixes
        batch.advantages = token_adv
        batch.loss_mask = batch.loss_mask * weights
        return batch

    def _rollout_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        stats = self._rollout_stats
        metrics = {f"arpo/{k}": float(v) for k, v in stats.items() if isinstance(v, (int, float))}
        for turn, count in stats.get("branch_points_by_turn", {}).items():
            metrics[f"arpo/branch_points_turn_{turn}"] = float(count)
        return metrics
