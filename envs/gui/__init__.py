"""GUI environments: MiniWoB++ web tasks controlled by pixels (screenshot in, coordinate actions out).

``agentgym/MiniWoB-v0`` loads the task pages bundled by the ``miniwob`` package (128 tasks) in the
system Chromium through :mod:`agentgym.tools.browser`; the reward is the page's own.
"""
