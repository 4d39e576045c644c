"""GRPO's configuration: the policy-gradient fields GRPO, GiGPO and ARPO share (loss, KL, rewards, masks).

The fields every trainer shares (steps, tasks per step, group size, learning rate, model, suites, evaluation,
checkpoints) live in :class:`agentgym.trainers.base_config.TrainerConfig`; GiGPO's and ARPO's configs build on
this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from agentgym.trainers.base_config import TURN_KINDS, TrainerConfig

__all__ = ["GrpoConfig"]


@dataclass(frozen=True)
class GrpoConfig(TrainerConfig):
    """GRPO for multi-turn agents (G-RA, SimpleTIR, Mini-o3 and DAPO as options), with BC warm start."""

    output_dir: str = "runs/grpo"
    """Where checkpoints, metrics (JSONL + TensorBoard), the learning curve and the final model go."""
    group_size: int = 8
    """Rollouts per task (G). Group estimators need at least 2."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass; gradients accumulate, so this changes memory, never the loss."""
    packing: bool = False
    """Pack the sequences of each micro-batch into rows (block-diagonal attention) instead of padding them:
    the same log-probs and loss, about 2x faster on CPU where lengths vary widely (benchmarks/train_step.py); the
    [B,1,T,T] mask costs memory on long sequences. A micro-batch in which no two sequences fit one row is scored
    padded, under the causal kernel, whatever this says."""
    ppo_epochs: int = 1
    """Passes over each rollout batch. With more than one optimizer step a batch, pi_old is the sampler's
    log-probs where the first mini-batch's forward matches them, else a no-grad pass before the first step."""
    mini_batches: int = 1
    """Optimizer updates per epoch (the rollout batch is split into this many mini-batches)."""
    advantage: Literal["grpo", "mean_norm", "rloo"] = "grpo"
    """Group advantage estimator: GRPO's mean/std (Shao et al., 2024), mean_norm, or RLOO (LOOP)."""
    advantage_control: Literal["none", "shuffle"] = "none"
    """``shuffle`` makes this run the shuffled-advantage control: each step, after the advantages are computed
    (and before ARPO's attribution, GiGPO's rescaling to GRPO's scale, and the loss), they are permuted among the
    batch's trained episodes (GRPO, ARPO) or steps (GiGPO) with a generator seeded by the run's seed and the
    step. The update keeps the method's magnitudes, spread and noise and loses only which episode earned which
    value, so a method that ends no better than its control has learned nothing measurable. ``none``: the
    method itself."""
    singleton_advantage: Literal["zero", "raw"] = "zero"
    """Advantage of a group with one counted member: 0 (a lone score has nothing to be compared with) or the raw
    score (verl)."""
    clip_eps_low: float = 0.2
    """Lower PPO clip range."""
    clip_eps_high: float = 0.28
    """Upper PPO clip range (clip-higher when larger than clip_eps_low)."""
    dual_clip_c: float | None = 3.0
    """Dual-clip constant for negative advantages (None disables it)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    """Loss aggregation; token-mean (DAPO, Yu et al., 2025) uses the exact global token count. Under token-mean a
    trajectory weighs by its tokens: where failed episodes run on to a turn or context limit, the batch's tokens
    carry a net negative advantage (``algorithms.advantage_drift``; -0.078 against a mean |A| of 0.295 on BabyAI's
    study warm start). seq-mean-token-mean weighs each trajectory once, and has none."""
    kl_coef: float = 0.0
    """KL penalty coefficient in the loss; > 0 needs ``reference_model``."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """KL estimator (k3 = verl's low_var_kl)."""
    reference_model: str | None = None
    """Frozen reference for the KL term: a model directory, or ``initial`` for a copy of the starting weights."""
    reward: Literal["outcome", "success", "dra", "gra", "rubric"] = "outcome"
    """Trajectory score: the env's return (outcome), 1 for a success and 0 otherwise (success), outcome + step rewards
    (D-RA), gated accumulation (G-RA, Sun et al., 2025), or the score of ``rubric`` with its judge (rubric). ``success`` is for envs that score a wrong attempt below
    no attempt (MiniWoB gives -1 for a wrong click, 0 for a page left alone): under the outcome score a policy learns
    that doing nothing beats trying."""
    step_rewards: Mapping[str, float] = field(default_factory=lambda: {"tool_call": 0.05, "invalid": -0.05, "void": -0.05})
    """Per-turn shaping by turn kind, used by dra/gra (never hard-coded in envs)."""
    gra_threshold: float = 1.0
    """G-RA gate: step rewards count only when the outcome score meets this."""
    gra_cmp: Literal[">=", ">"] = ">="
    """G-RA comparison operator."""
    mask_void_turns: bool = False
    """SimpleTIR: trajectories with a void turn leave the loss (they stay in the group statistics)."""
    void_turn_kinds: tuple[str, ...] = ("void",)
    """Turn kinds that count as void for ``mask_void_turns``."""
    mask_over_turn: bool = False
    """Mini-o3: trajectories that ran out of turns while still calling tools leave the loss."""
    exclude_masked_from_group_stats: bool = False
    """Also drop masked trajectories from the group mean/std (the reference code keeps them)."""
    group_filter_std: float | None = None
    """Dynamic sampling: drop groups whose counted reward std is below this (None: keep all)."""
    off_policy_correction: Literal["auto", "none", "truncated_is", "decoupled"] = "auto"
    """How the update treats samples drawn by older weights (asynchronous training, or vLLM's numerics). Both
    corrections are decoupled PPO: the clipped ratio is taken against pi_old, the weights before this update
    (recomputed), and each token's loss is weighted by w = pi_old / pi_behaviour, pi_behaviour being the log-prob
    recorded when the token was sampled (by whichever weights sampled that turn). truncated_is uses min(w, is_cap);
    decoupled uses w and drops tokens whose w exceeds is_cap (AReaL's capped decoupled loss); auto is truncated_is
    when max_staleness > 0 and none otherwise."""
    is_cap: float = 2.0
    """Bound on the behaviour importance weight: truncated_is truncates at it, decoupled drops tokens above it."""

    trainer_name: ClassVar[str] = "grpo"
    display_name: ClassVar[str] = "GRPO"
    trainer_class: ClassVar[str] = "agentgym.trainers.grpo:GrpoTrainer"

    @property
    def corrects_off_policy(self) -> bool:
        """Whether the update weights tokens by their behaviour importance weight (see ``off_policy_correction``)."""
        return self.off_policy_correction in ("truncated_is", "decoupled") or (
            self.off_policy_correction == "auto" and self.max_staleness > 0)

    @property
    def behaviour_weight_mode(self) -> Literal["truncate", "mask"]:
        """How :func:`~agentgym.trainers.algorithms.behaviour_weights` bounds the weight for this config."""
        return "mask" if self.off_policy_correction == "decoupled" else "truncate"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.is_cap >= 1:
            raise self._fail("is_cap", f"must be >= 1 (typical 2.0), got {self.is_cap}.")
        for name in ("micro_batch_size", "ppo_epochs", "mini_batches"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
        if self.group_size < 2:
            raise self._fail("group_size", f"is {self.group_size}, but the {self.advantage!r} estimator compares rollouts "
                                      "within a group: use group_size >= 2.")
        if self.mini_batches > self.tasks_per_step * self.group_size:
            raise self._fail("mini_batches", "exceeds the number of rollouts per step; lower it or raise tasks_per_step.")
        if self.kl_coef < 0:
            raise self._fail("kl_coef", f"must be >= 0, got {self.kl_coef}.")
        if self.kl_coef > 0 and not self.reference_model:
            raise self._fail("kl_coef", f"is {self.kl_coef} but no reference_model is set: set reference_model to a model "
                                   "directory or to 'initial' (a frozen copy of the starting weights), or set kl_coef: 0.")
        if self.clip_eps_low < 0 or self.clip_eps_high < 0 or self.clip_eps_low >= 1:
            raise self._fail("clip_eps_low", "clip ranges must satisfy 0 <= clip_eps_low < 1 and clip_eps_high >= 0.")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise self._fail("dual_clip_c", f"must be > 1 (typical 3.0) or null to disable, got {self.dual_clip_c}.")
        if self.packing and self.attn_implementation == "flash_attention_2":
            raise self._fail("packing", "builds a block-diagonal [B,1,T,T] attention mask, which flash_attention_2 "
                                        "does not take: use attn_implementation: sdpa with packing, or packing: false.")
        unknown_kinds = set(self.void_turn_kinds) - set(TURN_KINDS)
        if unknown_kinds:
            raise self._fail("void_turn_kinds", f"has unknown kinds {sorted(unknown_kinds)}; choose from {TURN_KINDS}.")
        if self.mask_void_turns and {"tool_call", "answer"} <= set(self.void_turn_kinds):
            raise self._fail("void_turn_kinds", "marks every turn kind an episode can succeed with as void, so masking void "
                                           "turns would leave no token to train on; use ('void',) or ('void', 'invalid').")
        unknown_rewards = set(self.step_rewards) - set(TURN_KINDS)
        if unknown_rewards:
            raise self._fail("step_rewards", f"has unknown turn kinds {sorted(unknown_rewards)}; keys must be in {TURN_KINDS}.")
