"""Deprecated path of :mod:`agentgym.registration.catalogue`; kept for one release."""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.registration.catalogue")
