"""BM25 over a sparse matrix of precomputed scores (``bm25s``).

``bm25s`` computes every document's BM25 contribution per term at index time and stores them in one sparse
matrix, so a query is a sum of a few rows: on the full search corpus it answers in about a millisecond and
indexes in seconds, against about 100x slower queries for ``rank-bm25`` (``benchmarks/retrieval.py``
measures both in one run). We tokenize ourselves (:mod:`agentgym.tools.retrieval.text`) and pick the top
k ourselves, so results do not depend on ``bm25s``'s tokenizer defaults and ties break reproducibly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from agentgym.tools.retrieval.base import (
    Document,
    Hit,
    RetrievalError,
    Retriever,
    top_k_indices,
)
from agentgym.tools.retrieval.text import ANALYZER_VERSION, tokenize

from agentgym.errors import ConfigError, DependencyNotInstalled

__all__ = ["BM25Retriever"]

_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError as exc:
        raise DependencyNotInstalled("bm25s", "search", "BM25 retrieval") from exc
    return bm25s


class BM25Retriever(Retriever):
    """Lexical retrieval with BM25 (Lucene variant by default).

    Args:
        k1: Term-frequency saturation (higher lets repeated terms count more).
        b: Length normalisation (0 = none, 1 = full).
        method: BM25 variant: ``lucene``, ``robertson``, ``atire``, ``bm25l`` or ``bm25+``.
        stem: Strip plural "s" from words of documents and queries.
    """

    name: ClassVar[str] = "bm25"

    def __init__(self, *, k1: float = 1.2, b: float = 0.75, method: str = "lucene", stem: bool = False) -> None:
        super().__init__()
        if k1 < 0 or not 0 <= b <= 1:
            raise ConfigError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}; the usual values are 1.2 and 0.75.")
        if method not in _METHODS:
            raise ConfigError(f"Unknown BM25 method {method!r}; choose one of {', '.join(_METHODS)}.")
        self.k1, self.b, self.method, self.stem = float(k1), float(b), method, bool(stem)
        self._model: Any = None
        self._vocab: dict[str, int] = {}

    def config(self) -> dict[str, Any]:
        return {"k1": self.k1, "b": self.b, "method": self.method, "stem": self.stem}

    def index(self, docs: Sequence[Document]) -> None:
        bm25s = _bm25s()
        self._set_doc_ids(docs)
        vocab: dict[str, int] = {}
        ids: list[list[int]] = []
        for doc in docs:
            ids.append([vocab.setdefault(word, len(vocab)) for word in tokenize(doc.indexed_text(), stem=self.stem)])
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        model.index((ids, vocab), show_progress=False)
        self._model, self._vocab = model, dict(model.vocab_dict)

    def query_token_ids(self, query: str) -> list[int]:
        """The query's distinct words that occur in the index, as token ids (unknown words are dropped).

        Repeated words count once: "the country where X is, or the country where Y is" must not weigh
        "country" double (measured: 2.4 points of recall@5 on natural questions; tantivy dedupes too).
        """
        words = dict.fromkeys(w for w in tokenize(query, stem=self.stem) if w in self._vocab and w != "")
        return [self._vocab[w] for w in words]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every indexed document for ``query`` (zeros when no query word is indexed)."""
        token_ids = self.query_token_ids(query)
        if not token_ids:
            return np.zeros(len(self), dtype=np.float32)
        return np.asarray(self._model.get_scores_from_ids(token_ids), dtype=np.float32)

    def _search(self, query: str, k: int) -> list[Hit]:
        scores = self.scores(query)
        return [Hit(self._doc_ids[i], float(scores[i])) for i in top_k_indices(scores, k)]

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._model.save(str(path), show_progress=False)
        self._write_manifest(path, analyzer=ANALYZER_VERSION)

    @classmethod
    def load(cls, path: str | Path) -> BM25Retriever:
        bm25s = _bm25s()
        path = Path(path)
        manifest = cls._read_manifest(path, cls.name)
        if manifest.get("analyzer") != ANALYZER_VERSION:
            raise RetrievalError(f"{path} was built with analyzer version {manifest.get('analyzer')}, this version "
                                 f"tokenizes with {ANALYZER_VERSION}; rebuild the index.")
        retriever = cls(**manifest["config"])
        retriever._model = bm25s.BM25.load(str(path), load_vocab=True, show_progress=False)
        retriever._vocab = dict(retriever._model.vocab_dict)
        retriever._doc_ids = list(manifest["doc_ids"])
        return retriever

    def __repr__(self) -> str:
        return f"BM25Retriever({len(self)} docs, {json.dumps(self.config())})"
