"""The ``agentgym`` command line: one module per command, :func:`main` dispatches."""

from __future__ import annotations

from agentgym.cli.main import main

__all__ = ["main"]
