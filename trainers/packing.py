"""Sequence packing: several trajectories per row instead of one right-padded row each.

Why: multi-turn trajectories have long-tailed lengths, so right padding to the longest sequence of a
micro-batch (:mod:`agentgym.trainers.batch`) spends much of every forward and backward pass on padding.
Packing concatenates sequences into rows of a fixed token budget; each sequence keeps its own positions
(``position_ids`` restart at 0) and a block-diagonal causal mask stops attention across sequences, so
every per-token log-prob equals the padded one up to float rounding.

The price: the mask is a dense ``[B, 1, T, T]`` float tensor (``4 * B * T * T`` bytes in float32), and
the attention kernels that accept an arbitrary mask on CPU (eager, SDPA) compute every ``T x T`` block,
masked or not. Attention work per row therefore grows with ``T ** 2`` however short the packed
sequences are; see ``benchmarks/train_step.py`` for when packing pays off.

Usage (one micro-batch = a few bins)::

    bins = pack_sequences(batch.attention_mask.sum(1).tolist(), max_tokens=2048)
    inputs = packed_inputs(batch, bins[:4])
    logp = packed_sequence_logprobs(model, inputs)              # [B, T], 0 at each sequence start
    per_token, _ = clipped_policy_loss(logp, inputs["old_logprobs"], inputs["advantages"],
                                       loss_mask=inputs["loss_mask"])
    full = unpack_logprobs(logp, inputs, num_sequences=len(batch), width=batch.input_ids.shape[1])

Only token-level quantities survive packing unchanged: ``aggregate_loss(mode="token-mean")`` with a
global token count gives the padded loss exactly; the ``seq-mean-*`` modes need per-sequence sums,
which :func:`unpack_logprobs` (or ``inputs["seq_index"]``) provides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentgym.errors import ConfigError
from agentgym.trainers.batch import TrainingBatch
from agentgym.trainers.logprobs import DEFAULT_CHUNK_SIZE, token_logprobs

__all__ = ["pack_sequences", "packed_inputs", "packed_sequence_logprobs", "unpack_logprobs"]

#: Per-token tensors of a :class:`TrainingBatch` that are carried into the packed layout when present.
_TOKEN_FIELDS = ("loss_mask", "advantages", "sampler_logprobs", "old_logprobs", "ref_logprobs")


def pack_sequences(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Assign sequences to rows of at most ``max_tokens`` tokens, first-fit decreasing.

    First-fit decreasing uses at most ``11/9 OPT + 1`` rows, and with many short sequences next to a few
    long ones (the usual shape of agent trajectories) it is within a row or two of optimal.

    Args:
        lengths: Real (unpadded) length of each sequence; index ``i`` is sequence ``i``.
        max_tokens: Token budget of one row.

    Returns:
        The bins, in the order they were opened; each is a list of sequence indices, longest first.
        Zero-length sequences are left out (they have nothing to train on).

    Raises:
        ConfigError: if ``max_tokens`` is not a positive integer, a length is negative, or a sequence is
            longer than ``max_tokens`` (raise the budget or truncate the sequence).
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    lengths = [int(n) for n in lengths]
    for i, n in enumerate(lengths):
        if n < 0:
            raise ConfigError(f"lengths[{i}] = {n} is negative; pass the number of real tokens of each sequence.")
        if n > max_tokens:
            raise ConfigError(
                f"sequence {i} has {n} tokens, more than max_tokens={max_tokens}; raise max_tokens to at least "
                f"{max(lengths)} or truncate the sequence (a sequence cannot span two rows)."
            )
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(max_tokens - n)
    return bins


def packed_inputs(batch: TrainingBatch, bins: Sequence[Sequence[int]], *, width: int | None = None,
                  pad_id: int = 0, mask_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Build the packed tensors of ``bins`` (one row per bin) from a right-padded batch.

    Args:
        batch: The padded batch the bins index into (``batch.attention_mask`` gives each real length).
        bins: Sequence indices per row, e.g. a slice of :func:`pack_sequences`' result.
        width: Row length ``T``; defaults to the fullest bin (pass the ``max_tokens`` budget for a
            fixed shape). Free tail positions are padding.
        pad_id: Token id written on padding.
        mask_dtype: Dtype of the attention mask; it must match the model's compute dtype for SDPA.

    Returns:
        A dict of tensors, ``B = len(bins)``:

        * ``input_ids`` ``[B, T]`` long; ``position_ids`` ``[B, T]`` long, restarting at 0 for every
          sequence (0 on padding).
        * ``attention_mask`` ``[B, 1, T, T]`` in ``mask_dtype``: 0 where query ``q`` may attend key
          ``k`` (same sequence, ``k <= q``), ``-inf`` elsewhere. Padding attends only to itself, so no
          row is fully masked (a fully masked row gives NaN in softmax). transformers passes a 4-D mask
          through unchanged to eager and SDPA attention.
        * ``seq_index`` ``[B, T]`` long: the batch row each token came from, ``-1`` on padding.
        * ``loss_mask``, ``advantages`` (per token, as in the batch), ``sampler_logprobs`` and, when the batch
          has them, ``old_logprobs`` and ``ref_logprobs`` ``[B, T]`` (0 on padding).

    Raises:
        ConfigError: on an index outside the batch, a sequence placed twice, or a bin longer than
            ``width``.
    """
    n = len(batch)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    seen: set[int] = set()
    for b, members in enumerate(bins):
        for i in members:
            if not 0 <= int(i) < n:
                raise ConfigError(f"bins[{b}] names sequence {i}, but the batch has {n} sequences (0..{n - 1}).")
            if int(i) in seen:
                raise ConfigError(f"sequence {i} appears in more than one bin (or twice in bins[{b}]).")
            seen.add(int(i))
    fills = [sum(int(lengths[int(i)]) for i in members) for members in bins]
    if width is None:
        width = max(fills, default=0)
    for b, fill in enumerate(fills):
        if fill > width:
            raise ConfigError(f"bins[{b}] holds {fill} tokens, more than width={width}; pass a larger width or "
                              "re-pack with pack_sequences(lengths, max_tokens=width).")
    rows = len(bins)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    seq_index = torch.full((rows, width), -1, dtype=torch.long)
    segment = torch.full((rows, width), -1, dtype=torch.long)  # sequence slot within the row; unique per pad
    out: dict[str, torch.Tensor] = {}
    fields = {name: getattr(batch, name) for name in _TOKEN_FIELDS if getattr(batch, name) is not None}
    for name, source in fields.items():
        out[name] = torch.zeros((rows, width), dtype=source.dtype)
    for r, members in enumerate(bins):
        start = 0
        for slot, i in enumerate(int(m) for m in members):
            length = int(lengths[i])
            stop = start + length
            input_ids[r, start:stop] = batch.input_ids[i, :length]
            position_ids[r, start:stop] = torch.arange(length)
            seq_index[r, start:stop] = i
            segment[r, start:stop] = slot
            for name, source in fields.items():
                out[name][r, start:stop] = source[i, :length]
            start = stop
    # Padding gets a distinct negative segment per position: it then sees only itself.
    pad = segment < 0
    segment = torch.where(pad, -1 - torch.arange(width).expand(rows, width), segment)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    mask = torch.zeros((rows, 1, width, width), dtype=mask_dtype)
    mask.masked_fill_(~allowed[:, None], float("-inf"))
    out.update(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, seq_index=seq_index)
    return out


