"""Trajectories to training tensors (one sequence per trajectory segment, not one per turn).

An episode whose history a context strategy rewrote (a window, a summary) is several token-exact sequences, its
segments (:meth:`Trajectory.token_views`); each becomes a row, and :attr:`TrainingBatch.episode_index` says which
trajectory a row came from, so its segments share the trajectory's sample mask, return and advantage. An
unsegmented episode is one row, as before.

The ids come straight from each trajectory's token views (the ids the policy sampled and the ids the
ChatAgent encoded for observations); nothing is re-tokenised. Sequences are right-padded; the loss mask
is 0 on padding, prompts, observations and template glue.

Trajectories of a vision-language model hold image placeholder tokens in their (masked) observation ids; the
batch keeps each row's images (:attr:`TrainingBatch.images`) so the log-prob forward pass gets the same pixel
values the sampler's did (:func:`vision_inputs`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentgym.trainers.logprobs import DEFAULT_CHUNK_SIZE, token_logprobs
from agentgym.utils.images import ImageRef
from agentgym.trajectory import TokenView, Trajectory

__all__ = ["TrainingBatch", "build_batch", "per_row", "right_padded", "sequence_logprobs", "vision_inputs"]


@dataclass
class TrainingBatch:
    """Padded tensors for N trajectories of padded length L.

    Attributes:
        input_ids: ``[N, L]`` token ids (padding: ``pad_id``).
        attention_mask: ``[N, L]`` 1 on real tokens.
        loss_mask: ``[N, L]`` float, 1 exactly on trained (sampled, unmasked) tokens.
        advantages: ``[N, L]`` per-token advantages (a trajectory-level method puts one value on every token;
            step-level methods put each step's value on that step's tokens).
        sampler_logprobs: ``[N, L]`` log-probs recorded at sampling time (0 off the mask).
        old_logprobs: ``[N, L]`` log-probs of the policy before the update (filled by the trainer).
        ref_logprobs: ``[N, L]`` reference-model log-probs, when a KL term is used.
        turn_index: ``[N, L]`` the turn (step) each token belongs to, ``-1`` on padding.
        images: Per row, the images whose placeholder tokens its ids hold, in order (``None``: a text batch).
        episode_index: ``[N]`` the trajectory (index into the list the batch was built from) each row came from;
            the segments of one episode share it. ``None``: row ``i`` is trajectory ``i``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    sampler_logprobs: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    images: list[tuple[ImageRef, ...]] | None = None
    episode_index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n, width = (int(d) for d in self.input_ids.shape)
        self.advantages = _per_token(self.advantages, n, width)  # [N] is accepted and put on every token

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor | slice) -> TrainingBatch:
        """Rows ``index`` of every tensor, trimmed to the longest remaining sequence."""
        rows = {name: getattr(self, name) for name in ("input_ids", "attention_mask", "loss_mask", "advantages",
                                                        "sampler_logprobs", "old_logprobs", "ref_logprobs",
                                                        "turn_index", "episode_index")}
        picked = {k: (v[index] if v is not None else None) for k, v in rows.items()}
        width = int(picked["attention_mask"].sum(dim=1).max().item()) if len(picked["input_ids"]) else 0
        for k, v in picked.items():
            if v is not None and v.dim() == 2:
                picked[k] = v[:, :width]
        images = None
        if self.images is not None:
            rows_picked = range(len(self))[index] if isinstance(index, slice) else torch.as_tensor(index).tolist()
            images = [self.images[i] for i in ([rows_picked] if isinstance(rows_picked, int) else rows_picked)]
        return TrainingBatch(**picked, images=images)

    def micro_batches(self, size: int) -> Iterator[TrainingBatch]:
        for start in range(0, len(self), size):
            yield self.select(slice(start, start + size))


def build_batch(trajectories: Sequence[Trajectory], advantages: Sequence[float] | torch.Tensor,
                sample_mask: Sequence[bool] | torch.Tensor, pad_id: int) -> TrainingBatch:
    """Stack token views, one row per segment; rows of a trajectory whose ``sample_mask`` is False get an all-zero
    loss mask.

    ``advantages`` is ``[T]`` (one value per trajectory, put on all tokens of all its segments) or ``[N, L]`` per
    token of each row.

    Raises:
        ValueError: ``sample_mask`` or ``[T]`` advantages without one entry per trajectory.
    """
    owner: list[int] = []
    views = []
    for i, t in enumerate(trajectories):
        for view in t.token_views():
            views.append(view)
            owner.append(i)
    width = max((len(v) for v in views), default=0)
    n = len(views)
    if len(sample_mask) != len(trajectories):
        raise ValueError(f"sample_mask has {len(sample_mask)} entries for {len(trajectories)} trajectories; pass one "
                         "per trajectory.")
    episode_index = torch.tensor(owner, dtype=torch.long)
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    if adv.dim() == 1:
        if adv.shape[0] != len(trajectories):
            raise ValueError(f"advantages has {adv.shape[0]} entries for {len(trajectories)} trajectories; pass one "
                             "per trajectory (or [rows, L] per token).")
        adv = adv[episode_index] if n else adv[:0]
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.float32)
    logps = torch.zeros((n, width), dtype=torch.float32)
    turn_index = torch.full((n, width), -1, dtype=torch.long)
    keep = torch.as_tensor(sample_mask, dtype=torch.bool)
    for i, view in enumerate(views):
        length = len(view)
        input_ids[i, :length] = torch.tensor(view.input_ids, dtype=torch.long)
        attention[i, :length] = 1
        if keep[owner[i]]:
            loss_mask[i, :length] = torch.tensor(view.loss_mask, dtype=torch.float32)
        logps[i, :length] = torch.tensor(view.logprobs, dtype=torch.float32)
        turn_index[i, :length] = torch.tensor(view.turn_index, dtype=torch.long)
    images = [_row_images(trajectories[owner[i]], view) for i, view in enumerate(views)]
    return TrainingBatch(input_ids, attention, loss_mask, adv, logps, turn_index=turn_index,
                         images=images if any(images) else None, episode_index=episode_index)


