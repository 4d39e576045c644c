"""A Llama-family causal LM run over a preallocated, slot-indexed KV cache (the continuous sampler's forward).

Why not the model's own ``forward`` with a ``DynamicCache``: that cache grows by ``torch.cat`` every step, so each
decode step copies every row's whole context once per layer, and a batch whose rows come and go has to be cut out
of it and glued back together (profiled on 64 Sokoban rollouts of the tiny model: 60% of the sampling time went
to those copies, 10% to the matrix products). Here each episode owns a *slot*: a row of a buffer
``[slots, kv_heads, capacity, head_dim]`` per layer. Column ``c`` of a slot holds the keys and values of the
episode's token at position ``c``, so positions need no padding arithmetic, a new token is one indexed write,
and a decode step attends over a view of the buffer (no copy). An episode's next turn reuses its slot in place.

The computation is the model's own, module by module (its norms, projections, rotary table, MLP and ``lm_head``
are called as they are), only the cache and the mask are ours, so logits equal the reference forward's up to
float rounding of a different batch shape. Supported: architectures whose decoder layers are the Llama layout
(Llama, Qwen2, Qwen3, Mistral without a sliding window); :func:`slot_model_support` says why another is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SlotModel", "padding_pays", "slot_model_support"]

_SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
# A prefill's attention runs as one padded call when its padded query-key pairs are at most this multiple of the
# real ones plus this many per row (a per-row call's fixed cost), and under this many in all (the mask's memory).
_PAD_WASTE = 1.25
_ROW_CALL_PAIRS = 8000
_PAD_MAX_PAIRS = 1 << 24
# On a GPU a per-row call is a handful of kernel launches (tens of microseconds whatever the row's size) while a
# padded pair costs a fraction of a nanosecond (the tiny model's shapes ran matrix products at 2.2 TFLOP/s on an
# H200, about 0.25 ns for a pair's 512 FLOP), so a row call is worth some 200,000 padded pairs rather than 8,000, and
# rows go one at a time only when the padded scores (a pair per head, 4 bytes each should the attention kernel
# materialise them) would pass 1 GiB.
_GPU_ROW_CALL_PAIRS = 1 << 18
_GPU_PAD_MAX_SCORES = 1 << 28


def padding_pays(live: Sequence[tuple[int, int, int]], *, on_gpu: bool, heads: int) -> bool:
    """Whether one padded attention call over the run of slots ``live`` covers (``(slot, new tokens, start
    column)`` of each row with tokens) costs less than a call per row: the padded query-key pairs against the real
    ones plus a row call's fixed cost, counted in pairs, under the most pairs a mask (and, on a GPU, the scores of
    ``heads`` heads) may take."""
    lo, hi = min(s for s, _, _ in live), max(s for s, _, _ in live) + 1
    most = max(n for _, n, _ in live)
    width = max(start + n for _, n, start in live)
    useful = sum(n * (start + n) for _, n, start in live)
    padded = (hi - lo) * most * width
    row_call, most_pairs = ((_GPU_ROW_CALL_PAIRS, _GPU_PAD_MAX_SCORES // max(heads, 1)) if on_gpu
                            else (_ROW_CALL_PAIRS, _PAD_MAX_PAIRS))
    return padded <= _PAD_WASTE * useful + row_call * len(live) and padded <= most_pairs


def slot_model_support(model: Any) -> str | None:
    """``None`` when :class:`SlotModel` can run ``model``, else the reason it cannot (for the log)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in _SUPPORTED:
        return f"model_type {kind!r} is not one of {_SUPPORTED}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", kind == "mistral"):
        return "sliding-window attention"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("dynamic", "longrope"):
        return "a rotary table that depends on the sequence length"  # one table per position is computed once here
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        return "not the Llama module layout (model.model.{embed_tokens,layers,norm,rotary_emb}, model.lm_head)"
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
            return "a decoder layer without the Llama attention layout"
        if getattr(layer, "attention_type", "full_attention") != "full_attention":
            return "a layer that is not full attention"
    if getattr(model, "peft_config", None) is not None:
        return "a PEFT-wrapped model"
    return None


