"""Browser settings and how the system Chromium is found.

``playwright install`` cannot download browsers on these machines, so the pool always launches a system
Chromium (Debian ``apt-get install -y chromium``) through ``executable_path``. The launch flags are the
ones measured to work here (see the design notes): no sandbox (we run as root in a container), no GPU, and
none of Chromium's own background traffic.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from agentgym.tools.browser.errors import BrowserUnavailable

from agentgym.errors import ConfigError

__all__ = ["DEFAULT_LAUNCH_ARGS", "BrowserConfig", "find_chromium"]

DEFAULT_LAUNCH_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)

#: Where Debian, Ubuntu and Google builds put the binary, in the order we try them.
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium(explicit: str | None = None) -> str:
    """Path of the Chromium binary: ``explicit``, ``$AGENTGYM_CHROMIUM``, or the first one on ``PATH``.

    Raises:
        BrowserUnavailable: None was found; the message says how to install one.
    """
    for candidate in (explicit, os.environ.get("AGENTGYM_CHROMIUM")):
        if candidate:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
            raise BrowserUnavailable(f"Chromium binary {candidate!r} does not exist or is not executable; "
                                     "fix the path or install Chromium with: apt-get install -y chromium")
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable(
        "No Chromium binary found (tried " + ", ".join(_CANDIDATES) + " on PATH). Install one with "
        "'apt-get install -y chromium' (playwright install cannot download browsers here), or point "
        "AGENTGYM_CHROMIUM at a Chromium/Chrome binary."
    )


@dataclass(frozen=True)
class BrowserConfig:
    """How the pool launches Chromium and how long it waits for it.

    Attributes:
        executable_path: Chromium binary; ``None`` finds it with :func:`find_chromium`.
        launch_args: Command-line flags for Chromium.
        headless: Run without a window (the only mode that works on a server).
        action_timeout_s: Playwright's wait for an element to become actionable. Exceeding it is the
            model's mistake (a hidden or disabled element) and gives an error observation.
        navigation_timeout_s: Wait for a page load; exceeding it gives an error observation.
        watchdog_s: An operation that has not returned after this long means the browser hung; the
            episode ends with ``end_reason="error"`` and the context is replaced.
        block_non_loopback: Also send every non-loopback request to a dead proxy, so that nothing the
            request router misses (redirect hops, service workers) can leave the machine.
    """

    executable_path: str | None = None
    launch_args: tuple[str, ...] = field(default=DEFAULT_LAUNCH_ARGS)
    headless: bool = True
    action_timeout_s: float = 5.0
    navigation_timeout_s: float = 10.0
    watchdog_s: float = 30.0
    block_non_loopback: bool = True

    def __post_init__(self) -> None:
        for name in ("action_timeout_s", "navigation_timeout_s", "watchdog_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"BrowserConfig.{name} must be a positive number of seconds, got {value!r}.")
        if self.watchdog_s <= max(self.action_timeout_s, self.navigation_timeout_s):
            raise ConfigError(
                f"BrowserConfig.watchdog_s ({self.watchdog_s}) must exceed action_timeout_s and navigation_timeout_s "
                "(a slow page is the model's problem, a hung browser is a crash); raise watchdog_s."
            )
        if isinstance(self.launch_args, str) or not all(isinstance(a, str) for a in self.launch_args):
            raise ConfigError("BrowserConfig.launch_args must be a tuple of strings such as ('--no-sandbox',).")
