"""Online filtered behaviour cloning's configuration: the replay-actor fields plus the return filter.

The trainer lives in :mod:`agentgym.trainers.filtered_bc`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentgym.trainers.replay_actor_config import ReplayActorConfig

__all__ = ["FilteredBCConfig"]


@dataclass(frozen=True)
class FilteredBCConfig(ReplayActorConfig):
    """Online filtered BC (ArCHer's baseline): clone the top-``quantile`` episodes of everything collected so far."""

    output_dir: str = "runs/filtered_bc"
    """Checkpoints, the episode pool, metrics, learning curve and final model."""
    quantile: float = 0.9
    """Episodes with return >= this quantile of the pool's returns are cloned."""
    skip_if_uniform: bool = True
    """Skip the update while every pooled return is equal (otherwise: plain BC on the policy's own samples)."""

    trainer_name: ClassVar[str] = "filtered_bc"
    display_name: ClassVar[str] = "filtered BC"
    trainer_class: ClassVar[str] = "agentgym.trainers.filtered_bc:FilteredBCTrainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.quantile <= 1:
            raise self._fail("quantile", f"must be in [0, 1] (0.9 in the reference code), got {self.quantile}.")
