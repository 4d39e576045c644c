"""Deprecated path of :mod:`agentgym.serving.openai_server`; kept for one release.

Run as a program (``python -m agentgym.serve``) it is :mod:`agentgym.cli.serve`, the ``agentgym serve`` command.
"""

from agentgym.utils.deprecation import moved_module

moved_module(__name__, "agentgym.cli.serve" if __name__ == "__main__" else "agentgym.serving.openai_server")