def packed_sequence_logprobs(model: Any, inputs: dict[str, torch.Tensor], temperature: float = 1.0,
                             chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """``[B, T]`` log-prob of each packed token given the earlier tokens of its own sequence.

    The packed counterpart of :func:`agentgym.trainers.batch.sequence_logprobs`: float32 at the sampling
    temperature, 0 at the first token of every sequence (whose "previous" position belongs to another
    sequence) and on padding; ``chunk_size`` bounds the logits alive at once in the same way.

    Raises:
        ConfigError: if ``chunk_size`` is not a positive int or ``None``.
    """
    device = next(model.parameters()).device
    input_ids = inputs["input_ids"].to(device)
    position_ids = inputs["position_ids"].to(device)
    logp = token_logprobs(model, input_ids, attention_mask=inputs["attention_mask"].to(device),
                          position_ids=position_ids, temperature=temperature, chunk_size=chunk_size)
    keep = (position_ids > 0) & (inputs["seq_index"].to(device) >= 0)
    return torch.where(keep, logp, torch.zeros_like(logp))


def unpack_logprobs(packed: torch.Tensor, inputs: dict[str, torch.Tensor], num_sequences: int,
                    width: int) -> torch.Tensor:
    """Scatter a packed ``[B, T]`` per-token tensor back to the padded ``[num_sequences, width]`` layout.

    Token ``t`` of sequence ``i`` lands at ``[i, t]``; sequences not in ``inputs`` and padding stay 0.
    Differentiable (gradients flow back to ``packed``).

    Args:
        packed: ``[B, T]`` values in the layout of ``inputs`` (e.g. :func:`packed_sequence_logprobs`).
        inputs: The dict from :func:`packed_inputs` (``seq_index`` and ``position_ids`` are read).
        num_sequences: ``N``, the number of rows of the padded batch.
        width: ``L``, its padded width.

    Raises:
        ConfigError: on a shape mismatch or a sequence that does not fit in ``width``.
    """
    seq_index, positions = inputs["seq_index"], inputs["position_ids"]
    if packed.shape != seq_index.shape:
        raise ConfigError(f"packed has shape {tuple(packed.shape)}, but inputs were packed as "
                          f"{tuple(seq_index.shape)}; pass the tensor computed from these inputs.")
    valid = seq_index >= 0
    rows, cols = seq_index[valid].to(packed.device), positions[valid].to(packed.device)
    if rows.numel() and (int(rows.max()) >= num_sequences or int(cols.max()) >= width):
        raise ConfigError(f"the packed sequences do not fit in [{num_sequences}, {width}]; pass the padded "
                          "batch's len(batch) and input_ids.shape[1].")
    out = packed.new_zeros((num_sequences, width))
    return out.index_put((rows, cols), packed[valid.to(packed.device)])
