"""``agentgym view RUN --serve``: the viewer page on a local port, re-read from disk on every load.

The standard library's threading HTTP server is enough for one reader, and needs no extra installed. It binds
127.0.0.1 by default: trajectories can hold anything a model or an env wrote (keys a sandbox printed, private
task data), so the page is not offered to the network unless the user asks for another host. Two paths exist:
``/`` (the page, rendered from the run as it is on disk now, so a training run in progress can be followed by
reloading) and ``/images/<sha256>.png`` (only images the run's trajectories refer to, read through their
content hash); everything else is 404.
"""

from __future__ import annotations

import http.server
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path

from agentgym.errors import AgentGymError, ConfigError
from agentgym.utils.images import ImageRef
from agentgym.viewer.page import CSP, render_page
from agentgym.viewer.run import ViewerRun, load_run

__all__ = ["ViewerServer", "serve"]

logger = logging.getLogger(__name__)

_IMAGE_PATH = re.compile(r"^/images/([0-9a-f]{64})\.png$")


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every file the page is made of: equal signatures, equal pages."""
    if path.is_file():
        candidates = [path, path.with_name(path.name.removesuffix(".jsonl") + ".tokens.jsonl")]
        folder = path.parent
    else:
        folder = path
        rollouts = path / "rollouts"
        candidates = [path / "trajectories.jsonl", path / "metrics.jsonl"]
        candidates += sorted(rollouts.glob("*.jsonl")) if rollouts.is_dir() else []
    candidates += [folder / name for name in ("run.json", "config.json", "summary.json")]
    found = []
    for file in candidates:
        try:
            stat = file.stat()
        except OSError:
            continue
        found.append((str(file), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def _run_images(run: ViewerRun) -> dict[str, ImageRef]:
    found: dict[str, ImageRef] = {}
    for ep in run.episodes:
        t = ep.trajectory
        for image in [i for turn in t.turns for i in turn.images] + list(t.final_images):
            found.setdefault(image.sha256, image)
    return found


class ViewerServer:
    """The viewer of the run at ``path`` on ``host:port`` (port 0: a free one); :meth:`start` runs it in a thread.

    Args:
        path: The run directory or trajectories file.
        host: The address to bind (127.0.0.1 unless the user chose otherwise).
        port: The port (0: any free port; :attr:`url` says which).
        limit: At most this many episodes per page load.
    """

    def __init__(self, path: str | Path, host: str = "127.0.0.1", port: int = 8765, limit: int | None = None) -> None:
        self.path = Path(path)
        self.limit = limit
        self._images: dict[str, ImageRef] = {}
        self._cached: tuple[tuple[tuple[str, int, int], ...], bytes] | None = None
        self._lock = threading.Lock()
        self._page()  # fail now, with the fix, rather than on the first page load (and have that load ready)
        handler = _handler(self._page, self._image)
        try:
            self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ConfigError(f"Cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port "
                              "(0 picks a free one).") from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def _page(self) -> bytes:
        """The page of the run as it is on disk now; rendered again only when a file of the run changed (a page
        of a few thousand saved episodes takes seconds to build)."""
        signature = _signature(self.path)
        with self._lock:
            if self._cached is not None and self._cached[0] == signature:
                return self._cached[1]
        run = load_run(self.path, limit=self.limit)
        body = render_page(run).encode("utf-8")
        with self._lock:
            self._images = _run_images(run)
            self._cached = (signature, body)
        return body

    def _image(self, sha256: str) -> bytes | None:
        with self._lock:
            image = self._images.get(sha256)
        if image is None:
            return None
        try:
            return image.png_bytes()  # checks the file against its hash
        except (OSError, AgentGymError):
            return None

    def start(self) -> ViewerServer:
        """Serve in a daemon thread (tests, notebooks); :meth:`close` stops it."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="agentgym-viewer", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve until Ctrl-C."""
        try:
            self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.httpd.server_close()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _handler(page: Callable[[], bytes], image: Callable[[str], bytes | None]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "agentgym-viewer"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not _local_host(self.headers.get("Host", ""), self.server.server_address[1]):
                # DNS rebinding: a web page the user visits can point its own name at 127.0.0.1 and read this
                # port; such a request carries that name, not this address, in its Host header
                self._send(403, b"this viewer answers only to 127.0.0.1 and localhost", "text/plain; charset=utf-8")
                return
            route = self.path.split("?", 1)[0]
            if route in ("/", "/index.html"):
                try:
                    body = page()
                except ConfigError as exc:  # the run was moved or emptied since the server started
                    self._send(500, str(exc).encode("utf-8"), "text/plain; charset=utf-8")
                    return
                self._send(200, body, "text/html; charset=utf-8")
                return
            match = _IMAGE_PATH.match(route)
            png = image(match.group(1)) if match else None
            if png is None:
                self._send(404, b"not found", "text/plain; charset=utf-8")
                return
            self._send(200, png, "image/png")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            # the page's own script (pinned by hash) and style run; nothing else loads
            self.send_header("Content-Security-Policy", CSP)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
            logger.debug("viewer: " + format, *args)

    return Handler


def _local_host(host: str, port: int) -> bool:
    """Whether a request's Host header names this server by a loopback name (``127.0.0.1``, ``localhost``,
    ``[::1]``), with this port or none."""
    name, given = host.lower(), ""
    match = re.fullmatch(r"(.*?)(?::(\d+))?", name)
    if match:
        name, given = match.group(1), match.group(2) or ""
    if given and given != str(port):
        return False
    return name in ("127.0.0.1", "localhost", "[::1]")


def serve(path: str | Path, host: str = "127.0.0.1", port: int = 8765, limit: int | None = None) -> ViewerServer:
    """A started :class:`ViewerServer` (in a daemon thread)."""
    return ViewerServer(path, host, port, limit).start()
