"""Argument types shared by the ``agentgym`` commands: a bad value exits 2 with what was expected."""

from __future__ import annotations

import argparse

__all__ = ["non_negative_float", "positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts (``--limit``, ``--port``): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse ``type`` for quantities that may be zero (``--temperature``): a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type`` for durations that must pass (``--idle-timeout``): a number > 0."""
    value = non_negative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value
