"""Build retrievers by name and reload saved ones, with errors that name the fix.

Environments and configs pick a retriever with a string (``retriever="hybrid"``); this module is the one
place that maps names to classes, validates the options against the class's constructor (so a misspelled
option fails loudly instead of being ignored) and imports the heavy backend only when it is used.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from agentgym.tools.retrieval.base import RetrievalError, Retriever

from agentgym.errors import ConfigError, did_you_mean

__all__ = ["RETRIEVERS", "load_retriever", "make_retriever", "retriever_class"]

#: Registry name -> "module:Class" (imported on first use, so bm25s/faiss/torch load only when needed).
RETRIEVERS: dict[str, str] = {
    "bm25": "agentgym.tools.retrieval.bm25:BM25Retriever",
    "dense": "agentgym.tools.retrieval.dense:DenseRetriever",
    "hybrid": "agentgym.tools.retrieval.hybrid:HybridRetriever",
    "simulated": "agentgym.tools.retrieval.simulated:SimulatedSearchEngine",
}


def retriever_class(name: str) -> type[Retriever]:
    """The class registered under ``name``; unknown names get a did-you-mean error."""
    if not isinstance(name, str) or name not in RETRIEVERS:
        raise ConfigError(
            f"Unknown retriever {name!r}.{did_you_mean(str(name), RETRIEVERS)} "
            f"Choose one of: {', '.join(RETRIEVERS)}."
        )
    module_name, _, attr = RETRIEVERS[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)


def make_retriever(name: str, **options: Any) -> Retriever:
    """Create an (empty) retriever by name: ``make_retriever("bm25", k1=0.9)``.

    Args:
        name: ``bm25``, ``dense``, ``hybrid`` or ``simulated``.
        **options: Constructor options of that retriever; unknown ones raise :class:`ConfigError` listing the
            accepted options (``simulated`` needs ``policy=``).
    """
    cls = retriever_class(name)
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self" and params[p].kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        hints = "".join(did_you_mean(u, accepted) for u in unknown)
        raise ConfigError(f"Retriever {name!r} got unknown option(s) {unknown}.{hints} "
                          f"It accepts: {', '.join(accepted) or 'no options'}.")
    missing = [p for p in accepted if params[p].default is inspect.Parameter.empty and p not in options]
    if missing:
        raise ConfigError(f"Retriever {name!r} needs {', '.join(missing)}=...; e.g. "
                          f"make_retriever('simulated', policy=ScriptedPolicy([...])).")
    return cls(**options)


def load_retriever(path: str | Path) -> Retriever:
    """Reload any retriever saved with ``.save(path)`` (the manifest names its kind)."""
    manifest_file = Path(path) / "retriever.json"
    if not manifest_file.is_file():
        raise RetrievalError(f"{path} holds no saved retriever (no retriever.json); save one with .save(path).")
    try:
        name = json.loads(manifest_file.read_text(encoding="utf-8"))["retriever"]
    except (ValueError, KeyError) as exc:
        raise RetrievalError(f"{manifest_file} is damaged ({exc}); delete {path} and rebuild the index.") from exc
    return retriever_class(name).load(path)
