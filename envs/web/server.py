"""Serve a request -> response app over HTTP on 127.0.0.1 from a background thread.

The browser env needs real HTTP; the standard library's threading server is enough for a few browser
contexts on one machine and adds no dependency. It binds 127.0.0.1 on a free port (never a public
interface), and one server per app is shared by every env of the process, so many envs cost one thread
and one port. The text-only env never starts it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from agentgym.envs.web.app import Request, Response, ShopApp
from agentgym.tools.browser.serving import QuietThreadingHTTPServer

__all__ = ["AppServer", "shared_shop"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


class AppServer:
    """An HTTP server on ``127.0.0.1:<free port>`` answering with ``handler(Request) -> Response``.

    Args:
        handler: The app's request function.
    """

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        handler_class = _make_handler(handler)
        self._server = QuietThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"agentgym-http-{self.port}",
                                        daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``: the only origin the env's browser may visit."""
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _make_handler(app_handler: Callable[[Request], Response]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes; with Nagle's algorithm and delayed ACKs that costs
        # ~40 ms per response on loopback.
        disable_nagle_algorithm = True

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.send_error(413, "request body too large")
                return
            body = self.rfile.read(length) if length else b""
            request = Request.from_raw(method, self.path, body, self.headers.get("Cookie", ""))
            response = app_handler(request)
            payload = response.body.encode("utf-8")
            self.send_response(response.status)
            for name, value in response.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(payload)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_HEAD(self) -> None:
            self._serve("HEAD")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

    return Handler


@functools.lru_cache(maxsize=1)
def _shop_app() -> ShopApp:
    return ShopApp()


_SERVER: AppServer | None = None
_SERVER_LOCK = threading.Lock()


def shared_shop(*, serve: bool) -> tuple[ShopApp, AppServer | None]:
    """The process-wide shop app, and (with ``serve=True``) its HTTP server, started on first use."""
    global _SERVER
    app = _shop_app()
    if not serve:
        return app, None
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = AppServer(app.handle)
        return app, _SERVER
