"""ArCHer's configuration: the replay-actor fields plus the utterance-level critic's.

The trainer lives in :mod:`agentgym.trainers.archer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from agentgym.trainers.replay_actor_config import ReplayActorConfig

__all__ = ["ArcherConfig"]


@dataclass(frozen=True)
class ArcherConfig(ReplayActorConfig):
    """ArCHer (Zhou et al., 2024): replay buffer, double-Q/V utterance critic, Polyak targets, token-level actor."""

    output_dir: str = "runs/archer"
    """Checkpoints, replay buffer, metrics, learning curve and final model."""
    gamma: float = 0.95
    """Discount between turns."""
    tau: float = 0.1
    """Polyak rate of the target critic (after every critic step)."""
    critic_learning_rate: float = 1e-4
    """Adam learning rate of the critic (encoder and heads)."""
    critic_steps: int = 10
    """Critic optimizer steps per training step (``epochs``; 50 in the reference configs)."""
    critic_prior_steps: int = 0
    """Critic optimizer steps before the first training step, each a regression of the Q and V heads onto the
    Monte-Carlo returns of ``batch_size x grad_accum_steps`` turns of the ``prior_episodes``. Those episodes are the
    starting policy's own, so their returns are unbiased samples of its Q and V: the critic starts from the values
    TD learning would converge to for that policy, reached without bootstrapping from an untrained critic, and the
    actor's first advantages rank utterances by what they earned. The target critic is then a copy."""
    replay_capacity: int = 100_000
    """Transitions kept for sampling (FIFO); the JSONL file keeps them all."""
    bootstrap_truncated: bool = True
    """TD targets bootstrap through truncations (turn/context limit) and stop only at termination; False
    restores the reference code, which treats a time limit as terminal."""
    critic_encoder: Literal["policy", "minilm", "bytes", "grid"] = "policy"
    """Critic text encoder: a copy of the policy backbone, the offline pretrained all-MiniLM-L6-v2, ``bytes``: a
    small transformer trained from scratch on one token per byte, where every row of a text grid (a maze, a
    Sokoban room) lies at a fixed offset from the next, which subword tokens break (give it a
    ``critic_max_tokens`` that holds the state in bytes), or ``grid``: a recurrent convolution trained from scratch
    over the text's last character grid (a cell's neighbours above and below are its neighbours), with a GRU over
    the last ``critic_max_tokens`` bytes of the text around it; ``critic_pooling`` does not apply to it."""
    critic_hidden_size: int | None = None
    """Width of the Q/V head MLPs (None: the encoder's width)."""
    critic_max_tokens: int = 256
    """Tokens the critic reads per state or utterance (left truncation keeps the latest turns)."""
    critic_pooling: Literal["mean", "last"] = "mean"
    """How the critic turns token states into one vector: their mean, or the last real token (the only
    position where a causal backbone such as ``critic_encoder: policy`` has read the whole text)."""
    critic_action_view: Literal["separate", "joint"] = "separate"
    """What the Q heads read of an utterance: its text encoded alone (the reference), or the state's text followed
    by it as one sequence, so the utterance's tokens attend to the state (with ``critic_pooling: last`` the pooled
    token has read both). Encoded alone, ``move("west")`` has one embedding in every state, and whether it is good
    there must come from the heads crossing two pooled vectors."""
    critic_input: Literal["history", "observation", "state_key"] = "history"
    """What the critic reads as the state: the whole conversation so far (the reference code), the last
    observation alone, or the env's ``state_key()`` recorded on each turn. Where the observation (or the key)
    defines the state, as in a maze whose observation is the grid, the history only adds tokens the critic must
    learn to ignore (hundreds per state against tens) and splits one state into many texts, so its value is fit
    from far fewer samples. The actor always reads the full prompt."""

    actor_baseline: Literal["value", "sampled"] = "value"
    """What the actor's advantage subtracts from ``min(Q1, Q2)(s, a)``: the learned ``min(V1, V2)(s)`` (the
    reference), or ``sampled``: the mean Q of the other ``actor_samples_per_state`` utterances drawn at the same
    state. A V that lags Q shifts every advantage of a batch by one offset, so the actor raises or lowers whatever
    it sampled; the sampled baseline cancels such an offset exactly and keeps the gradient unbiased. Each
    micro-batch then holds ``batch_size`` utterances at ``batch_size / actor_samples_per_state`` states."""
    actor_samples_per_state: int = 4
    """Utterances drawn at each buffer state when ``actor_baseline: sampled`` (>= 2, dividing ``batch_size``)."""
    actor_optimizer: Literal["adamw", "sgd"] = "adamw"
    """The actor's optimizer, at ``learning_rate``. AdamW divides each gradient by its running magnitude, so its
    step has one size whatever the advantages' scale: advantages of 1e-4 from a critic that barely separates the
    utterances move the policy as far as advantages of 1e-1, in the directions of their noise. With ``sgd`` (no
    momentum) the step is ``learning_rate`` times the gradient, which is the advantages times the log-prob
    gradients: the actor moves as far as the critic separates the utterances it sampled. Its rate is on another
    scale than AdamW's: at 1.0, a gradient of norm 0.1 (typical of a critic that ranks maze moves) takes a step of
    norm 0.1, what AdamW takes at 1e-4 on a model of about a million weights (about 1e-4 each). SGD's step
    concentrates on the weights with the largest gradients, so it is far less forgiving: on the maze with the tiny
    model, 1 and 3 collapsed the policy within four steps and 0.3 still followed the critic's wrong rankings."""

    trainer_name: ClassVar[str] = "archer"
    display_name: ClassVar[str] = "ArCHer"
    trainer_class: ClassVar[str] = "agentgym.trainers.archer:ArcherTrainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.gamma <= 1:
            raise self._fail("gamma", f"must be in [0, 1], got {self.gamma}.")
        if not 0 < self.tau <= 1:
            raise self._fail("tau", f"must be in (0, 1] (0 would freeze the target critic), got {self.tau}.")
        if not self.critic_learning_rate > 0:
            raise self._fail("critic_learning_rate", f"must be > 0, got {self.critic_learning_rate}.")
        for name in ("critic_steps", "replay_capacity"):
            if getattr(self, name) < 1:
                raise self._fail(name, f"must be >= 1, got {getattr(self, name)}.")
        if self.critic_prior_steps < 0:
            raise self._fail("critic_prior_steps", f"must be >= 0, got {self.critic_prior_steps}.")
        if self.critic_prior_steps and not self.prior_episodes:
            raise self._fail("critic_prior_steps", f"is {self.critic_prior_steps} but prior_episodes is 0, so there "
                                                   "are no returns to regress onto; set prior_episodes (e.g. 1024) "
                                                   "or critic_prior_steps: 0.")
        if self.critic_hidden_size is not None and self.critic_hidden_size < 1:
            raise self._fail("critic_hidden_size", "must be >= 1 or null.")
        if self.critic_max_tokens < 8:
            raise self._fail("critic_max_tokens", f"must be >= 8, got {self.critic_max_tokens}.")
        if self.critic_input not in ("history", "observation", "state_key"):
            raise self._fail("critic_input", f"must be history, observation or state_key, got {self.critic_input!r}.")
        if self.actor_baseline == "sampled" and (self.actor_samples_per_state < 2
                                                 or self.batch_size % self.actor_samples_per_state):
            raise self._fail("actor_samples_per_state",
                             f"with actor_baseline: sampled it must be >= 2 and divide batch_size ({self.batch_size}), "
                             f"got {self.actor_samples_per_state}; e.g. 4 with batch_size 16.")
        if self.critic_pooling not in ("mean", "last"):
            raise self._fail("critic_pooling", f"must be mean or last, got {self.critic_pooling!r}.")
