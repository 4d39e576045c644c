"""Search family: answer (multi-hop) questions by searching a real Wikipedia corpus (``agentgym/Search-v1``).

Modules: ``sources`` (read and reconcile the data packages), ``corpus`` (documents, cached on disk),
``questions`` (generated questions with reference search paths; the suites' generator), ``scoring`` (EM/F1),
``index`` (shared, cached retrievers over a corpus) and ``env`` (:class:`SearchEnv`). Importing this package
is light; the data and retrieval libraries load when an env or a corpus is built (``agentgym[search]``).
"""

from __future__ import annotations

from agentgym.utils.lazy import lazy_attributes

__all__ = ["SearchEnv"]

__getattr__, __dir__ = lazy_attributes(__name__, {"SearchEnv": "agentgym.envs.search.env"})
