"""The URL guard: only pages that the environment itself serves on 127.0.0.1 may be visited.

An agent that can type URLs must not reach the internet or other services on the machine. The guard is
one pure function of the URL and the episode's allowed origins, used in three places: before ``goto``
(a refused URL is an error observation), in the context's request router (every request the browser
makes, including links, form posts, sub-resources and the first hop of a redirect) and in the text-only
browser. Only ``http://127.0.0.1:PORT`` with a port the env serves is allowed; ``localhost``, other
loopback addresses, other ports and other schemes are refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urljoin, urlsplit

from agentgym.errors import ConfigError

__all__ = ["UrlGuard", "origin_of"]

LOOPBACK_HOST = "127.0.0.1"


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the port made explicit), or ``""`` when it has none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ""
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    port = port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"


class UrlGuard:
    """Allows exactly the given ``http://127.0.0.1:PORT`` origins.

    Args:
        allowed_origins: Origins the env serves, e.g. ``["http://127.0.0.1:41234"]``.
    """

    def __init__(self, allowed_origins: Iterable[str]) -> None:
        origins = []
        for origin in allowed_origins:
            normalized = origin_of(origin)
            if not normalized or urlsplit(normalized).hostname != LOOPBACK_HOST:
                raise ConfigError(f"Allowed origin {origin!r} must look like http://127.0.0.1:PORT.")
            origins.append(normalized)
        if not origins:
            raise ConfigError("UrlGuard needs at least one allowed origin (the env's own server).")
        self.origins: tuple[str, ...] = tuple(dict.fromkeys(origins))

    @property
    def home(self) -> str:
        """The first allowed origin: relative URLs resolve against it when no page is open."""
        return self.origins[0]

    def resolve(self, url: str, base: str | None = None) -> str:
        """Make ``url`` absolute against ``base`` (or the home origin); ``/cart`` becomes a full URL."""
        url = url.strip()
        if base is None or not origin_of(base):
            base = self.home + "/"
        return urljoin(base, url)

    def refusal(self, url: str) -> str | None:
        """``None`` when ``url`` may be visited, else the reason (for the model) it may not.

        The message names no port: the model addresses pages by path, and the same action must read the
        same in the browser and in the text-only browser (whose origin is virtual).
        """
        hint = "only pages of this site (served on 127.0.0.1) may be visited; give a path such as '/'"
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError:
            return f"{url[:200]!r} is not a valid URL; {hint}"
        if parts.scheme not in ("http", "https"):
            return f"{url[:200]!r} uses the {parts.scheme or 'missing'} scheme; {hint}"
        if origin_of(url) not in self.origins:
            return f"{url[:200]!r} is outside this site; {hint}"
        return None

    def allows(self, url: str) -> bool:
        return self.refusal(url) is None
