"""Process-wide shared instances (one per key), created on first use and closed when the interpreter exits.

Some resources are expensive to start and safe to share between envs: a browser with its pooled contexts,
warm sandboxes. Envs built with the same configuration should then share one instance instead of each
starting its own, and whatever the instances hold (child processes, threads, temp dirs) must go when the
process ends even if no one closed them. :class:`ProcessSingletons` is that registry; its key is the
configuration (a frozen, hashable dataclass).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

__all__ = ["Closable", "ProcessSingletons"]

logger = logging.getLogger(__name__)


class Closable(Protocol):
    """Anything with an idempotent ``close()`` that releases what it holds."""

    def close(self) -> None: ...


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Closable)


class ProcessSingletons(Generic[K, V]):
    """One shared ``V`` per key for the whole process; thread-safe, lazily created, closed at exit.

    Args:
        factory: Makes the instance for a key; called at most once per key at a time, under the registry's lock,
            so two threads asking at once get the same instance.
        reusable: Whether a stored instance may still be handed out (e.g. not closed, made in this process and
            not inherited through ``fork``); one that is not is replaced by a new one from ``factory``.
    """

    def __init__(self, factory: Callable[[K], V], *, reusable: Callable[[V], bool]) -> None:
        self._factory = factory
        self._reusable = reusable
        self._instances: dict[K, V] = {}
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def get(self, key: K) -> V:
        """The shared instance for ``key``, made now if there is none or the stored one is no longer reusable."""
        with self._lock:
            instance = self._instances.get(key)
            if instance is None or not self._reusable(instance):
                instance = self._instances[key] = self._factory(key)
            return instance

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of ``(key, instance)`` pairs, for callers that close some early (e.g. tests)."""
        with self._lock:
            return list(self._instances.items())

    def values(self) -> list[V]:
        """A snapshot of the instances made so far (closed ones included until they are replaced)."""
        with self._lock:
            return list(self._instances.values())

    def close_all(self) -> None:
        """Close every instance; run at interpreter exit. One that fails to close does not keep the others open."""
        for instance in self.values():
            try:
                instance.close()
            except Exception:  # noqa: BLE001 - at exit, the rest must still be closed
                logger.warning("closing a process-wide %s failed", type(instance).__name__, exc_info=True)
