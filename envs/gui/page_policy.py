"""The Content-Security-Policy each served MiniWoB page gets: its own scripts run, injected markup does not.

Several MiniWoB pages copy what the agent types into ``innerHTML`` (the ``terminal`` task echoes each command
line that way). Without a policy, typing ``<img src=x onerror=core.endEpisode(1)>`` and pressing Enter runs
that handler in the page, ends the episode with the full reward and never solves the task. The page's reward
lives in the same JavaScript realm as anything injected, so the only sound place to stop this is the browser:
the policy allows the page's own script files (``'self'``) and, by SHA-256 hash (CSP Level 3, W3C), exactly the
inline scripts, inline event handlers and ``javascript:`` links written in the page's HTML file. Anything the
agent injects later has no matching hash and is refused by Chromium before it runs.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["EVAL_SCRIPTS", "content_security_policy", "inline_script_hashes"]

#: Script files that build functions from strings (``new Function``) on static page data: jscolor reads its
#: options from the ``data-jscolor`` attribute that way. Pages that load one also get ``'unsafe-eval'``.
EVAL_SCRIPTS = ("jscolor.min.js", "jscolor.js")
_URL_ATTRIBUTES = ("href", "src", "action", "formaction")


class _InlineScripts(HTMLParser):
    """Collects the text of inline ``<script>`` elements, inline handlers and ``javascript:`` URLs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[str] = []
        self.handlers: list[str] = []
        self.needs_eval = False
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name.startswith("on"):
                self.handlers.append(value)
            elif name in _URL_ATTRIBUTES and value.strip().lower().startswith("javascript:"):
                self.handlers.append(value)
        if tag == "script":
            source = dict(attrs).get("src")
            if source is None:
                self._open = []
            elif source.rsplit("/", 1)[-1] in EVAL_SCRIPTS:
                self.needs_eval = True

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._open is not None:
            self.scripts.append("".join(self._open))
            self._open = None


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def inline_script_hashes(html: str) -> tuple[list[str], list[str], bool]:
    """``(script hashes, handler hashes, needs 'unsafe-eval')`` of one HTML document's own inline code.

    The browser hashes an inline script's text after newline normalisation (CRLF and CR become LF), so the
    text is normalised the same way before hashing.
    """
    parser = _InlineScripts()
    parser.feed(html.replace("\r\n", "\n").replace("\r", "\n"))
    parser.close()
    if parser._open is not None:  # an unterminated <script> runs to the end of the file
        parser.scripts.append("".join(parser._open))
    scripts = sorted({_sha256(s) for s in parser.scripts})
    handlers = sorted({_sha256(h) for h in parser.handlers})
    return scripts, handlers, parser.needs_eval


def _decodings(raw: bytes) -> list[str]:
    """The texts a browser may read from ``raw``: UTF-8, or windows-1252 for a page that declares no charset.

    The server sends no charset, and Chromium decodes such a page by its declared ``<meta charset>`` or else by
    guessing; hashing both readings keeps the page's own scripts running either way (a hash only ever allows
    the one text that produces it). Bytes that windows-1252 leaves undefined map to the same code point, as the
    WHATWG Encoding Standard says.
    """
    latin = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) if 0x80 <= b <= 0x9F else chr(b)
                    for b in raw)
    return list(dict.fromkeys([raw.decode("utf-8", errors="replace"), latin]))


@functools.lru_cache(maxsize=512)
def _policy_for(path: str, mtime_ns: int) -> str:
    scripts: list[str] = []
    handlers: list[str] = []
    needs_eval = False
    for html in _decodings(Path(path).read_bytes()):
        more_scripts, more_handlers, eval_here = inline_script_hashes(html)
        scripts += [h for h in more_scripts if h not in scripts]
        handlers += [h for h in more_handlers if h not in handlers]
        needs_eval = needs_eval or eval_here
    sources = ["'self'", *scripts]
    if handlers:
        sources += ["'unsafe-hashes'", *handlers]
    if needs_eval:
        sources.append("'unsafe-eval'")
    return "; ".join([
        "script-src " + " ".join(sources),
        "object-src 'none'",
        "base-uri 'self'",
        "frame-src 'self'",  # no data:/blob: frames built from typed markup
        "form-action 'self'",
    ])


def content_security_policy(path: Path) -> str:
    """The policy header for the HTML file at ``path`` (cached per file version)."""
    return _policy_for(str(path), path.stat().st_mtime_ns)
