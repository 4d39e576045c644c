"""Constrained decoding to a fixed set of replies (``SamplingParams.choices``).

Why: in an env whose whole action set is a handful of strings (BabyAI's ``forward()``, ``turn_left()``, ...)
most tokens of a reply are format: once ``turn`` is written, ``_left()`` or ``_right()`` are the only sensible
continuations. Free sampling leaves those tokens to the model, and policy-gradient updates on failed episodes
push them down until replies stop parsing (measured on BabyAI in the README). Decoding inside a prefix tree of
the allowed replies makes every such token either a real choice (several children) or forced (one child).
Forced tokens have constrained probability 1, so they carry no learning signal; the policy marks them and the
trainers leave them out of the loss (:attr:`agentgym.policies.base.Generation.forced`).

The tree holds each reply as the tokenizer encodes it (``encode(reply, add_special_tokens=False)``), the same
encoding behaviour cloning trains on, followed by any end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["ChoiceTree"]


@dataclass
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    ends_here: bool = False


class ChoiceTree:
    """A prefix tree over the token ids of the allowed replies.

    A decoding row keeps a node (start: :attr:`root`); :meth:`allowed` says which ids may come next (a reply's
    next token, or an end-of-turn id where a whole reply has been written) and :meth:`advance` moves along the
    sampled id.
    """

    def __init__(self, encoded: Sequence[Sequence[int]], stop_ids: Iterable[int]) -> None:
        self.stop_ids = tuple(sorted({int(i) for i in stop_ids}))
        if not self.stop_ids:
            raise ConfigError("choices need an end-of-turn token to end the reply; this tokenizer has none "
                              "(set its eos_token).")
        self.root = _Node()
        self.longest = 0
        for ids in encoded:
            if not ids:
                raise ConfigError("a choice encodes to no tokens; every choice must be a non-empty reply.")
            node = self.root
            for token in ids:
                node = node.children.setdefault(int(token), _Node())
            node.ends_here = True
            self.longest = max(self.longest, len(ids))

    @classmethod
    def for_tokenizer(cls, choices: Sequence[str], tokenizer: Any, stop_ids: Iterable[int]) -> ChoiceTree:
        """The tree of ``choices`` as ``tokenizer`` encodes them."""
        return cls([list(tokenizer.encode(c, add_special_tokens=False)) for c in choices], stop_ids)

    def allowed(self, node: _Node | None) -> tuple[int, ...]:
        """Ids that may follow ``node``; none once the reply has ended (``node`` is None)."""
        if node is None:
            return ()
        return tuple(node.children) + (self.stop_ids if node.ends_here else ())

    def advance(self, node: _Node | None, token: int) -> _Node | None:
        """The node after ``token`` (None when the reply ended or the token is not in the tree)."""
        if node is None:
            return None
        return node.children.get(int(token))
