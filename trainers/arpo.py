"""ARPO: GRPO over entropy-guided branching rollouts (spec section 4, project decision 2).

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
from dataclasses import dataclass
from typing import ClassVar, Literal

from agentgym.trainers import algorithms as alg
from agentgym.trainers.batch import TrainingBatch
from agentgym.trainers.config import GrpoConfig
from agentgym.trainers.grpo import GrpoTrainer
from agentgym.trainers.seeding import mix_seed

from agentgym.rollout.branching import BranchingConfig
from agentgym.trainers.async_rollouts import RolloutJob
from agentgym.trajectory import Trajectory

__all__ = ["ArpoConfig", "ArpoTrainer"]


@dataclass(frozen=True)
class ArpoConfig(GrpoConfig):
    """GRPO's fields plus ARPO's branching and attribution (defaults: spec 4.4 and the project decisions).

    ``group_size`` is ARPO's global budget M (trajectories per task); ``initial_rollouts`` is N.
    """

    output_dir: str = "runs/arpo"
    """Where checkpoints, metrics (JSONL + TensorBoard), the learning curve and the final model go."""
    clip_eps_high: float = 0.2
    """Upper PPO clip range (ARPO's scripts use 0.2 on both sides)."""
    initial_rollouts: int = 4
    """N: fresh trajectories per task; the other group_size - N come from branching (or restarts)."""
    beam_size: int = 2
    """At most beam_size - 1 branches per trajectory per round."""
    branch_probability: float = 0.5
    """alpha: branch chance when the entropy after a tool result equals the initial entropy."""
    entropy_weight: float = 0.2
    """beta: P(branch) = clip(alpha + beta * (H_now - H_init), 0, 1)."""
    entropy_window: int = 20
    """K: leading tokens of a turn whose entropy counts."""
    entropy_top_k: int = 10
    """k: candidate log-probs per token for the truncated entropy (0: the policy's exact entropies)."""
    entropy_timing: Literal["paper", "code"] = "paper"
    """paper: measure the turn right after a tool result, branch siblings of it (no wasted generation);
    code: the reference code's one-step lag (entropy of the turn before the tool call)."""
    branch_after: tuple[str, ...] = ("tool_call",)
    """Turn kinds after which a trajectory may branch."""
    fork: Literal["auto", "replay"] = "auto"
    """How a branch gets its env: copy forkable envs and replay the others (auto), or always replay."""
    attribution: Literal["soft", "hard"] = "soft"
    """soft: every trajectory keeps its own advantage on shared prefixes; hard: shared tokens get the mean."""
    hard_dedupe: bool = False
    """Hard attribution only: train a token shared by d branches once (weight 1/d per copy), not d times."""

    trainer_name: ClassVar[str] = "arpo"
    display_name: ClassVar[str] = "ARPO"
    trainer_class: ClassVar[str] = "agentgym.trainers.arpo:ArpoTrainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.initial_rollouts > self.group_size:
            raise self._fail("initial_rollouts", f"({self.initial_rollouts}) exceeds group_size ({self.group_size}), the "
                             "budget M of trajectories per task; use initial_rollouts <= group_size (spec: 8 of 16).")
        if self.hard_dedupe and self.attribution != "hard":
            raise self._fail("hard_dedupe", "only applies to attribution: hard; set attribution: hard or hard_dedupe: false.")
        try:
            self.branching()
        except ValueError as exc:
            raise self._fail("branching", str(exc)) from exc

    def branching(self) -> BranchingConfig:
        """The sampler settings this config describes."""
        return BranchingConfig(
            budget=self.group_size, initial_rollouts=self.initial_rollouts, beam_size=self.beam_size,
            branch_probability=self.branch_probability, entropy_weight=self.entropy_weight,
            entropy_window=self.entropy_window, entropy_top_k=self.entropy_top_k, entropy_timing=self.entropy_timing,
            branch_after=self.branch_after, fork=self.fork, seed=self.seed,
        )


class ArpoTrainer(GrpoTrainer):
    """``ArpoTrainer(config).train()``; see the module docstring."""

    config: ArpoConfig

    def _rollout_job(self, step: int) -> RolloutJob:
        """M trajectories per task from the branching sampler (the same specs and seeds GRPO would use), run here
        or by the asynchronous rollout worker: a branch taken while weights change mid-step continues with the new
        ones, as any partial rollout does, and inherits its parent's per-turn policy versions."""
        branching = dataclasses.replace(self.config.branching(), seed=mix_seed(self.config.seed, step, self.world.rank))
        return dataclasses.replace(super()._rollout_job(step), branching=branching)

    def _attribute(self, batch: TrainingBatch, trajectories: list[Trajectory]) -> TrainingBatch:
        cfg = self.config
        if cfg.attribution == "soft" or len(batch) == 0:
            return batch
        lengths = batch.attention_mask.sum(dim=1).tolist()
        sequences = [row[:n] for row, n in zip(batch.input_ids.tolist(), lengths)]  # padding is never shared
        token_adv, weights = alg.arpo_token_advantages(
            sequences, batch.advantages, [t.group_id for t in trajectories], mode="hard",
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
