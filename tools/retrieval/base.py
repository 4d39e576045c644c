"""The retriever contract shared by BM25, dense, hybrid and simulated search.

Every retriever answers ``search(query, k) -> list[Hit]`` over documents it was given with ``index(docs)``,
so an environment (or a benchmark) can swap one for another by name. A retriever knows document ids and
scores only; the text lives in the corpus, which keeps one copy of it however many indexes exist. The
simulated engine is the exception: it writes its documents, so its hits carry them (:attr:`Hit.document`).
"""

from __future__ import annotations

import abc
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from agentgym.errors import AgentGymError

__all__ = [
    "Document",
    "Hit",
    "RetrievalError",
    "Retriever",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_query",
    "default_cache_dir",
    "top_k_indices",
]

#: Bump when the on-disk layout of saved indexes changes.
INDEX_FORMAT = 1


class RetrievalError(AgentGymError, ValueError):
    """A search request or index operation was invalid; the message says the fix."""


@dataclass(frozen=True)
class Document:
    """One searchable document.

    Attributes:
        doc_id: Stable, unique id (what ``open(doc_id)`` takes and what gold paths name).
        title: Shown in result lists and indexed with the text.
        text: The full text.
        metadata: Free, JSON-serialisable facts about the document (source, entity, ...).
    """

    doc_id: str
    title: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def indexed_text(self) -> str:
        """What retrievers index: the title matters (it often names the entity), so it comes first."""
        return f"{self.title}. {self.text}" if self.title else self.text

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.doc_id, "title": self.title, "text": self.text, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Document:
        return cls(doc_id=str(data["id"]), title=str(data.get("title", "")), text=str(data.get("text", "")),
                   metadata=dict(data.get("metadata") or {}))


@dataclass(frozen=True)
class Hit:
    """One search result: a document id and its score (higher is better).

    Attributes:
        doc_id: Id of the matched document.
        score: Retriever-specific relevance (BM25 score, cosine similarity, fused RRF score).
        document: Set only by engines that create documents (the simulated engine); corpus retrievers leave it
            ``None`` and the caller looks the id up in its corpus.
    """

    doc_id: str
    score: float
    document: Document | None = None


def check_query(query: Any, k: Any) -> tuple[str, int]:
    """Validate a search request; raise :class:`RetrievalError` with the fix when it is unusable."""
    if not isinstance(query, str):
        raise RetrievalError(f"The query must be text, got {type(query).__name__}.")
    if not query.strip():
        raise RetrievalError("The query is empty; search for a few keywords, e.g. 'capital of Peru'.")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise RetrievalError(f"k must be a whole number of results, got {k!r}.")
    if k < 1:
        raise RetrievalError(f"k must be at least 1, got {k}.")
    return query, int(k)


def top_k_indices(scores: np.ndarray, k: int, *, positive_only: bool = True) -> np.ndarray:
    """Indices of the ``k`` best scores, best first; ties go to the lower index, so results are reproducible.

    Args:
        scores: One score per document.
        k: How many to return (fewer when fewer documents qualify).
        positive_only: Drop documents scoring <= 0 (for BM25 they share no term with the query).
    """
    candidates = np.flatnonzero(scores > 0) if positive_only else np.arange(scores.shape[0])
    if candidates.size == 0 or k <= 0:
        return np.empty(0, dtype=np.int64)
    values = scores[candidates]
    if candidates.size > k:
        kth = np.partition(values, candidates.size - k)[candidates.size - k]
        keep = values >= kth
        candidates, values = candidates[keep], values[keep]
    order = np.lexsort((candidates, -values))
    return candidates[order][:k]


class Retriever(abc.ABC):
    """Index documents once, then answer ``search(query, k)`` with the best document ids.

    Subclasses set :attr:`name`, implement :meth:`index`, :meth:`_search`, :meth:`save` and :meth:`load`, and
    return their constructor options from :meth:`config` (used in cache keys and saved manifests).
    """

    #: Registry name (``make_retriever(name)``).
    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._doc_ids: list[str] = []

    # ---- the contract ----------------------------------------------------------------------------
    @abc.abstractmethod
    def index(self, docs: Sequence[Document]) -> None:
        """Build the index over ``docs`` (replacing any previous index)."""

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The ``k`` best documents for ``query``, best first (fewer when fewer match).

        Raises:
            RetrievalError: Empty or non-text query, ``k < 1``, or no index built yet.
        """
        query, k = check_query(query, k)
        if not self.is_indexed:
            raise RetrievalError(f"{type(self).__name__} has no index yet; call index(docs) or load(path) first.")
        return self._search(query, min(k, len(self)))

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Search several queries (subclasses may batch; the default loops)."""
        return [self.search(q, k) for q in queries]

    @abc.abstractmethod
    def _search(self, query: str, k: int) -> list[Hit]:
        """Search a validated query; ``1 <= k <= len(self)``."""

    @abc.abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the index to directory ``path`` so that :meth:`load` restores it without re-indexing."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | Path) -> Retriever:
        """Restore an index written by :meth:`save`."""

    def config(self) -> dict[str, Any]:
        """Constructor options that change results (part of cache keys and of saved manifests)."""
        return {}

    # ---- shared helpers ----------------------------------------------------------------------------
    @property
    def doc_ids(self) -> list[str]:
        """Indexed document ids, in index order."""
        return list(self._doc_ids)

    @property
    def is_indexed(self) -> bool:
        return bool(self._doc_ids)

    def __len__(self) -> int:
        return len(self._doc_ids)

    def _set_doc_ids(self, docs: Sequence[Document]) -> None:
        if not docs:
            raise RetrievalError(f"{type(self).__name__}.index() needs at least one document.")
        ids = [d.doc_id for d in docs]
        seen: set[str] = set()
        for doc_id in ids:
            if doc_id in seen:
                raise RetrievalError(f"Document ids must be unique; {doc_id!r} appears more than once.")
            seen.add(doc_id)
        self._doc_ids = ids

    def _write_manifest(self, path: Path, **extra: Any) -> None:
        manifest = {"retriever": self.name, "format": INDEX_FORMAT, "config": self.config(), "doc_ids": self._doc_ids,
                    **extra}
        atomic_write_text(path / "retriever.json", json.dumps(manifest, ensure_ascii=False))

    @staticmethod
    def _read_manifest(path: Path, expected: str) -> dict[str, Any]:
        file = Path(path) / "retriever.json"
        if not file.is_file():
            raise RetrievalError(f"{path} holds no saved retriever (no retriever.json); save one with .save(path).")
        manifest = json.loads(file.read_text(encoding="utf-8"))
        if manifest.get("retriever") != expected:
            raise RetrievalError(f"{path} holds a {manifest.get('retriever')!r} retriever, not {expected!r}; "
                                 "load it with agentgym.tools.retrieval.load_retriever(path).")
        if manifest.get("format") != INDEX_FORMAT:
            raise RetrievalError(f"{path} was saved in index format {manifest.get('format')}, this version reads "
                                 f"{INDEX_FORMAT}; rebuild the index.")
        return manifest


# ---- files ---------------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """Where corpora, indexes and embeddings are cached: the one root of :func:`agentgym.utils.cache.cache_root`."""
    from agentgym.utils.cache import cache_root

    return cache_root()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; caches are shared like any other cache file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
