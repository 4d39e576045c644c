"""Hybrid retrieval: reciprocal-rank fusion (RRF) of several retrievers, BM25 + dense by default.

Lexical and dense retrieval fail differently (BM25 misses paraphrases, embeddings blur rare names such as
"Ouagadougou"), and RRF combines them using ranks only, so the incomparable score scales of BM25 and
cosine similarity never need calibrating: ``score(d) = sum_i w_i / (rrf_k + rank_i(d))`` (Cormack et al.,
2009, with ``rrf_k = 60``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.tools.retrieval.base import Document, Hit, RetrievalError, Retriever

from agentgym.errors import ConfigError

__all__ = ["HybridRetriever", "reciprocal_rank_fusion"]


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], *, weights: Sequence[float] | None = None,
                           rrf_k: float = 60.0) -> list[Hit]:
    """Fuse ranked lists: each document scores ``sum_i w_i / (rrf_k + rank)`` (rank starts at 1).

    Ties keep the order in which documents were first met (list by list, best first), so the result is
    reproducible.
    """
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ConfigError(f"Got {len(rankings)} rankings but {len(weights)} weights; pass one weight per retriever.")
    fused: dict[str, float] = {}
    first_seen: dict[str, int] = {}
    for ranking, weight in zip(rankings, weights):
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.doc_id] = fused.get(hit.doc_id, 0.0) + weight / (rrf_k + rank)
            first_seen.setdefault(hit.doc_id, len(first_seen))
    order = sorted(fused, key=lambda d: (-fused[d], first_seen[d]))
    return [Hit(d, fused[d]) for d in order]


class HybridRetriever(Retriever):
    """Reciprocal-rank fusion of several retrievers over the same documents.

    Args:
        retrievers: The retrievers to fuse (default: a new :class:`BM25Retriever` and :class:`DenseRetriever`).
        weights: One weight per retriever (default: all 1).
        rrf_k: The RRF constant; larger values flatten the difference between ranks.
        depth: How many results to take from each retriever before fusing.
    """

    name: ClassVar[str] = "hybrid"

    def __init__(self, retrievers: Sequence[Retriever] | None = None, *, weights: Sequence[float] | None = None,
                 rrf_k: float = 60.0, depth: int = 50) -> None:
        super().__init__()
        if retrievers is None:
            from agentgym.tools.retrieval.bm25 import BM25Retriever
            from agentgym.tools.retrieval.dense import DenseRetriever

            retrievers = [BM25Retriever(), DenseRetriever()]
        self.retrievers = list(retrievers)
        if len(self.retrievers) < 1:
            raise ConfigError("HybridRetriever needs at least one retriever to fuse.")
        if any(not isinstance(r, Retriever) for r in self.retrievers):
            raise ConfigError("HybridRetriever takes Retriever objects, e.g. [BM25Retriever(), DenseRetriever()].")
        self.weights = [1.0] * len(self.retrievers) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.retrievers) or any(w < 0 for w in self.weights):
            raise ConfigError(f"weights must be {len(self.retrievers)} non-negative numbers, one per retriever; "
                              f"got {weights!r}.")
        if rrf_k <= 0 or depth < 1:
            raise ConfigError(f"rrf_k must be > 0 and depth >= 1, got rrf_k={rrf_k}, depth={depth}.")
        self.rrf_k, self.depth = float(rrf_k), int(depth)
        if all(r.is_indexed for r in self.retrievers):
            self._adopt_doc_ids()

    def config(self) -> dict[str, Any]:
        return {"weights": self.weights, "rrf_k": self.rrf_k, "depth": self.depth,
                "retrievers": [{"name": r.name, "config": r.config()} for r in self.retrievers]}

    def _adopt_doc_ids(self) -> None:
        ids = self.retrievers[0].doc_ids
        for r in self.retrievers[1:]:
            if r.doc_ids != ids:
                raise RetrievalError("The fused retrievers index different documents; index them on the same docs.")
        self._doc_ids = ids

    def index(self, docs: Sequence[Document]) -> None:
        self._set_doc_ids(docs)
        for retriever in self.retrievers:
            retriever.index(docs)

    def _search(self, query: str, k: int) -> list[Hit]:
        depth = max(self.depth, k)
        rankings = [r.search(query, depth) for r in self.retrievers]
        return reciprocal_rank_fusion(rankings, weights=self.weights, rrf_k=self.rrf_k)[:k]

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        depth = max(self.depth, k)
        per_retriever = [r.search_many(queries, depth) for r in self.retrievers]
        return [reciprocal_rank_fusion([rows[q] for rows in per_retriever], weights=self.weights,
                                       rrf_k=self.rrf_k)[:k] for q in range(len(queries))]

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        parts = []
        for i, retriever in enumerate(self.retrievers):
            sub = f"{i}-{retriever.name}"
            retriever.save(path / sub)
            parts.append(sub)
        self._write_manifest(path, parts=parts)

    @classmethod
    def load(cls, path: str | Path) -> HybridRetriever:
        from agentgym.tools.retrieval.factory import load_retriever

        path = Path(path)
        manifest = cls._read_manifest(path, cls.name)
        parts = [load_retriever(path / sub) for sub in manifest["parts"]]
        config = manifest["config"]
        return cls(parts, weights=config["weights"], rrf_k=config["rrf_k"], depth=config["depth"])

    def __repr__(self) -> str:
        return f"HybridRetriever({len(self)} docs, {json.dumps(self.config())})"