def _row_images(trajectory: Trajectory, view: TokenView) -> tuple[ImageRef, ...]:
    """The images whose placeholder tokens a row holds: the trajectory's, or one segment's turns' images."""
    if view.segment_index == 0 and trajectory.num_segments == 1:
        return trajectory.prompt_images
    first, last = view.turn_index[0], view.turn_index[-1]
    return tuple(image for turn in trajectory.turns[first:last + 1] for image in turn.images)


def per_row(batch: TrainingBatch, values: Sequence[Any]) -> list[Any]:
    """``values`` given per trajectory (the list the batch was built from), repeated for each of its rows."""
    if batch.episode_index is None:
        return list(values)
    return [values[i] for i in batch.episode_index.tolist()]


def _per_token(advantages: Sequence[float] | torch.Tensor, n: int, width: int) -> torch.Tensor:
    """``[N, L]`` float32 advantages from ``[N]`` (broadcast along each row) or ``[N, L]``."""
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    if adv.dim() == 2 and adv.shape[0] == n and adv.shape[1] >= width:
        return adv[:, :width]  # select() trims rows to their longest sequence
    if adv.dim() == 1 and adv.shape[0] == n:
        return adv[:, None].expand(n, width).clone()
    raise ValueError(f"advantages has shape {tuple(adv.shape)}; pass [{n}] (one per trajectory) or [{n}, {width}].")


def vision_inputs(batch: TrainingBatch, processor: Any, device: Any = None,
                  dtype: torch.dtype | None = None) -> dict[str, torch.Tensor] | None:
    """The image tensors of a batch's rows, row by row in order (how a VLM's forward merges them into the image
    tokens), from the model's processor; ``None`` for a batch without images.

    Raises:
        ConfigError: The batch has images but no processor was given.
    """
    if not batch.images or not any(batch.images):
        return None
    if processor is None:
        from agentgym.errors import ConfigError

        raise ConfigError("These trajectories hold images (a vision-language model's); pass the model's processor "
                          "(AutoProcessor.from_pretrained(model_dir)) to compute their pixel values.")
    from agentgym.models.vision import pixel_inputs

    return pixel_inputs(processor, [image for row in batch.images for image in row], device, dtype)


def sequence_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      temperature: float = 1.0, chunk_size: int | None = DEFAULT_CHUNK_SIZE, *,
                      vision: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``[N, L]`` log-prob of each token given the ones before it; 0 where no real token precedes it (position 0,
    a left-padded row's first token) and at padding.

    Computed in float32 at the sampling temperature, so that with an unchanged model it matches what
    the sampler recorded. ``chunk_size`` token positions go through ``lm_head`` at a time, so at most
    ``chunk_size x V`` float32 logits exist at once, in backward too (see :mod:`agentgym.trainers.logprobs`);
    ``None`` computes the full ``[N, L, V]`` logits (same values, much more memory at large vocabularies).
    ``vision`` (:func:`vision_inputs`) goes to a vision-language model's forward with the ids.

    Raises:
        ConfigError: if ``chunk_size`` is not a positive int or ``None``.
    """
    from agentgym.models.geometry import rope_position_ids

    # A causal model already keeps every real token of a right-padded row from attending to the padding after
    # it, so there the mask adds only cost: without one, and with positions counting up along the whole row (the
    # real tokens' own; positions that stall at the padding read as packed sequences and bring a mask back), SDPA
    # runs its causal kernel, which skips the blocks above the diagonal and builds no [N, L, L] mask (BabyAI's
    # 1,500-token rows: forward 1.8x, forward and backward 1.4x less CPU time).
    dropped = vision is None and right_padded(attention_mask)
    if dropped:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
    else:
        position_ids = rope_position_ids(model, input_ids, attention_mask, vision)
    logp = token_logprobs(model, input_ids, attention_mask=None if dropped else attention_mask,
                          position_ids=position_ids, temperature=temperature, chunk_size=chunk_size,
                          extra_inputs=vision)
    if attention_mask.dim() != 2:
        return logp
    real = attention_mask[:, :logp.shape[1]] != 0
    scored = real.clone()  # a token scores given the real tokens before it: padding, and a row's first token, get 0
    scored[:, 1:] &= real[:, :-1]
    return logp.masked_fill(~scored, 0.0)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of a ``[N, L]`` padding mask is its real tokens followed by padding only (no token after a
    pad, no left padding): then causal attention alone gives the real tokens the values the mask would."""
    if attention_mask.dim() != 2 or attention_mask.shape[1] < 2:
        return attention_mask.dim() == 2
    mask = attention_mask != 0
    return bool((mask[:, 1:] <= mask[:, :-1]).all())
