"""The config fields ArCHer and online filtered BC share, and their (smaller) defaults.

Both train a policy on stored turns (:mod:`agentgym.trainers.replay_actor`); their own configs,
:mod:`agentgym.trainers.archer_config` and :mod:`agentgym.trainers.filtered_bc_config`, build on this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentgym.trainers.base_config import TrainerConfig

__all__ = ["ReplayActorConfig"]


@dataclass(frozen=True)
class ReplayActorConfig(TrainerConfig):
    """The fields ArCHer and filtered BC add to the shared ones, and their (smaller) defaults: one episode per task
    and step, a constant learning rate, short turns."""

    output_dir: str = "runs/archer"
    """Checkpoints, stored turns, metrics (JSONL + TensorBoard), learning curve and final model."""
    steps: int = 20
    """Collect-then-update steps."""
    group_size: int = 1
    """Episodes per task and step; these methods compare no groups, so 1 spreads a step over more tasks."""
    learning_rate: float = 1e-4
    """AdamW learning rate of the actor (per averaged micro-batch gradient)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up in optimizer steps (the reference code uses a constant rate)."""
    max_tokens_per_turn: int = 32
    """Most tokens per utterance (32 in ArCHer's reference configs)."""
    max_context_tokens: int | None = 1024
    """Episodes whose context would exceed this end with context_limit (a truncation)."""
    eval_every: int = 5
    """Evaluate on the held-out split every N steps (and before the first and after the last)."""
    eval_tasks: int = 50
    """Held-out tasks per evaluation."""
    checkpoint_every: int = 5
    """Checkpoint every N steps (0: only at the end)."""
    actor_steps: int = 3
    """Actor optimizer steps per training step (``actor_epochs``)."""
    actor_warmup_steps: int = 2
    """Training steps before the first actor update (ArCHer's critic trains from the start)."""
    prior_episodes: int = 0
    """Episodes the starting policy plays on training tasks before the first step (one each of a seeded draw of the
    training split, at the training temperature), stored as a step's turns are: ArCHer's replay buffer, filtered
    BC's pool. Off-policy data the run starts from; a run of either method at the same seed gets the same
    episodes, and they count among the run's episodes (``train/episodes_seen``), so two methods compared at equal
    episodes stay equal."""
    batch_size: int = 16
    """Transitions per micro-batch."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; their gradients are averaged (ArCHer's reference code sums, so
    its lr equals this lr divided by grad_accum_steps)."""

    trainer_name: ClassVar[str] = "replay_actor"
    trains_on_token_views: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("actor_steps", "batch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
        if self.prior_episodes < 0:
            raise self._fail("prior_episodes", f"must be >= 0 (0: no episodes before the first step), got "
                                               f"{self.prior_episodes}.")
        if self.actor_warmup_steps < 0:
            raise self._fail("actor_warmup_steps", f"must be >= 0, got {self.actor_warmup_steps}.")
        if self.actor_warmup_steps >= self.steps:
            raise self._fail("actor_warmup_steps", f"is {self.actor_warmup_steps} but there are only {self.steps} "
                                                   "steps, so the actor would never be updated; lower it.")
        if self.lora is not None:
            raise self._fail("lora", f"LoRA is supported by the GRPO, GiGPO and ARPO trainers only for now, not by "
                                     f"{self.trainer_name}: remove lora (dtype: bfloat16 and gradient_checkpointing: "
                                     "true also save memory here), or train with trainer: grpo.")
        if self.generation_backend != "hf":
            raise self._fail("generation_backend", f"{self.trainer_name} samples fresh utterances from the training "
                                                   "model between updates: use generation_backend: hf.")
