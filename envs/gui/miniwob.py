"""The MiniWoB++ tasks bundled by the ``miniwob`` package, served from 127.0.0.1 and read with their own JS.

We use only the package's HTML, CSS and JS files (not its Selenium-based Gymnasium env): the task ids are
read from the package's registration module (128 ids: 125 single pages under ``html/miniwob`` and three
flight-booking sites under ``html/flight``), the files are served by a static HTTP server on 127.0.0.1,
and each episode is driven through Playwright. The reward is the task's own: every page ends an episode
with ``core.endEpisode(reward)``, which sets ``WOB_DONE_GLOBAL`` and ``WOB_RAW_REWARD_GLOBAL``; we read
those. The time limit (``core.EPISODE_MAX_TIME``) is lifted and the time-discounted reward ignored,
because an LLM's thinking time is not the task's difficulty and wall-clock rewards would break replay.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
import threading
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

from agentgym.envs.gui.page_policy import content_security_policy
from agentgym.tools.browser.serving import QuietThreadingHTTPServer

from agentgym.errors import DependencyNotInstalled, TaskError, did_you_mean

__all__ = [
    "FLIGHT_SCREEN",
    "MINIWOB_SCREEN",
    "StaticServer",
    "html_dir",
    "native_screen",
    "shared_static_server",
    "task_ids",
    "task_path",
]

logger = logging.getLogger(__name__)

MINIWOB_SCREEN = (160, 210)
FLIGHT_SCREEN = (375, 667)
#: Sent before starting an episode: seed the page's Math.random, lift the time limit, start the task.
START_JS = """([seed, maxTime]) => {
  Math.seedrandom(String(seed));
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  const u = core.getUtterance();  // three email tasks return {utterance, fields}: only the words are shown
  return [WOB_TASK_READY, typeof u === 'string' ? u : u.utterance];
}"""
READY_JS = ("() => { const u = core.getUtterance(); "
            "return [WOB_TASK_READY, typeof u === 'string' ? u : u.utterance]; }")
STATE_JS = "() => [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON]"
#: Hide MiniWoB's score board and click tracker: they sit beside the task and would leak wall-clock noise.
HIDE_CHROME_CSS = "#reward-display, #click-canvas, #attention-canvas { display: none !important; }"
NO_TIME_LIMIT_MS = 2_147_483_647  # setTimeout's maximum; larger values fire at once


def _package_dir() -> Path:
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise DependencyNotInstalled("miniwob", "web", "the MiniWoB++ task pages")
    return Path(next(iter(spec.submodule_search_locations)))


def html_dir() -> Path:
    """The ``html`` folder of the installed ``miniwob`` package (pages, ``core/core.js``, assets)."""
    path = _package_dir() / "html"
    if not (path / "core" / "core.js").is_file():
        raise DependencyNotInstalled("miniwob", "web", f"the MiniWoB++ task pages ({path} has no core/core.js)")
    return path


@functools.lru_cache(maxsize=1)
def task_ids() -> tuple[str, ...]:
    """The 128 task ids the package registers (e.g. ``click-button``, ``flight.AA``), sorted.

    Read from the text of ``miniwob/registration.py`` (importing ``miniwob`` would register its Selenium
    envs); if that file changes shape, every page under ``html/miniwob`` counts as a task instead.
    """
    registration = _package_dir() / "registration.py"
    ids: list[str] = []
    if registration.is_file():
        ids = re.findall(r'id="miniwob/([A-Za-z0-9.\-]+?)-v\d+"', registration.read_text(encoding="utf-8"))
    ids = [i for i in ids if task_path(i, check=False) is not None]
    if not ids:
        ids = [p.stem for p in (html_dir() / "miniwob").glob("*.html")]
    return tuple(sorted(dict.fromkeys(ids)))


def task_path(task: str, *, check: bool = True) -> str | None:
    """URL path of a task's page (``/miniwob/click-button.html``, ``/flight/AA/wrapper.html``)."""
    root = html_dir()
    if task.startswith("flight."):
        relative = f"flight/{task.split('.', 1)[1]}/wrapper.html"
    else:
        relative = f"miniwob/{task}.html"
    if (root / relative).is_file() and re.fullmatch(r"[A-Za-z0-9.\-]+", task):
        return "/" + relative
    if not check:
        return None
    raise TaskError(f"Unknown MiniWoB task {task!r}.{did_you_mean(task, task_ids())} "
                    f"The {len(task_ids())} tasks are listed by agentgym.envs.gui.miniwob.task_ids().")


def native_screen(task: str) -> tuple[int, int]:
    """The task's own ``(width, height)``: 160x210 for MiniWoB pages, 375x667 for the flight sites."""
    return FLIGHT_SCREEN if task.startswith("flight.") else MINIWOB_SCREEN


class StaticServer:
    """Serve a folder read-only on ``127.0.0.1:<free port>`` from a daemon thread."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(root))
        self._server = QuietThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"agentgym-static-{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    disable_nagle_algorithm = True  # see agentgym.envs.web.server: avoids ~40 ms Nagle/delayed-ACK stalls

    def end_headers(self) -> None:
        """Every HTML page goes out with its script policy (see :mod:`agentgym.envs.gui.page_policy`)."""
        path = Path(self.translate_path(self.path))
        if path.suffix in (".html", ".htm") and path.is_file():
            self.send_header("Content-Security-Policy", content_security_policy(path))
        super().end_headers()

    def do_PUT(self) -> None:
        self.send_error(405)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


_SERVER: StaticServer | None = None
_SERVER_LOCK = threading.Lock()


def shared_static_server() -> StaticServer:
    """The process-wide server of the MiniWoB pages (started on first use)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = StaticServer(html_dir())
        return _SERVER
