"""Whether this machine can run the browser tests: the system Chromium plus Playwright."""

from __future__ import annotations

import pytest

from agentgym.tools.browser import BrowserUnavailable
from agentgym.tools.browser.config import find_chromium

try:
    find_chromium()
    import playwright  # noqa: F401

    HAVE_BROWSER = True
except (BrowserUnavailable, ImportError):
    HAVE_BROWSER = False

needs_browser = pytest.mark.skipif(not HAVE_BROWSER, reason="needs Chromium (apt-get install chromium) and playwright")
