"""GiGPO's configuration: GRPO's fields plus the step-level comparison within anchor-state groups.

The trainer and the advantage estimate live in :mod:`agentgym.trainers.gigpo`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from agentgym.trainers.grpo_config import GrpoConfig

__all__ = ["GigpoConfig"]


@dataclass(frozen=True)
class GigpoConfig(GrpoConfig):
    """GRPO's fields plus GiGPO's step-level comparison (defaults: verl-agent's GiGPO scripts, Feng et al., 2025)."""

    output_dir: str = "runs/gigpo"
    """Where checkpoints, metrics (JSONL + TensorBoard), the learning curve and the final model go."""
    gamma: float = 0.95
    """Discount of the step returns ``R_t = sum_k gamma^(k-t) r_k`` compared within anchor groups."""
    omega: float = 1.0
    """Weight of the step advantage: ``A = A^E + omega * A^S`` (0 gives GRPO with ``mean_norm`` statistics)."""
    gigpo_mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """Both comparisons subtract the group mean; mean_std_norm also divides by the std (ALFWorld, search)."""
    episode_stats: Literal["trajectories", "all_steps"] = "trajectories"
    """Episode statistics over one score per trajectory (the paper) or over every step sample (the reference
    code's compute_mean_std_cross_steps, which weighs long episodes more)."""
    invalid_penalty: float = 0.1
    """Subtracted from a step's episode score and step return when its action did not parse, a ``void`` or
    ``invalid`` turn (0 disables it)."""
    similarity_thresh: float | None = None
    """None: anchors match exactly. A ratio in (0, 1]: text states at least this similar share a group (greedy)."""
    advantage_scale: Literal["native", "grpo"] = "native"
    """native: ``A^E + omega * A^S`` as the paper computes it. grpo: that sum rescaled, per batch, to the mean
    ``|A|`` over trained tokens that GRPO's estimator (the ``advantage`` field) gives the same batch. GiGPO's
    ``mean_norm`` statistics leave advantages about half GRPO's size (no division by the std), which at one
    learning rate is a hidden step-size change; one scalar per batch keeps every sign and ratio, so a comparison
    at equal scale compares only the credit."""

    trainer_name: ClassVar[str] = "gigpo"
    display_name: ClassVar[str] = "GiGPO"
    trainer_class: ClassVar[str] = "agentgym.trainers.gigpo:GigpoTrainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.gamma <= 1:
            raise self._fail("gamma", f"must be in [0, 1] (0.95 in the reference scripts), got {self.gamma}.")
        if self.omega < 0:
            raise self._fail("omega", f"must be >= 0 (1.0 in the reference scripts), got {self.omega}.")
        if self.invalid_penalty < 0:
            raise self._fail("invalid_penalty", f"must be >= 0 (0.1 in the reference scripts), got {self.invalid_penalty}.")
        if self.similarity_thresh is not None and not 0 < self.similarity_thresh <= 1:
            raise self._fail("similarity_thresh", f"must be in (0, 1] (0.9 for search) or null for exact matching, "
                                                  f"got {self.similarity_thresh}.")
        if self.advantage_scale not in ("native", "grpo"):
            raise self._fail("advantage_scale", f"must be native (the paper's) or grpo (rescaled to GRPO's mean "
                                                f"|advantage| on the batch), got {self.advantage_scale!r}.")
        if self.reward != "outcome":
            raise self._fail("reward", f"is {self.reward!r}, but GiGPO compares the env's per-step rewards, which "
                                       "already sum to the outcome; use reward: outcome (shape invalid turns with "
                                       "invalid_penalty), or trainer: grpo for D-RA/G-RA.")
