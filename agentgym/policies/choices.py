"""Constrained decoding to a fixed set of replies (``SamplingParams.choices``).

Why: in an env whose whole action set is a handful of strings (BabyAI's ``forward()``, ``turn_left()``, ...)
most tokens of a reply are format: once ``turn`` is written, ``_left()`` or ``_right()`` are the only sensible
continuations. Free sampling leaves those tokens to the model, and policy-gradient updates on failed episodes
push them down until replies stop parsing (on BabyAI GoToLocal a behaviour-cloned tiny model's GiGPO and GRPO
runs lost the ``_`` of ``turn_left`` and the ``()``). Decoding inside a prefix tree of the allowed replies
makes every such token either a real choice (several children) or forced (one child).
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

__all__ = ["ChoiceTree", "ChoiceTrees", "allowed_mask", "constraint_row"]


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


class ChoiceTrees:
    """The trees of the choice sets a policy has been asked for, built once per set (an env offers the same
    actions turn after turn; envs whose choices change every turn are bounded by a size limit).

    Args:
        tokenizer: Encodes the replies.
        stop_ids: The policy's end-of-turn ids. A tree gets one of them, the tokenizer's own EOS where it is one:
            a choice between two tokens that both end the reply (``<|im_end|>`` or ``<|endoftext|>``) would be a
            format token trained for nothing.
    """

    _MAX_SETS = 256

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_ids = [eos] if eos in stop_ids else list(stop_ids)
        self._trees: dict[tuple[str, ...], ChoiceTree] = {}

    def get(self, choices: tuple[str, ...], max_tokens: int) -> ChoiceTree:
        """The tree of ``choices``, checked to fit in ``max_tokens`` with its end token.

        Raises:
            ConfigError: The longest choice plus its end token needs more than ``max_tokens``.
        """
        tree = self._trees.get(choices)
        if tree is None:
            tree = ChoiceTree.for_tokenizer(choices, self.tokenizer, self.stop_ids)
            if len(self._trees) > self._MAX_SETS:
                self._trees.clear()
            self._trees[choices] = tree
        if tree.longest + 1 > max_tokens:
            raise ConfigError(f"A choice is {tree.longest} tokens long, so a reply needs {tree.longest + 1} with its "
                              f"end token, but max_tokens is {max_tokens}; raise max_tokens (the trainers' "
                              "max_tokens_per_turn) or shorten the choices.")
        return tree


def allowed_mask(rows: Any, nodes: dict[int, Any], trees: dict[int, ChoiceTree], vocab: int, device: Any,
                 constraints: dict[int, list[Any]] | None = None, stop_ids: Sequence[int] = ()) -> Any:
    """``[len(rows), vocab]`` bool: the ids each live row (``rows``: their original row indices) may sample next,
    given its tree and node, or its ``[TokenConstraint, state]`` in ``constraints`` (plus ``stop_ids`` where the
    constraint lets the reply end); every id for unconstrained or finished rows."""
    import torch

    allow = torch.ones((len(rows), vocab), dtype=torch.bool, device=device)
    for position, row in enumerate(rows.tolist()):
        if row in trees:
            ids = trees[row].allowed(nodes[row])
            if ids:
                allow[position] = False
                allow[position, list(ids)] = True
        elif constraints and row in constraints:
            constraint, state = constraints[row]
            constraint_row(allow[position], constraint.allowed(state), stop_ids)
    return allow


def constraint_row(allow: Any, allowed: tuple[Any, bool], stop_ids: Sequence[int]) -> None:
    """Restrict one row of an allow mask (in place) to a constraint's ``(ids, may_end)``. A state that allows
    nothing and may not end (a tokenizer lacking a character the grammar needs) ends the reply rather than
    sampling from an empty distribution."""
    import torch

    ids, may_end = allowed
    allow[:] = False
    if len(ids):
        allow[torch.as_tensor(ids, dtype=torch.long).to(allow.device)] = True
    if may_end or not len(ids):
        allow[list(stop_ids)] = True
