"""Helpers shared by the text games: their parser and RNG plumbing."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentgym.parsers import CompositeParser, FunctionCallParser, HermesParser
from agentgym.suite import Task

__all__ = ["check_settings", "games_parser", "python_rng", "sample_one"]


def games_parser(tool_names: Sequence[str], raw_argument_tools: dict[str, str] | None = None) -> CompositeParser:
    """Hermes ``<tool_call>`` plus function-call strings (``move("north")``)."""
    return CompositeParser([HermesParser(), FunctionCallParser(tool_names, raw_argument_tools)])


def python_rng(np_rng: np.random.Generator) -> random.Random:
    """A ``random.Random`` seeded from the env's numpy generator.

    The task generators take ``random.Random`` (so suites are reproducible without numpy state), while
    envs must only draw from ``self.np_random``; this bridges the two deterministically.
    """
    return random.Random(int(np_rng.integers(0, 2**63 - 1)))


def sample_one(generator: Callable[..., list[Task]], np_rng: np.random.Generator, params: dict[str, Any]) -> Task:
    """Draw a single task from a suite generator with the env's RNG."""
    return generator(python_rng(np_rng), 1, **params)[0]


_CHECKED_SETTINGS: set[tuple[Callable[..., list[Task]], str]] = set()


def check_settings(generator: Callable[..., list[Task]], params: dict[str, Any]) -> None:
    """Fail fast on bad generator settings by drawing one task from them, once per settings and process.

    Why once: an env is built per episode (a training step builds hundreds), and drawing a task is not free (a
    Sokoban puzzle is generated and proven by a solver: about 16 ms, a second per 64 envs). Settings that
    failed are checked again, so every bad construction raises.
    """
    key = (generator, repr(sorted(params.items())))
    if key in _CHECKED_SETTINGS:
        return
    generator(random.Random(0), 1, **params)
    _CHECKED_SETTINGS.add(key)
