"""Drive a real Chromium for web and GUI environments: a pool of Playwright contexts, guarded to 127.0.0.1.

Usage::

    from agentgym.tools.browser import default_pool

    session = default_pool().session(viewport=(1280, 720))
    session.start("/", allowed_origins=["http://127.0.0.1:8765"])
    print(session.snapshot().text)      # accessibility snapshot with refs such as [ref=e4]
    session.click("e4")                 # web actions by ref: click, type, select, scroll, goto, back
    session.mouse_click(10, 20)         # GUI actions by pixel: mouse_click, keyboard_type, press, wheel, drag
    image = session.screenshot()        # uint8[H, W, 3]
    view = session.observe("() => document.title", aria=True)  # script value + pixels + tree, one call

Set-of-marks (numbered boxes over interactive elements, drawn on the pixels) lives in
:mod:`agentgym.tools.browser.marks`.

The pool launches the system Chromium (``apt-get install -y chromium``; ``playwright install`` cannot
download here) with ``pip install 'agentgym[web]'``. Importing this package does not import Playwright.
"""

from agentgym.tools.browser.config import (
    DEFAULT_LAUNCH_ARGS,
    BrowserConfig,
    find_chromium,
)
from agentgym.tools.browser.errors import (
    ActionError,
    BrowserCrashed,
    BrowserUnavailable,
)
from agentgym.tools.browser.guard import UrlGuard
from agentgym.tools.browser.snapshot import Snapshot, normalize_refs
from agentgym.utils.lazy import lazy_attributes

__all__ = [
    "DEFAULT_LAUNCH_ARGS",
    "ActionError",
    "BrowserConfig",
    "BrowserCrashed",
    "BrowserPool",
    "BrowserSession",
    "BrowserUnavailable",
    "Snapshot",
    "UrlGuard",
    "default_pool",
    "find_chromium",
    "normalize_refs",
]


# The pool imports numpy and (lazily) Playwright; load it only when asked for.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "BrowserPool": "agentgym.tools.browser.pool",
    "BrowserSession": "agentgym.tools.browser.page_session",
    "default_pool": "agentgym.tools.browser.pool",
})
