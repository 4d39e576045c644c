"""The HTTP server class envs use to serve their pages to the browser on 127.0.0.1.

Browsers close keep-alive connections whenever a context or a browser goes away (every episode with
``isolation="browser"``, every crash). The standard library's server prints a traceback for each such
reset; here it is a debug log line, because it is normal, not an error.
"""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer

__all__ = ["QuietThreadingHTTPServer"]

logger = logging.getLogger(__name__)


class QuietThreadingHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server (daemon threads) that logs dropped connections instead of printing them."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        logger.debug("connection from %s dropped", client_address, exc_info=sys.exc_info())
