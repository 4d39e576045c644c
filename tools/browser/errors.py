"""Errors of the browser tool, split by whose fault they are.

:class:`ActionError` is the model's mistake (a ref that does not exist, a click off the screen, a refused
URL): envs turn it into an error observation and the episode goes on. :class:`BrowserCrashed` is the
infrastructure's (the browser process died, a page crashed or hung): it is an
:class:`~agentgym.errors.EnvCrashed`, so the episode ends with ``end_reason="error"`` and the pool replaces
the browser for the next one. Nothing here imports Playwright, so the text-only shop can use these too.
"""

from __future__ import annotations

from agentgym.errors import AgentGymError, EnvCrashed

__all__ = ["ActionError", "BrowserCrashed", "BrowserUnavailable"]


class ActionError(AgentGymError):
    """A browser action the model asked for cannot be done; the message tells the model the fix."""


class BrowserCrashed(EnvCrashed):
    """The browser or the episode's page died or hung; the episode ends and the pool starts a new one."""


class BrowserUnavailable(AgentGymError):
    """No Chromium binary or no Playwright package; the message says what to install."""
