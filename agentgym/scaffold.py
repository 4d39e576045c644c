"""Deprecated path of :mod:`agentgym.cli.scaffold`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.cli.scaffold")
