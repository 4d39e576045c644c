"""What ArCHer and online filtered BC share: a policy trained on stored turns, one utterance at a time.

Both run the one online loop (:class:`~agentgym.trainers.loop.OnlineTrainer`) and keep every turn they sample
(``(s, a, r, s')`` transitions, :mod:`agentgym.trainers.replay`); their update trains the actor on turns drawn
from that store, each as ``log pi(a | s)`` of an utterance given its exact prompt ids. This module holds their
config fields and those shared pieces; :mod:`agentgym.trainers.archer` adds the critic, and
:mod:`agentgym.trainers.filtered_bc` the return filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from agentgym.policies import SamplingParams
from agentgym.trainers.batch import sequence_logprobs
from agentgym.trainers.config import TrainerConfig
from agentgym.trainers.loop import OnlineTrainer
from agentgym.trainers.replay import Transition, transitions_from_trajectory
from agentgym.trajectory import Trajectory

__all__ = ["ReplayActorConfig", "ReplayActorTrainer"]


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
    """Most tokens per utterance (spec default 32)."""
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
    batch_size: int = 16
    """Transitions per micro-batch."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; their gradients are averaged (spec 2.6: the reference code sums, so
    its lr equals this lr divided by grad_accum_steps)."""

    trainer_name: ClassVar[str] = "replay_actor"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("actor_steps", "batch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
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


class ReplayActorTrainer(OnlineTrainer):
    """The loop plus the actor pieces ArCHer and filtered BC share (see the module docstring)."""

    config: ReplayActorConfig

    def _decode(self, ids: tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _transitions(self, step: int, trajectories: list[Trajectory], gamma: float) -> list[Transition]:
        """The turns of this step's episodes, each episode named ``step:index`` (not its random ``traj_id``), so
        a resumed run stores exactly the buffer of an uninterrupted one."""
        out: list[Transition] = []
        for k, t in enumerate(trajectories):
            out.extend(transitions_from_trajectory(t, self._decode, gamma=gamma, episode=f"{step}:{k}"))
        return out

    def _sample_utterances(self, states: list[tuple[int, ...]], seed: int) -> list[tuple[int, ...]]:
        """Fresh utterances ``a_pi ~ pi(. | s)`` at buffer states (no gradient)."""
        cfg = self.config
        self.model.eval()
        params = SamplingParams(max_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, top_p=cfg.top_p,
                                seed=seed)
        generations = self.policy.generate([list(s) for s in states], params)
        return [tuple(g.token_ids or ()) for g in generations]

    def _utterance_logprobs(self, states: list[tuple[int, ...]], actions: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B, L] log-probs, [B, L] mask)`` of each utterance given its state (right-padded, exact ids)."""
        cfg = self.config
        width = max(len(s) + len(a) for s, a in zip(states, actions))
        pad = int(self.tokenizer.pad_token_id or 0)
        ids = torch.full((len(states), width), pad, dtype=torch.long)
        attention = torch.zeros((len(states), width), dtype=torch.long)
        mask = torch.zeros((len(states), width), dtype=torch.float32)
        for i, (s, a) in enumerate(zip(states, actions)):
            ids[i, : len(s) + len(a)] = torch.tensor(list(s) + list(a), dtype=torch.long)
            attention[i, : len(s) + len(a)] = 1
            mask[i, len(s): len(s) + len(a)] = 1.0
        logp = sequence_logprobs(self.model, ids.to(cfg.device), attention.to(cfg.device), cfg.temperature)
        return logp, mask.to(cfg.device)

    def _clip_and_step(self, parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                       scheduler: Any = None) -> float:
        limit = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(parameters, limit)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return float(norm)
