"""Deprecated path of :mod:`agentgym.cli.report`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.cli.report")
