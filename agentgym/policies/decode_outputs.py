"""From a batched decoding loop's tensors to :class:`~agentgym.policies.base.Generation` records.

The loop (:class:`~agentgym.policies.hf.HFPolicy`) keeps per-row outputs as ``[rows, steps]`` tensors so every
step is a few tensor ops. What is per row and textual lives here: stop strings (checked on decoded text, not on
ids, because one string may be spelled by many token sequences), the top-k alternatives ARPO's branching reads,
and the final records with their text cut after the stop string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym.policies.base import Generation

__all__ = ["TopRow", "collect_generations", "hit_stop_strings", "top_logprobs"]

TopRow = list[tuple[tuple[float, ...], tuple[int, ...]]]
"""One row's ``(log-probs, token ids)`` alternatives per generated position."""


def hit_stop_strings(tokenizer: Any, token: Any, rows: Any, candidates: Any,
                     stop_strings: Mapping[int, tuple[str, ...]], ids_so_far: dict[int, list[int]]) -> Any:
    """Which rows now contain a stop string in their decoded text (a bool tensor over the batch).

    A new match must end in the newest token (an older one would have stopped the row already), so
    only a tail of tokens long enough to hold the longest stop string is decoded: 4 bytes per
    character at most, one byte per token at least, plus slack for a character cut at the window's
    start and for skipped special tokens. This keeps the check O(1) per token instead of O(length).
    """
    import torch

    hit = torch.zeros_like(candidates)
    row_list = rows.tolist()
    token_list = token.tolist()
    cand_list = candidates.tolist()
    for pos, row in enumerate(row_list):
        if not cand_list[pos] or row not in stop_strings:
            continue
        ids = ids_so_far[row]
        ids.append(token_list[pos])
        strings = stop_strings[row]
        window = 4 * max(len(s) for s in strings) + 8
        text = tokenizer.decode(ids[-window:], skip_special_tokens=True)
        if any(s in text for s in strings):
            hit[pos] = True
    return hit


def top_logprobs(values: Any, ids: Any, sampled: Any, sampled_ids: Any, wanted: list[int]) -> list[TopRow | None]:
    """Per row, per position: the row's k best ``(log-probs, token ids)``, then the sampled token's when it is
    not among them.

    ``values``/``ids`` hold the batch's largest k (the most any row asked for), so a row that asked for fewer
    keeps a prefix; "sampled token among them" is judged against the row's own k.
    """
    rows_values, rows_ids = values.tolist(), ids.tolist()
    rows_sampled, rows_sampled_ids = sampled.tolist(), sampled_ids.tolist()
    width = values.shape[-1]
    result: list[TopRow | None] = []
    for i, k in enumerate(wanted):
        if k == 0:
            result.append(None)
            continue
        row = []
        for pos, cands in enumerate(rows_values[i]):
            own, own_ids = tuple(cands[: min(k, width)]), tuple(rows_ids[i][pos][: min(k, width)])
            lp, token = rows_sampled[i][pos], rows_sampled_ids[i][pos]
            row.append((own, own_ids) if token in own_ids else (own + (lp,), own_ids + (token,)))
        result.append(row)
    return result


def collect_generations(
    tokenizer: Any,
    out_tokens: Any,
    out_logprobs: Any,
    out_entropy: Any,
    num_generated: Any,
    stopped: Any,
    stop_strings: Mapping[int, tuple[str, ...]],
    top: list[TopRow | None] | None = None,
    aborted: set[int] | frozenset[int] = frozenset(),
    out_forced: Any = None,
    constrained: set[int] | frozenset[int] = frozenset(),
) -> list[Generation]:
    """One :class:`Generation` per row of the loop's ``[rows, steps]`` outputs, its text cut right after the first
    stop string it hit (``token_ids`` keep the whole last token); ``forced`` only for ``constrained`` rows."""
    tokens = out_tokens.tolist()
    forced = out_forced.tolist() if out_forced is not None else None
    logprobs = out_logprobs.tolist()
    entropies = out_entropy.tolist()
    counts = num_generated.tolist()
    stops = stopped.tolist()
    results: list[Generation] = []
    for i, n in enumerate(counts):
        ids = tokens[i][:n]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if stops[i] and i in stop_strings:
            ends = [text.find(s) + len(s) for s in stop_strings[i] if s in text]
            if ends:
                text = text[: min(ends)]
        results.append(
            Generation(
                text=text,
                token_ids=tuple(ids),
                logprobs=tuple(logprobs[i][:n]),
                entropies=tuple(entropies[i][:n]),
                finish_reason="stop" if stops[i] else "abort" if i in aborted else "length",
                top_logprobs=None if top is None or top[i] is None else tuple(v for v, _ in top[i][:n]),
                top_token_ids=None if top is None or top[i] is None else tuple(t for _, t in top[i][:n]),
                forced=tuple(bool(f) for f in forced[i][:n]) if forced is not None and i in constrained else None,
            )
        )
    return results
