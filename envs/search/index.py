"""Retrievers over a search corpus, built once per machine and shared within a process.

Many envs run in one process (GRPO groups, the rollout engine's workers, ``check_agent_env``'s replays),
and each would otherwise rebuild the same index. :func:`corpus_retriever` keeps one retriever per (corpus,
retriever, options) in memory and, for BM25, one saved index on disk next to the corpus cache; dense
vectors are cached by :class:`~agentgym.tools.retrieval.DenseRetriever` itself, keyed by the texts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym.envs.search.corpus import Corpus
from agentgym.tools.retrieval import (
    RetrievalError,
    Retriever,
    default_cache_dir,
    load_retriever,
    make_retriever,
)
from agentgym.tools.retrieval.base import INDEX_FORMAT
from agentgym.tools.retrieval.text import ANALYZER_VERSION

from agentgym.utils.cache import build_once, file_lock
from agentgym.errors import ConfigError

__all__ = ["CORPUS_RETRIEVERS", "clear_retriever_cache", "corpus_retriever"]

logger = logging.getLogger(__name__)

#: Retriever names an env can build from a string (the simulated engine needs a policy: pass an instance).
CORPUS_RETRIEVERS = ("bm25", "dense", "hybrid")

_LOCK = threading.Lock()
_RETRIEVERS: dict[tuple[str, str, str, str], Retriever] = {}


def _options_key(options: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(options), sort_keys=True)
    except TypeError as exc:
        raise ConfigError(f"retriever_options must be JSON-like (numbers, strings, lists), got {options!r}.") from exc


def _index_dir(root: Path, corpus: Corpus, name: str, key: str) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return root / "search" / f"index-{corpus.name}-{corpus.fingerprint}-{name}-{digest}"


def _build(name: str, corpus: Corpus, options: Mapping[str, Any], root: Path | None) -> Retriever:
    if name == "hybrid":
        parts = [corpus_retriever("bm25", corpus, cache_dir=root), corpus_retriever("dense", corpus, cache_dir=root)]
        return make_retriever("hybrid", retrievers=parts, **dict(options))
    if name == "dense":
        retriever = make_retriever("dense", **dict(options))
        retriever.index(list(corpus))
        return retriever
    folder = _index_dir(root or default_cache_dir(), corpus, name,
                        f"{_options_key(options)}/analyzer{ANALYZER_VERSION}/format{INDEX_FORMAT}")
    built: list[Retriever] = []

    def build(tmp: Path) -> None:  # under the cache lock, into a temporary sibling renamed into place
        retriever = make_retriever(name, **dict(options))
        retriever.index(list(corpus))
        built.append(retriever)
        retriever.save(tmp)

    for attempt in range(2):
        try:
            build_once(folder, build)
        except OSError as exc:  # a read-only cache is not fatal: the index is in memory
            logger.warning("could not cache the %s index in %s (%s)", name, folder, exc)
            break
        if built:
            return built[0]
        try:
            loaded = load_retriever(folder)
            if len(loaded) == len(corpus):
                return loaded
        except (RetrievalError, OSError, ValueError) as exc:
            logger.warning("rebuilding the %s index: %s is unreadable (%s)", name, folder, exc)
        if attempt == 0:  # unreadable or stale entry: remove it under the lock, then build once more
            with file_lock(folder.parent / f".{folder.name}.lock"):
                shutil.rmtree(folder, ignore_errors=True)
    if built:
        return built[0]
    retriever = make_retriever(name, **dict(options))
    retriever.index(list(corpus))
    return retriever


def corpus_retriever(name: str, corpus: Corpus, options: Mapping[str, Any] | None = None, *,
                     cache_dir: str | Path | None = None) -> Retriever:
    """A retriever of kind ``name`` indexed on ``corpus``, shared by every caller in this process.

    Args:
        name: ``bm25``, ``dense`` or ``hybrid`` (BM25 + dense, fused by reciprocal rank).
        corpus: The corpus to index.
        options: Constructor options of that retriever (see :func:`agentgym.tools.retrieval.make_retriever`).
        cache_dir: Cache root (default ``$AGENTGYM_CACHE_DIR`` or ``~/.cache/agentgym``).
    """
    if name not in CORPUS_RETRIEVERS:
        from agentgym.errors import did_you_mean

        hint = (" The simulated engine needs a policy: pass retriever=SimulatedSearchEngine(policy) instead of a name."
                if name == "simulated" else "")
        raise ConfigError(f"Unknown retriever {name!r}.{did_you_mean(str(name), CORPUS_RETRIEVERS)} Choose one of: "
                          f"{', '.join(CORPUS_RETRIEVERS)}.{hint}")
    options = dict(options or {})
    root = Path(cache_dir) if cache_dir is not None else None
    key = (corpus.fingerprint + corpus.name, name, _options_key(options), str(root))
    with _LOCK:
        cached = _RETRIEVERS.get(key)
    if cached is not None:
        return cached
    retriever = _build(name, corpus, options, root)
    with _LOCK:
        return _RETRIEVERS.setdefault(key, retriever)


def clear_retriever_cache() -> None:
    """Forget the in-process retrievers (the disk caches stay)."""
    with _LOCK:
        _RETRIEVERS.clear()
