"""What every agentgym HTTP server shares: its listening socket and its lifecycle under uvicorn.

The OpenAI-compatible server, the recording gateway and the env server all bind their socket here rather than
letting uvicorn do it, for three reasons: the port is known before serving starts (port 0 picks a free one, and
the URL can be printed or returned at once), a taken port is a clear :class:`~agentgym.errors.ConfigError`
instead of uvicorn's ``sys.exit``, and every server gets the same socket options. One of those options matters
for latency: a request-response protocol on a socket with Nagle's algorithm on waits about 40 ms per small
response for the client's delayed ACK (RFC 896 and RFC 1122 section 4.2.3.2 interact that way), so every
socket here has ``TCP_NODELAY``.

Two ways to run an app on such a socket:

* :func:`serve` blocks until interrupted (what the ``agentgym serve`` and ``agentgym serve-env`` commands run);
* :class:`BackgroundServer` runs it in a thread of this process and returns once it answers (tests, notebooks,
  benchmarks and trainers that serve their own policy).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from agentgym.errors import AgentGymError, ConfigError, DependencyNotInstalled

__all__ = ["BackgroundServer", "bind_socket", "check_port", "import_uvicorn", "serve", "socket_url"]

logger = logging.getLogger(__name__)

#: Connections the kernel queues before the server accepts them (uvicorn's default backlog).
BACKLOG = 2048


def check_port(port: int) -> None:
    """Refuse a port outside 0..65535 before anything slow (such as loading a model) starts."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port must be an integer in [0, 65535] (0 picks a free port), got {port!r}.")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` with ``TCP_NODELAY`` (port 0: a free one).

    Raises:
        ConfigError: The port is out of range, taken, or the host is not an address of this machine.
    """
    check_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP explicitly: asyncio sets TCP_NODELAY on the sockets it accepts only when their proto is
    # IPPROTO_TCP. Setting it on the listening socket as well covers servers that accept by other means.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"Cannot listen on {host}:{port} ({exc.strerror or exc}); pick another port (0 picks a "
                          "free one) or stop what holds it.") from exc
    return sock


def socket_url(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def import_uvicorn() -> Any:
    """The ``uvicorn`` module, or an error that names the extra to install."""
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise DependencyNotInstalled("uvicorn", "serve", "agentgym's HTTP servers") from exc
    return uvicorn


def _uvicorn_server(app: Any, log_filter: Callable[[logging.LogRecord], bool] | None,
                    config: dict[str, Any]) -> Any:
    uvicorn = import_uvicorn()
    server = uvicorn.Server(uvicorn.Config(app, **config))
    if log_filter is not None:  # after Config, which sets up uvicorn's loggers
        logging.getLogger("uvicorn.error").addFilter(log_filter)
    return server


def serve(app: Any, sock: socket.socket, *, log_level: str = "info", on_ready: Callable[[str], None] | None = None,
          log_filter: Callable[[logging.LogRecord], bool] | None = None, **config: Any) -> None:
    """Serve ``app`` on ``sock`` (see :func:`bind_socket`) until interrupted; the socket is closed afterwards.

    uvicorn handles SIGINT and SIGTERM: requests in flight finish and the app's lifespan shutdown runs.

    Args:
        app: An ASGI app (FastAPI).
        sock: The listening socket.
        log_level: uvicorn's log level.
        on_ready: Called with the server's URL (:func:`socket_url`) just before serving starts.
        log_filter: A filter for uvicorn's error log (return False to drop a record).
        **config: Further ``uvicorn.Config`` settings (``ws_max_size``, ``timeout_graceful_shutdown``, ...).
    """
    try:
        server = _uvicorn_server(app, log_filter, {"log_level": log_level, **config})
        if on_ready is not None:
            on_ready(socket_url(sock))
        server.run(sockets=[sock])
    finally:
        sock.close()


class BackgroundServer:
    """Runs an app under uvicorn in a daemon thread of this process; :meth:`start` returns once it answers.

    The socket is bound in :meth:`start`, before the thread runs, so the port is known at once and no other
    process can take it in between.

    Args:
        app: An ASGI app (FastAPI).
        host: Interface to bind.
        port: TCP port; 0 picks a free one.
        ready_path: A ``GET`` path that answers 200 once the app has started (its lifespan startup has run).
        startup_timeout_s: How long :meth:`start` waits for ``ready_path`` to answer.
        **config: Further ``uvicorn.Config`` settings.

    Attributes:
        app: The app served.
        url: ``http://HOST:PORT`` once started.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, ready_path: str = "/health",
                 startup_timeout_s: float = 60.0, **config: Any) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.ready_path = ready_path
        self.startup_timeout_s = startup_timeout_s
        self.url = ""
        self._config = {"log_level": "warning", "lifespan": "on", "access_log": False, **config}
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> str:
        """Start serving and return :attr:`url` once ``ready_path`` answers."""
        if self._thread is not None:
            raise AgentGymError(f"{type(self).__name__}.start() called twice; use one {type(self).__name__} per "
                                "server.")
        import httpx

        sock = bind_socket(self.host, self.port)
        try:
            self._server = _uvicorn_server(self.app, None, self._config)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.url = socket_url(sock)

        def target() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=target, name=f"agentgym-serve-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if not self._thread.is_alive():
                raise AgentGymError(f"The server thread exited during start-up: {self._error!r}. See the log above.")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2.0).status_code == 200:
                    return self.url
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AgentGymError(f"The server at {self.url} did not answer within {self.startup_timeout_s} s.")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask uvicorn to exit (finishing requests in flight) and join the thread; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("The server thread on port %d did not stop within %.0f s.", self.port, timeout_s)
        self._thread = None
        self._server = None

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
