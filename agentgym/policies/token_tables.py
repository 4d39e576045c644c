"""Per-token rules as tensors, so a decode step applies them to every row at once (the continuous sampler's tables).

Constrained decoding (:mod:`agentgym.policies.choices`) walks a prefix tree per row in Python, and stop strings are
checked by decoding each row's tail every step: per token and per row, Python work that dominates once the model
itself is fast. Here both become lookups indexed by ``(state, token)``:

* :class:`ChoiceAutomaton`: every node of every choice tree seen gets a row of ``allowed[node, vocab]``,
  ``next[node, vocab]`` and ``forced[node]``; node 0 is "unconstrained" (every id allowed; an ended reply and a row
  without choices both sit there, as :func:`~agentgym.policies.choices.allowed_mask` allows every id for them).
* :class:`StopCandidates`: which token ids could complete a stop string. A new match must end in the newest token,
  so that token's text must contain the string's last character; only rows whose newest token passes this test
  are decoded (a token whose text alone is not the characters it adds in context, a partial UTF-8 sequence or an
  empty piece, always passes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentgym.policies.choices import ChoiceTree

__all__ = ["ChoiceAutomaton", "StopCandidates"]


class ChoiceAutomaton:
    """The nodes of the choice trees a sampler has seen, as ``[nodes, vocab]`` tensors on ``device``."""

    _MAX_NODES = 4096  # tables are nodes x vocab; past this the tables are rebuilt from the trees in use

    def __init__(self, vocab: int, device: Any) -> None:
        import torch

        self.torch = torch
        self.vocab = vocab
        self.device = device
        self._roots: dict[int, tuple[ChoiceTree, int]] = {}  # id(tree) -> (tree, root node id)
        self.allowed = torch.ones((1, vocab), dtype=torch.bool, device=device)
        self.next = torch.zeros((1, vocab), dtype=torch.long, device=device)
        self.forced = torch.zeros(1, dtype=torch.bool, device=device)
        #: The one id a forced node allows (-1 elsewhere): the sampler feeds runs of them in one forward.
        self.forced_token = torch.full((1,), -1, dtype=torch.long, device=device)

    def root(self, tree: ChoiceTree) -> int:
        """The node id of ``tree``'s root (its nodes are added to the tables the first time it is seen)."""
        known = self._roots.get(id(tree))
        if known is not None and known[0] is tree:
            return known[1]
        if self.allowed.shape[0] > self._MAX_NODES:
            self._reset()
        torch = self.torch
        nodes = [tree.root]
        index = {id(tree.root): 0}
        for node in nodes:  # breadth first; the list grows while it is walked
            for child in node.children.values():
                if id(child) not in index:
                    index[id(child)] = len(nodes)
                    nodes.append(child)
        base = self.allowed.shape[0]
        allowed = torch.zeros((len(nodes), self.vocab), dtype=torch.bool)
        nxt = torch.zeros((len(nodes), self.vocab), dtype=torch.long)
        for i, node in enumerate(nodes):
            ids = tree.allowed(node)
            if not ids:
                allowed[i] = True
                continue
            allowed[i, list(ids)] = True
            for token, child in node.children.items():
                nxt[i, token] = base + index[id(child)]
        self.allowed = torch.cat([self.allowed, allowed.to(self.device)])
        self.next = torch.cat([self.next, nxt.to(self.device)])
        forced = allowed.sum(-1) == 1
        self.forced = torch.cat([self.forced, forced.to(self.device)])
        only = torch.where(forced, allowed.int().argmax(-1), torch.full_like(forced, -1, dtype=torch.long))
        self.forced_token = torch.cat([self.forced_token, only.to(self.device)])
        self._roots[id(tree)] = (tree, base)
        return base

    def _reset(self) -> None:
        torch = self.torch
        self._roots.clear()
        self.allowed = torch.ones((1, self.vocab), dtype=torch.bool, device=self.device)
        self.next = torch.zeros((1, self.vocab), dtype=torch.long, device=self.device)
        self.forced = torch.zeros(1, dtype=torch.bool, device=self.device)
        self.forced_token = torch.full((1,), -1, dtype=torch.long, device=self.device)


class StopCandidates:
    """``table[token]`` is True when ``token`` could be the last token of a match of any stop string seen."""

    def __init__(self, tokenizer: Any, vocab: int, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device
        self._chars: set[str] = set()
        self._every = False
        self._pieces = [tokenizer.decode([i], skip_special_tokens=True) if i < len(tokenizer) else ""
                        for i in range(vocab)]
        self.table = torch.zeros(vocab, dtype=torch.bool, device=device)

    def add(self, strings: Iterable[str]) -> None:
        """Make the table cover ``strings`` too."""
        new = {s[-1] for s in strings if s} - self._chars
        if any(s and s[-1].isspace() for s in strings):
            self._every = True  # decoders may drop a token's leading space when it stands alone
        if not new and not self._every:
            return
        self._chars |= new
        if self._every:
            self.table = self.torch.ones_like(self.table)
            return
        flags = [(not piece) or "\ufffd" in piece or any(c in piece for c in self._chars) for piece in self._pieces]
        self.table = self.torch.tensor(flags, dtype=self.torch.bool, device=self.device)
