"""One catalogue entry: what registering an env id needs, shared by our catalogue and the plugins' ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CatalogueEntry"]


@dataclass(frozen=True)
class CatalogueEntry:
    """One registered env: its id, entry point, family and default kwargs.

    The env's description lives once, in its class docstring (see :mod:`agentgym.registration.env_docs`), so
    our entries carry no prose; :attr:`summary` reads the docstring's summary line.

    Attributes:
        id: ``namespace/Name-vN``.
        entry_point: ``module:Class``.
        description: A plugin's own one-line description, shown instead of its class docstring's summary; empty
            for ours.
        family: The env family (one docs page each), e.g. ``games``.
        kwargs: Default constructor arguments.
    """

    id: str
    entry_point: str
    description: str = ""
    family: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """The line ``agentgym list`` shows: :attr:`description` if set, else the class docstring's summary line,
        read from the module's source without importing it (so heavy dependencies stay unloaded)."""
        if self.description:
            return self.description
        from agentgym.registration.summaries import entry_point_summary

        return entry_point_summary(self.entry_point)
