"""One error hierarchy for the whole library.

Every error a user can trigger derives from :class:`AgentGymError`, so callers can catch one type, and
every message says what was wrong, what was expected and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AgentGymError",
    "ConfigError",
    "ContextLengthExceeded",
    "DependencyNotInstalled",
    "EnvCrashed",
    "RegistrationError",
    "TaskError",
    "ToolError",
    "did_you_mean",
]


class AgentGymError(Exception):
    """Base class of every error raised on purpose by agentgym."""


class ContextLengthExceeded(AgentGymError):
    """The model cannot take a request: its prompt plus ``max_tokens`` is longer than the model's context window.

    Policies raise it for requests a server refused for their length (HTTP 400 ``context_length_exceeded``). The
    rollout engine and the branching sampler end that episode as a ``context_limit`` truncation, as when
    ``RolloutConfig.max_context_tokens`` stops it first: the conversation outgrew the model, which is how that
    episode ended, not an infrastructure error that trainers would drop.
    """


class RegistrationError(AgentGymError):
    """An environment id is unknown or registered twice."""


class DependencyNotInstalled(AgentGymError, ImportError):
    """An optional dependency is missing; the message names the extra that provides it."""

    def __init__(self, package: str, extra: str, purpose: str = "") -> None:
        why = f" (needed for {purpose})" if purpose else ""
        super().__init__(
            f"'{package}' is not installed{why}. Install it with: pip install 'agentgym[{extra}]'"
        )
        self.package = package
        self.extra = extra


class TaskError(AgentGymError):
    """A task or task suite is malformed, unknown or unsolvable."""


class ToolError(AgentGymError):
    """A tool was declared or called wrongly (not a model mistake: those become error observations)."""


class EnvCrashed(AgentGymError):
    """Infrastructure under an environment (sandbox, browser, container) died; the episode ends with error."""


class ConfigError(AgentGymError, ValueError):
    """A configuration value or command-line argument is invalid."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return a ' Did you mean ...?' suffix for an unknown name, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"
