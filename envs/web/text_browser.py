"""A browser without a browser: the shop's pages rendered as Chromium's accessibility snapshot, in-process.

RL on web tasks needs many cheap episodes; launching Chromium for each costs seconds and a page action
tens of milliseconds. :class:`TextBrowser` calls the app function directly, parses the HTML, keeps form
state, cookies and history like a browser, and renders the page in the format of Playwright's
``page.aria_snapshot(mode="ai")`` (same roles, names, ``[ref=eN]`` numbering, ``[active]`` and
``[cursor=pointer]`` markers, ``/url:`` lines and YAML quoting), so an agent trained here sees the same
observations in the real browser. It is exact for the HTML the shop produces (plain semantic tags, no
scripts or CSS that changes roles, checked page by page against Chromium in the tests); it is not a
general-purpose HTML engine.

The rendering follows Playwright's ``generateAriaTree`` and its ``ai`` distillation plugins
(``mergeStringChildren``, ``inlineTextIntoGeneric``, ``removeNameRepeatingChild``,
``unwrapSingleChildGenerics``), restricted to what static HTML can produce. The parts live in their own modules:
the DOM in :mod:`agentgym.envs.web.html_dom`, the snapshot in :mod:`agentgym.envs.web.aria_snapshot` and form
submission in :mod:`agentgym.envs.web.html_forms`; this one holds the browser (navigation, state, actions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentgym.envs.web.app import Request, Response
from agentgym.tools.browser.errors import ActionError
from agentgym.tools.browser.guard import UrlGuard
from agentgym.tools.browser.snapshot import SELECT_ROLES, TEXT_ROLES, Snapshot, match_option, normalize_whitespace

from agentgym.envs.web.aria_snapshot import render_snapshot
from agentgym.envs.web.html_dom import Document, Element
from agentgym.envs.web.html_forms import form_data, form_encode, form_of, is_submit_button

__all__ = ["Document", "Element", "render_snapshot", "TextBrowser"]

MAX_REDIRECTS = 10


@dataclass(frozen=True)
class _HistoryEntry:
    url: str
    dirty: tuple[tuple[int, str, str], ...]  # (control index in document order, name, value) typed by the user


# ---- the browser ---------------------------------------------------------------------------------------------
class TextBrowser:
    """A browser for one app, without HTTP: cookies, forms, redirects, history and the URL guard.

    Args:
        fetch: The app's request function (``ShopApp.handle``).
        origin: The origin the app pretends to live at (only used to resolve and check URLs).
    """

    def __init__(self, fetch: Callable[[Request], Response], origin: str = "http://127.0.0.1:8000") -> None:
        self._fetch = fetch
        self._guard = UrlGuard([origin])
        self._cookies: dict[str, str] = {}
        self._doc: Document | None = None
        self._history: list[_HistoryEntry] = []
        self._snapshot = Snapshot("")

    # ---- lifecycle ---------------------------------------------------------------------------------------------
    def start(self, url: str, *, allowed_origins: Sequence[str] | None = None,
              cookies: Iterable[dict[str, Any]] = ()) -> None:
        """Begin an episode on ``url`` with a fresh cookie jar and history."""
        if allowed_origins:
            self._guard = UrlGuard(allowed_origins)
        self._cookies = {str(c["name"]): str(c["value"]) for c in cookies}
        self._history = []
        self._doc = None
        self._snapshot = Snapshot("")
        self._navigate("GET", self._guard.resolve(url), b"")

    def close(self) -> None:
        self._doc = None

    def notices(self) -> list[str]:
        return []

    @property
    def url(self) -> str:
        return self._doc.url if self._doc is not None else "about:blank"

    def title(self) -> str:
        return self._doc.title if self._doc is not None else ""

    def snapshot(self) -> Snapshot:
        self._snapshot = render_snapshot(self._require_doc())
        return self._snapshot

    # ---- actions -----------------------------------------------------------------------------------------------
    def click(self, ref: str) -> None:
        doc, element = self._element(ref)
        if element.tag == "a" and "href" in element.attrs:
            self._follow(self._guard.resolve(element.attrs["href"], doc.url))
            return
        if is_submit_button(element):
            doc.active = element
            form = form_of(element)
            if form is not None and "disabled" not in element.attrs:
                self._submit(form, element)
            return
        focusable = element.tag in ("input", "select", "textarea", "button") or "tabindex" in element.attrs
        doc.active = element if focusable else None

    def type(self, ref: str, text: str, *, submit: bool = False) -> None:
        doc, element = self._element(ref, roles=TEXT_ROLES, action="type")
        element.value = text
        element.dirty = True
        doc.active = element
        if submit:
            form = form_of(element)
            if form is not None:
                default = next((e for e in form.iter() if is_submit_button(e)), None)
                self._submit(form, default)

    def select(self, ref: str, option: str) -> None:
        _doc, element = self._element(ref, roles=SELECT_ROLES, action="select")
        options = element.options()
        labels = [normalize_whitespace(o.text()) for o in options]
        pairs = [(label, o.attrs.get("value", label)) for label, o in zip(labels, options, strict=True)]
        label = match_option(option, pairs, ref)
        element.selected = [p[0] for p in pairs].index(label)
        element.dirty = True

    def scroll(self, direction: str) -> None:
        if direction not in ("up", "down", "left", "right"):
            raise ActionError(f"Error: scroll direction must be one of up, down, left, right, got "
                              f"{str(direction)[:40]!r}.")
        self._require_doc()

    def goto(self, url: str) -> None:
        doc = self._require_doc()
        if not isinstance(url, str) or not url.strip():
            raise ActionError("Error: goto needs a URL such as '/' or a full http://127.0.0.1:PORT/... address.")
        target = self._guard.resolve(url, doc.url)
        refusal = self._guard.refusal(target)
        if refusal:
            raise ActionError(f"Error: navigation refused: {refusal}.")
        self._follow(target)

    def back(self) -> None:
        self._require_doc()
        if len(self._history) < 2:
            raise ActionError("Error: there is no previous page to go back to.")
        self._history.pop()
        entry = self._history.pop()
        self._navigate("GET", entry.url, b"", save_state=False)
        doc = self._require_doc()
        controls = [e for e in doc.root.iter() if e.tag in ("input", "select", "textarea")]
        for index, name, value in entry.dirty:  # browsers restore what the user had typed or chosen
            if index < len(controls) and controls[index].attrs.get("name", "") == name:
                control = controls[index]
                if control.tag == "select":
                    labels = [normalize_whitespace(o.text()) for o in control.options()]
                    control.selected = labels.index(value) if value in labels else control.selected
                else:
                    control.value = value
                control.dirty = True

    # ---- internals ---------------------------------------------------------------------------------------------
    def _require_doc(self) -> Document:
        if self._doc is None:
            raise ActionError("Error: no page is open; the episode has not started (call reset()).")
        return self._doc

    def _element(self, ref: object, *, roles: tuple[str, ...] = (), action: str = "") -> tuple[Document, Element]:
        doc = self._require_doc()
        shown = self._snapshot.require(ref, roles=roles, action=action)
        element = doc.by_ref.get(shown)
        if element is None:
            raise ActionError(f"Error: [ref={shown}] is no longer on the page; use a ref from the latest snapshot.")
        return doc, element

    def _follow(self, url: str) -> None:
        refusal = self._guard.refusal(url)
        if refusal:
            raise ActionError(f"Error: navigation refused: {refusal}. You are still on {_path_of(self.url)}.")
        self._navigate("GET", url, b"")

    def _submit(self, form: Element, submitter: Element | None) -> None:
        doc = self._require_doc()
        override = submitter.attrs if submitter is not None else {}
        action = override.get("formaction") or form.attrs.get("action") or doc.url
        method = (override.get("formmethod") or form.attrs.get("method") or "get").upper()
        target = self._guard.resolve(action, doc.url)
        refusal = self._guard.refusal(target)
        if refusal:
            raise ActionError(f"Error: navigation refused: {refusal}. You are still on {_path_of(self.url)}.")
        data = form_encode(form_data(form, submitter))
        if method == "POST":
            self._navigate("POST", target, data.encode("ascii"))
        else:
            self._navigate("GET", target.split("?", 1)[0].split("#", 1)[0] + "?" + data, b"")

    def _save_dirty(self) -> None:
        if self._doc is None or not self._history:
            return
        controls = [e for e in self._doc.root.iter() if e.tag in ("input", "select", "textarea")]
        dirty = []
        for index, control in enumerate(controls):
            if control.dirty:
                if control.tag == "select":
                    options = control.options()
                    chosen = options[control.selected] if 0 <= control.selected < len(options) else None
                    value = normalize_whitespace(chosen.text()) if chosen is not None else ""
                else:
                    value = control.value
                dirty.append((index, control.attrs.get("name", ""), value))
        last = self._history[-1]
        self._history[-1] = _HistoryEntry(last.url, tuple(dirty))

    def _navigate(self, method: str, url: str, body: bytes, *, save_state: bool = True) -> None:
        for _ in range(MAX_REDIRECTS):
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            cookie = "; ".join(f"{k}={v}" for k, v in self._cookies.items())
            response = self._fetch(Request.from_raw(method, target, body, cookie))
            location = response.location
            if 300 <= response.status < 400 and location:
                next_url = self._guard.resolve(location, url)
                refusal = self._guard.refusal(next_url)
                if refusal:
                    raise ActionError(f"Error: navigation refused: {refusal}. You are still on {_path_of(self.url)}.")
                url, method, body = next_url, "GET", b""
                continue
            if save_state:
                self._save_dirty()
            self._doc = Document(url, response.body)
            self._history.append(_HistoryEntry(url, ()))
            return
        raise ActionError("Error: the page redirected too many times.")


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