class SlotModel:
    """The model's forward over a slot KV cache.

    Args:
        model: A supported causal LM (:func:`slot_model_support` returns ``None`` for it), in eval mode.
        slots: Rows of the cache (most episodes kept at once).
        capacity: Columns per slot to begin with (the buffer grows up to the model's ``max_position_embeddings``
            when a longer sequence arrives).
        max_tokens: Most tokens (slots x columns) the buffer may hold; growth stops there (callers send no row
            longer than ``max_tokens // slots``).
    """

    def __init__(self, model: Any, slots: int, capacity: int = 256, max_tokens: int | None = None) -> None:
        import torch

        self.torch = torch
        self.model = model
        inner = model.model
        self.inner = inner
        config = model.config
        self.layers = list(inner.layers)[: config.num_hidden_layers]
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.slots = slots
        self.max_tokens = max_tokens
        self.capacity = 0
        self.rows = 0
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self._cos = self._sin = None
        self._gather_buffers: tuple[Any, Any] | None = None
        self._mask_table: Any = None
        self.ensure_capacity(min(capacity, self.max_positions, max_tokens // slots if max_tokens else capacity), 1)

    # ---- storage ------------------------------------------------------------------------------------------------
    def ensure_capacity(self, columns: int, rows: int = 1) -> None:
        """Make the buffer hold at least ``rows`` slots of ``columns`` tokens (plus one scratch column idle rows
        write to). It grows in steps (rows by 32, columns by half again), copying what it holds, so memory follows
        the episodes actually running rather than the most the policy allows.

        Raises:
            ValueError: ``columns`` exceeds the model's ``max_position_embeddings`` or ``rows`` the slot count.
        """
        if columns <= self.capacity and rows <= self.rows:
            return
        if columns > self.max_positions:
            raise ValueError(f"{columns} tokens exceed the model's max_position_embeddings ({self.max_positions})")
        if rows > self.slots:
            raise ValueError(f"slot {rows - 1} is past the {self.slots} slots")
        torch = self.torch
        new_cols = self.capacity if columns <= self.capacity else min(
            self.max_positions, -(-max(columns, self.capacity * 3 // 2) // 64) * 64)
        if self.max_tokens is not None:
            new_cols = min(new_cols, max(columns, self.max_tokens // self.slots))
        new_rows = self.rows if rows <= self.rows else min(self.slots, -(-rows // 32) * 32)
        shape = (new_rows, self.kv_heads, new_cols + 1, self.head_dim)
        keys, values = [], []
        for i in range(len(self.layers)):
            # Zeros, not uninitialised memory: masked columns are still multiplied before the mask's -inf is added,
            # and a NaN there would poison the row.
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if self.capacity:
                k[: self.rows, :, : self.capacity] = self.keys[i][:, :, : self.capacity]
                v[: self.rows, :, : self.capacity] = self.values[i][:, :, : self.capacity]
            keys.append(k)
            values.append(v)
        self.keys, self.values = keys, values
        self.rows = new_rows
        if new_cols != self.capacity:
            self.capacity = new_cols
            with torch.inference_mode():
                positions = torch.arange(new_cols + 1, device=self.device)[None]
                probe = torch.zeros((1, 1, 1), dtype=self.dtype, device=self.device)
                cos, sin = self.inner.rotary_emb(probe, position_ids=positions)
            self._cos, self._sin = cos[0], sin[0]  # [columns, head_dim], exactly the model's table per position

    def _gather(self, i: int, slots: Any, width: int) -> tuple[Any, Any]:
        """Layer ``i``'s keys and values of the given slots' first ``width`` columns, copied into buffers kept
        between calls (one pair for all layers: each layer's copy is consumed before the next is made).

        Why buffers: a fresh copy per layer and step is tens of MB, which the allocator maps from and returns to
        the OS each time; the page faults cost more than the copy (measured 2-8x on 128 slots of 700 columns).
        """
        torch = self.torch
        shape = (int(slots.shape[0]), self.kv_heads, width, self.head_dim)
        need = shape[0] * shape[1] * shape[2] * shape[3]
        if self._gather_buffers is None or self._gather_buffers[0].numel() < need:
            self._gather_buffers = (torch.empty(need, dtype=self.dtype, device=self.device),
                                    torch.empty(need, dtype=self.dtype, device=self.device))
        keys, values = (b[:need].view(shape) for b in self._gather_buffers)
        torch.index_select(self.keys[i][:, :, :width], 0, slots, out=keys)
        torch.index_select(self.values[i][:, :, :width], 0, slots, out=values)
        return keys, values

    @property
    def scratch(self) -> int:
        """The column idle rows of a decode step write to (never inside any slot's context)."""
        return self.capacity

    def _additive(self, allowed: Any) -> Any:
        """A boolean attention mask as the additive one (0 / -inf) the CPU attention kernels run faster with
        (measured: 10-40% less time than with the boolean mask at the sampler's shapes)."""
        torch = self.torch
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))

    # ---- forward passes -----------------------------------------------------------------------------------------
    def _layer(self, layer: Any, hidden: Any, attend: Any) -> Any:
        """One decoder layer. ``attend(attn, q, k, v)`` (projections ``[..., heads, head_dim]``, queries and keys not
        yet rotated) stores the new keys and values, attends, and returns ``[..., heads * head_dim]``: the batched
        forwards (:meth:`_batched_attention`) and the packed prefill (:meth:`_packed_attention`) differ only there."""
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises queries and keys per head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        hidden = hidden + attn.o_proj(attend(attn, q, k, v))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def _batched_attention(self, cos: Any, sin: Any, write: Any, read: Any, mask: Any) -> Any:
        """``attend`` for rows of equal length ``[rows, seq, ...]``: ``write(k, v)`` stores the new keys/values,
        ``read()`` returns what to attend, ``mask`` is additive ``[rows, 1, seq, width]``."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        torch = self.torch

        def attend(attn: Any, q: Any, k: Any, v: Any) -> Any:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            write(k, v)
            keys, values = read()
            out = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=self.kv_heads != self.heads)
            out = out.transpose(1, 2)  # [rows, seq, heads, head_dim]
            return out.reshape(*out.shape[:2], -1)

        return attend

    def decode(self, tokens: Any, columns: Any, live: Any, width: int, slots: Any = None) -> Any:
        """One token for each of the slots ``0..len(tokens)-1``: slot ``s`` feeds ``tokens[s]`` at position
        ``columns[s]`` (attending to its columns ``0..columns[s]``); slots where ``live`` is False compute garbage
        into the scratch column and their logits are to be ignored. ``width`` > every live column.

        ``slots`` (a 1-D tensor of slot ids): row ``j`` is slot ``slots[j]`` instead of slot ``j``. Reading a gathered
        set of slots copies their columns, so it pays only when the live slots are few and scattered (idle slots
        that keep cached prefixes between them would otherwise be computed too).

        Returns:
            ``[rows, vocab]`` logits in the model's dtype.
        """
        torch = self.torch
        rows = tokens.shape[0]
        if slots is not None:
            return self._decode_gathered(tokens, columns, width, slots)
        cols = torch.where(live, columns, torch.full_like(columns, self.scratch))
        pos = torch.where(live, columns, torch.zeros_like(columns))
        cos, sin = self._cos[pos][:, None], self._sin[pos][:, None]  # [rows, 1, head_dim]
        arange = torch.arange(width, device=self.device)
        allowed = (arange[None] <= columns[:, None]) | ~live[:, None]
        mask = self._additive(allowed[:, None, None, :])  # [rows, 1, 1, width]
        row_index = torch.arange(rows, device=self.device)
        hidden = self.inner.embed_tokens(tokens[:, None])
        for i, layer in enumerate(self.layers):
            def write(k: Any, v: Any, i: int = i) -> None:
                self.keys[i][row_index, :, cols] = k[:, :, 0]
                self.values[i][row_index, :, cols] = v[:, :, 0]

            def read(i: int = i) -> tuple[Any, Any]:
                return self.keys[i][:rows, :, :width], self.values[i][:rows, :, :width]

            hidden = self._layer(layer, hidden, self._batched_attention(cos, sin, write, read, mask))
        return self.model.lm_head(self.inner.norm(hidden[:, -1]))

    def _decode_gathered(self, tokens: Any, columns: Any, width: int, slots: Any) -> Any:
        """:meth:`decode` for the given live slots only (every row live)."""
        torch = self.torch
        cos, sin = self._cos[columns][:, None], self._sin[columns][:, None]
        arange = torch.arange(width, device=self.device)
        mask = self._additive((arange[None] <= columns[:, None])[:, None, None, :])
        hidden = self.inner.embed_tokens(tokens[:, None])
        for i, layer in enumerate(self.layers):
            def write(k: Any, v: Any, i: int = i) -> None:
                self.keys[i][slots, :, columns] = k[:, :, 0]
                self.values[i][slots, :, columns] = v[:, :, 0]

            def read(i: int = i) -> tuple[Any, Any]:
                return self._gather(i, slots, width)

            hidden = self._layer(layer, hidden, self._batched_attention(cos, sin, write, read, mask))
        return self.model.lm_head(self.inner.norm(hidden[:, -1]))

    def prefill(self, slots: Sequence[int], tokens: Sequence[Sequence[int]], starts: Sequence[int],
                at: Any = None) -> Any:
        """Run each slot's new tokens (``tokens[j]`` at positions ``starts[j]...``) over its cached columns
        ``0..starts[j]-1``, store their keys and values, and return the logits after each row's last token.

        The new tokens of all rows are packed into one sequence (no padding): norms, projections, rotary and MLP
        run once over exactly the tokens there are, and each row attends over a view of its own slot, as wide as
        its own context. Why not one padded batch: rows come with 1 to hundreds of new tokens over contexts of
        different lengths, and padding every row to the longest suffix and the widest context computed 1.3-1.5x the
        tokens and scores there were, plus a copy of the rows' keys and values whenever the slots were not one run
        (measured at Sokoban shapes of the tiny model: 1.4-2.2x less time per call packed with mixed suffix
        lengths; up to 1.2x more for 200-256 rows of 1-6 tokens over one run of slots, where one attention call a
        row costs more than the padding it saves).

        A row may have no tokens: it computes nothing and writes nothing, and its returned logits are garbage.

        ``at`` (``[len(slots), k]`` indices into each row's new tokens): the logits after those tokens instead, for
        a run of forced tokens whose log-probs are each read off the position before them.

        Returns:
            ``[len(slots), vocab]`` logits in the model's dtype (``[len(slots), k, vocab]`` with ``at``).
        """
        torch = self.torch
        device = self.device
        lengths = [len(t) for t in tokens]
        ends = [s + n for s, n in zip(starts, lengths)]
        self.ensure_capacity(max(ends), max(slots) + 1)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        total = offsets[-1]
        if total == 0:
            shape = (len(lengths), at.shape[1]) if at is not None else (len(lengths),)
            return torch.zeros((*shape, self.model.lm_head.out_features), dtype=self.dtype, device=device)
        ids = torch.tensor([t for row in tokens for t in row], dtype=torch.long, device=device)
        position = torch.tensor([s + a for s, n in zip(starts, lengths) for a in range(n)], dtype=torch.long,
                                device=device)
        slot_of = torch.tensor([slot for slot, n in zip(slots, lengths) for _ in range(n)], dtype=torch.long,
                               device=device)
        cos, sin = self._cos[position], self._sin[position]  # [tokens, head_dim]
        padded = self._padded_plan(slots, lengths, starts)
        if padded is None:
            rows = [(slot, offsets[j], n, end, self._causal_mask(n, end))
                    for j, (slot, n, end) in enumerate(zip(slots, lengths, ends)) if n]
        hidden = self.inner.embed_tokens(ids)  # [tokens, hidden]
        for i, layer in enumerate(self.layers):
            attend = (self._packed_attention(i, cos, sin, slot_of, position, rows) if padded is None
                      else self._padded_attention(i, cos, sin, slot_of, position, padded))
            hidden = self._layer(layer, hidden, attend)
        first = torch.tensor(offsets[:-1], dtype=torch.long, device=device)
        if at is not None:
            picked = hidden[(first[:, None] + at).clamp(max=total - 1)]
            return self.model.lm_head(self.inner.norm(picked))
        last = (first + torch.tensor(lengths, dtype=torch.long, device=device) - 1).clamp(0, total - 1)
        return self.model.lm_head(self.inner.norm(hidden[last]))

    def _padded_plan(self, slots: Sequence[int], lengths: Sequence[int],
                     starts: Sequence[int]) -> tuple[int, int, Any, Any] | None:
        """How to run a prefill's attention as one batched call over the run of slots it covers, or ``None`` to
        run it one row at a time (:meth:`_packed_attention`).

        The batched call pads every slot of the run ``lo..hi-1`` (those without tokens in this call too) to the
        most new tokens of a row and the widest context, and reads the keys and values as a view of the cache (no
        copy). It pays when padding adds little: each per-row call carries a fixed cost (measured about 0.1 ms a
        layer at the tiny model's shapes, the time of some 8,000 padded query-key pairs), and rows of a few
        forced tokens, which constrained decoding makes every turn, are almost nothing but that cost (4-6x less
        time batched for 128 rows of 2 tokens; equal at 1.5x padding for rows of about 50 tokens). On a GPU the
        fixed cost is larger against the padding (``_GPU_ROW_CALL_PAIRS``), so nearly every call goes padded.

        Returns:
            ``(lo, width, index, mask)``: the first slot, the padded width, each packed token's position in the
            padded ``[slots * most_new]`` query rows, and the additive mask ``[slots, 1, most_new, width]``.
        """
        torch = self.torch
        live = [(slot, n, start) for slot, n, start in zip(slots, lengths, starts) if n]
        if not padding_pays(live, on_gpu=self.device.type != "cpu", heads=self.heads):
            return None
        lo, hi = min(s for s, _, _ in live), max(s for s, _, _ in live) + 1
        most = max(n for _, n, _ in live)
        width = max(start + n for _, n, start in live)
        device = self.device
        span = torch.tensor([s - lo for s, _, _ in live], dtype=torch.long, device=device)
        count = torch.tensor([n for _, n, _ in live], dtype=torch.long, device=device)
        first = torch.tensor([start for _, _, start in live], dtype=torch.long, device=device)
        step = torch.arange(most, device=device)
        # Row r's query a sees columns 0..start + a; padding queries and slots without tokens see column 0 only
        # (their outputs are dropped, but a row that sees nothing would be NaN).
        limit = torch.zeros((hi - lo, most), dtype=torch.long, device=device)
        limit[span] = torch.where(step[None] < count[:, None], first[:, None] + step[None], 0)
        allowed = torch.arange(width, device=device)[None, None] <= limit[:, :, None]
        mask = self._additive(allowed[:, None])
        index = (span[:, None] * most + step[None])[step[None] < count[:, None]]  # row-major: the packing order
        return lo, width, index, mask

    def _padded_attention(self, i: int, cos: Any, sin: Any, slot_of: Any, position: Any,
                          plan: tuple[int, int, Any, Any]) -> Any:
        """``attend`` of layer ``i`` for packed tokens as one batched call over a run of slots (:meth:`_padded_plan`)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        torch = self.torch
        lo, width, index, mask = plan
        slots, most = mask.shape[0], mask.shape[2]

        def attend(attn: Any, q: Any, k: Any, v: Any) -> Any:
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # [tokens, heads, head_dim]
            keys, values = self.keys[i], self.values[i]
            keys[slot_of, :, position] = k
            values[slot_of, :, position] = v
            query = q.new_zeros((slots * most, self.heads, self.head_dim))
            query[index] = q
            query = query.view(slots, most, self.heads, self.head_dim).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(
                query, keys[lo:lo + slots, :, :width], values[lo:lo + slots, :, :width], attn_mask=mask,
                scale=attn.scaling, enable_gqa=self.kv_heads != self.heads)
            out = out.transpose(1, 2).reshape(slots * most, self.heads, self.head_dim)[index]
            return out.view(q.shape[0], -1)

        return attend

    def _causal_mask(self, new: int, width: int) -> Any:
        """The additive mask of ``new`` tokens that end a context of ``width`` columns: token ``a`` sees columns
        ``0..width-new+a``. Up to 256 new tokens it is a view of one table kept between calls (a decode-sized run
        allocates nothing); longer runs build their own."""
        torch = self.torch
        if new > 256:
            columns = torch.arange(width, device=self.device)
            limit = torch.arange(width - new, width, device=self.device)[:, None]
            return torch.zeros((new, width), dtype=self.dtype, device=self.device).masked_fill_(
                columns[None] > limit, float("-inf"))
        table = self._mask_table
        if table is None or table.shape[1] < width:
            cols = max(width, self.capacity + 1)
            r = torch.arange(256, device=self.device)[:, None]
            c = torch.arange(cols, device=self.device)[None]
            table = torch.zeros((256, cols), dtype=self.dtype, device=self.device).masked_fill_(
                c - (cols - 256) > r, float("-inf"))
            self._mask_table = table
        rows, cols = table.shape
        return table[rows - new:, cols - width:]

    def _packed_attention(self, i: int, cos: Any, sin: Any, slot_of: Any, position: Any,
                          rows: list[tuple[int, int, int, int, Any]]) -> Any:
        """``attend`` of layer ``i`` for packed tokens ``[tokens, ...]``; ``rows``: (slot, first token, count,
        context width, mask) of each row with tokens, which attends over a view of its own slot."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = self.kv_heads != self.heads

        def attend(attn: Any, q: Any, k: Any, v: Any) -> Any:
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # [tokens, heads, head_dim]
            keys, values = self.keys[i], self.values[i]
            keys[slot_of, :, position] = k
            values[slot_of, :, position] = v
            out = torch.empty((q.shape[0], self.heads, self.head_dim), dtype=self.dtype, device=self.device)
            for slot, first, n, width, mask in rows:
                query = q[first:first + n].transpose(0, 1)[None]  # [1, heads, n, head_dim]
                att = sdpa(query, keys[slot:slot + 1, :, :width], values[slot:slot + 1, :, :width], attn_mask=mask,
                           scale=attn.scaling, enable_gqa=gqa)
                out[first:first + n] = att[0].transpose(0, 1)
            return out.view(q.shape[0], -1)

        return attend
