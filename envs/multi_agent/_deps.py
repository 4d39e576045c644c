"""Optional dependencies of the multi-agent family, with errors that name the extra to install.

PettingZoo (the AEC/Parallel API) and OpenSpiel (``pyspiel``: the rules of tic-tac-toe, connect-four and
chess) are both Apache-2.0 and live in the ``agentgym[multiagent]`` extra, so ``import agentgym`` never
pays for them. The GPL ``chess`` package is deliberately not used anywhere.
"""

from __future__ import annotations

from typing import Any

from agentgym.errors import DependencyNotInstalled

__all__ = ["require_pettingzoo", "require_pyspiel"]


def require_pettingzoo() -> Any:
    """Import and return :mod:`pettingzoo`, or raise naming the ``multiagent`` extra."""
    try:
        import pettingzoo
    except ImportError as exc:
        raise DependencyNotInstalled("pettingzoo", "multiagent", "multi-agent environments") from exc
    return pettingzoo


def require_pyspiel() -> Any:
    """Import and return OpenSpiel's :mod:`pyspiel`, or raise naming the ``multiagent`` extra."""
    try:
        import pyspiel
    except ImportError as exc:
        raise DependencyNotInstalled("open_spiel", "multiagent", "board-game and chess rules") from exc
    return pyspiel
