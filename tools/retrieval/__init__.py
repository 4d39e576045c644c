"""Retrievers behind one interface: BM25, dense, hybrid (RRF) and an LLM-simulated search engine.

``index(docs)`` once, then ``search(query, k) -> list[Hit]``; ``save(path)`` / ``load_retriever(path)``
persist an index. Pick one by name with :func:`make_retriever`. Importing this package is light: ``bm25s``,
``faiss``, ``torch`` and ``transformers`` are imported by the retriever that needs them (``agentgym[search]``).
"""

from __future__ import annotations

from agentgym.tools.retrieval.base import (
    Document,
    Hit,
    RetrievalError,
    Retriever,
    default_cache_dir,
)
from agentgym.tools.retrieval.factory import (
    RETRIEVERS,
    load_retriever,
    make_retriever,
    retriever_class,
)
from agentgym.tools.retrieval.text import fold, tokenize
from agentgym.utils.lazy import lazy_attributes

__all__ = [
    "RETRIEVERS",
    "BM25Retriever",
    "DenseRetriever",
    "Document",
    "Hit",
    "HybridRetriever",
    "RetrievalError",
    "Retriever",
    "SentenceEncoder",
    "SimulatedSearchEngine",
    "curriculum_noise",
    "default_cache_dir",
    "fold",
    "load_retriever",
    "make_retriever",
    "reciprocal_rank_fusion",
    "retriever_class",
    "tokenize",
]

__getattr__, __dir__ = lazy_attributes(__name__, {
    "BM25Retriever": "agentgym.tools.retrieval.bm25",
    "DenseRetriever": "agentgym.tools.retrieval.dense",
    "SentenceEncoder": "agentgym.tools.retrieval.dense",
    "HybridRetriever": "agentgym.tools.retrieval.hybrid",
    "reciprocal_rank_fusion": "agentgym.tools.retrieval.hybrid",
    "SimulatedSearchEngine": "agentgym.tools.retrieval.simulated",
    "curriculum_noise": "agentgym.tools.retrieval.simulated",
})
