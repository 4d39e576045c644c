"""The trajectory viewer: one HTML app for eval runs and training runs, served live or exported as a file.

:func:`~agentgym.viewer.run.load_run` reads a run (an eval directory, a training output directory, or one
trajectories JSONL), :func:`~agentgym.viewer.page.render_page` turns it into one self-contained HTML page (CSS,
script and data inline, learning curves as inline SVG: it works offline and from a ``file://`` URL), and
:func:`~agentgym.viewer.server.serve` serves that page on 127.0.0.1, re-reading the run on every load so a
training run in progress can be watched. ``report.html`` is the same page written to disk.
"""

from agentgym.viewer.page import render_page
from agentgym.viewer.run import ViewerRun, load_run
from agentgym.viewer.server import serve

__all__ = ["ViewerRun", "load_run", "render_page", "serve"]
