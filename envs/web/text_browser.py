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
``unwrapSingleChildGenerics``), restricted to what static HTML can produce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

from agentgym.envs.web.app import Request, Response
from agentgym.tools.browser.errors import ActionError
from agentgym.tools.browser.guard import UrlGuard
from agentgym.tools.browser.snapshot import (
    SELECT_ROLES,
    TEXT_ROLES,
    Snapshot,
    js_string,
    match_option,
    normalize_whitespace,
    yaml_escape_key,
    yaml_escape_value,
)

__all__ = ["TextBrowser", "render_snapshot"]

MAX_REDIRECTS = 10
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                   "wbr"})
_HIDDEN = frozenset({"head", "script", "style", "template", "title", "meta", "link", "noscript"})
_INLINE = frozenset({
    "a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "dfn", "em", "i", "kbd", "label", "mark", "q", "s", "samp",
    "small", "span", "strong", "sub", "sup", "time", "u", "var", "font",
})
_INLINE_BLOCK = frozenset({"button", "select", "input", "textarea", "img"})
_NAME_FROM_CONTENT = frozenset({
    "button", "cell", "checkbox", "columnheader", "gridcell", "heading", "link", "menuitem", "menuitemcheckbox",
    "menuitemradio", "option", "radio", "row", "rowheader", "switch", "tab", "tooltip", "treeitem",
})
_LANDMARK_SCOPES = frozenset(["article", "aside", "main", "nav", "section"])


# ---- a small DOM ---------------------------------------------------------------------------------------
@dataclass(eq=False)
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)
    parent: Element | None = None
    value: str = ""
    dirty: bool = False
    selected: int = -1
    aria_ref: tuple[str, str, str] | None = None

    def iter(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def ancestors(self) -> Iterator[Element]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    @property
    def input_type(self) -> str:
        return self.attrs.get("type", "text").lower() if self.tag == "input" else ""

    def options(self) -> list[Element]:
        return [e for e in self.iter() if e.tag == "option"]

    def text(self) -> str:
        """Text content (all descendant text)."""
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self._stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        parent = self._stack[-1]
        if tag in ("p", "li", "option") and parent.tag == tag:  # implied end tags
            self._stack.pop()
            parent = self._stack[-1]
        element = Element(tag, {k: (v if v is not None else "") for k, v in attrs}, parent=parent)
        parent.children.append(element)
        if tag not in _VOID:
            self._stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID and self._stack[-1].tag == tag:
            self._stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._stack) - 1, 0, -1):
            if self._stack[index].tag == tag:
                del self._stack[index:]
                return

    def handle_data(self, data: str) -> None:
        self._stack[-1].children.append(data)


class Document:
    """A parsed page with its live form state, focus and ref numbering."""

    def __init__(self, url: str, html: str) -> None:
        parser = _Parser()
        parser.feed(html)
        parser.close()
        self.url = url
        self.root = parser.root
        self.body = next((e for e in self.root.iter() if e.tag == "body"), self.root)
        self.title = normalize_whitespace(next((e.text() for e in self.root.iter() if e.tag == "title"), ""))
        self.active: Element | None = None
        self.last_ref = 0
        self.by_ref: dict[str, Element] = {}
        for element in self.root.iter():
            if element.tag == "input":
                element.value = element.attrs.get("value", "")
            elif element.tag == "textarea":
                element.value = element.text()
            elif element.tag == "select":
                options = element.options()
                chosen = [i for i, o in enumerate(options) if "selected" in o.attrs]
                element.selected = chosen[-1] if chosen else (0 if options else -1)

    def forms(self) -> list[Element]:
        return [e for e in self.root.iter() if e.tag == "form"]


# ---- roles and names (Playwright's getAriaRole / getElementAccessibleName, for static HTML) ---------------
def _role(element: Element) -> str | None:
    explicit = element.attrs.get("role", "").split()
    if explicit:
        return explicit[0]
    tag = element.tag
    if tag == "a":
        return "link" if "href" in element.attrs else None
    if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
        return "heading"
    if tag in ("header", "footer"):
        scoped = any(a.tag in _LANDMARK_SCOPES for a in element.ancestors())
        return None if scoped else ("banner" if tag == "header" else "contentinfo")
    if tag in ("form", "section"):
        return ("form" if tag == "form" else "region") if _aria_label(element) else None
    if tag == "input":
        kind = element.input_type
        if kind in ("submit", "button", "reset", "image"):
            return "button"
        return {"checkbox": "checkbox", "radio": "radio", "search": "searchbox", "number": "spinbutton",
                "range": "slider"}.get(kind, "textbox")
    if tag == "select":
        multiple = "multiple" in element.attrs or int(element.attrs.get("size", "1") or 1) > 1
        return "listbox" if multiple else "combobox"
    if tag == "img":
        return "presentation" if element.attrs.get("alt") == "" else "img"
    return {"nav": "navigation", "main": "main", "aside": "complementary", "article": "article", "p": "paragraph",
            "ul": "list", "ol": "list", "li": "listitem", "button": "button", "option": "option",
            "textarea": "textbox", "table": "table", "tr": "row", "td": "cell", "th": "columnheader",
            "thead": "rowgroup", "tbody": "rowgroup", "tfoot": "rowgroup", "hr": "separator", "strong": "strong",
            "em": "emphasis", "dialog": "dialog", "fieldset": "group", "blockquote": "blockquote",
            "code": "code"}.get(tag)


def _aria_label(element: Element) -> str:
    return element.attrs.get("aria-label", "").strip()


def _display(element: Element) -> str:
    if element.tag in _INLINE:
        return "inline"
    if element.tag in _INLINE_BLOCK:
        return "inline-block"
    return "block"


def _text_alternative(element: Element) -> str:
    parts: list[str] = []
    for child in element.children:
        if isinstance(child, str):
            parts.append(child)
        elif child.tag not in _HIDDEN and not _hidden(child):
            pad = "" if _display(child) == "inline" else " "
            parts.append(pad + (_aria_label(child) or _text_alternative(child)) + pad)
    return "".join(parts)


def _name(element: Element, role: str) -> str:
    label = _aria_label(element)
    if label:
        return label
    if element.tag == "input" and element.input_type in ("submit", "reset", "button"):
        return element.attrs.get("value") or {"submit": "Submit", "reset": "Reset"}.get(element.input_type, "")
    if element.tag == "img":
        return element.attrs.get("alt", "")
    if element.tag in ("input", "select", "textarea"):
        for ancestor in element.ancestors():
            if ancestor.tag == "label":
                return _text_alternative(ancestor)
        return element.attrs.get("title", "") or element.attrs.get("placeholder", "")
    if role in _NAME_FROM_CONTENT:
        return _text_alternative(element)
    return element.attrs.get("title", "")


def _hidden(element: Element) -> bool:
    if element.tag in _HIDDEN or "hidden" in element.attrs or element.attrs.get("aria-hidden") == "true":
        return True
    return element.tag == "input" and element.input_type == "hidden"


def _has_box(element: Element) -> bool:
    """Whether the element takes space on screen (Chromium: a non-empty bounding box)."""
    if element.tag in _INLINE_BLOCK or element.tag in ("br", "hr"):
        return True
    for child in element.children:
        if isinstance(child, str):
            if child.strip():
                return True
        elif not _hidden(child) and _has_box(child):
            return True
    return False


# ---- the aria tree ----------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Node:
    role: str
    name: str = ""
    children: list[_Node | str] = field(default_factory=list)
    props: dict[str, str] = field(default_factory=dict)
    ref: str = ""
    pointer: bool = False
    active: bool = False
    inline: bool = False
    level: int = 0
    checked: bool = False
    selected: bool = False
    disabled: bool = False


def _to_node(doc: Document, element: Element) -> _Node | None:
    role = _role(element) or "generic"
    if role in ("presentation", "none"):
        return None
    inline = _display(element) == "inline"
    if role == "generic" and inline and len(element.children) == 1 and isinstance(element.children[0], str):
        return None
    name = normalize_whitespace(_name(element, role))
    node = _Node(role, name, inline=inline, active=element is (doc.active or doc.body))
    in_select = any(a.tag == "select" for a in element.ancestors())
    if _has_box(element) and not in_select:
        cached = element.aria_ref
        if cached is None or cached[0] != role or cached[1] != name:
            doc.last_ref += 1
            cached = element.aria_ref = (role, name, f"e{doc.last_ref}")
        node.ref = cached[2]
        doc.by_ref[node.ref] = element
        node.pointer = role == "link" or any(a.tag == "a" and "href" in a.attrs for a in element.ancestors())
    if role == "heading":
        node.level = int(element.tag[1]) if element.tag[:1] == "h" and element.tag[1:].isdigit() else 2
    if role in ("checkbox", "radio"):
        node.checked = "checked" in element.attrs
    if role == "option":
        select = next((a for a in element.ancestors() if a.tag == "select"), None)
        node.selected = select is not None and select.options().index(element) == select.selected
    if element.tag in ("button", "input", "select", "textarea", "option") and "disabled" in element.attrs:
        node.disabled = True
    if element.tag in ("input", "textarea") and element.input_type not in ("checkbox", "radio", "file"):
        node.children = [element.value]
    return node


def _visit(doc: Document, parent: _Node, child: Element | str) -> None:
    if isinstance(child, str):
        if parent.role != "textbox" and child:
            parent.children.append(child)
        return
    if _hidden(child):
        return
    node = _to_node(doc, child)
    if node is not None:
        parent.children.append(node)
    target = node or parent
    block = " " if _display(child) != "inline" or child.tag == "br" else ""
    if block:
        target.children.append(block)
    if child.tag not in ("input", "textarea"):
        for grandchild in child.children:
            _visit(doc, target, grandchild)
    if block:
        target.children.append(block)
    if len(target.children) == 1 and target.name == target.children[0]:
        target.children = []
    if node is not None and node.role == "link" and "href" in child.attrs:
        node.props["url"] = child.attrs["href"]


# ---- Playwright's "ai" distillation plugins -------------------------------------------------------------
def _merge_strings(node: _Node) -> None:
    children: list[_Node | str] = []
    buffer: list[str] = []

    def flush() -> None:
        if buffer:
            text = normalize_whitespace("".join(buffer))
            if text:
                children.append(text)
            buffer.clear()

    for child in node.children:
        if isinstance(child, str):
            buffer.append(child)
        else:
            flush()
            children.append(child)
    flush()
    node.children = children
    if len(node.children) == 1 and node.children[0] == node.name:
        node.children = []


def _inline_text_into_generic(node: _Node) -> None:
    if node.role != "generic" or node.props or len(node.children) != 1 or isinstance(node.children[0], str):
        return
    child = node.children[0]
    if child.role != "generic" or child.name or child.active or child.props:
        return
    if len(child.children) == 1 and isinstance(child.children[0], str):
        node.children = [child.children[0]]


def _removes_name_repeating_child(node: _Node, parent: _Node | None) -> bool:
    if parent is None or not parent.name or node.role != "generic" or node.active or node.props:
        return False
    single = node.children[0] if len(node.children) == 1 and isinstance(node.children[0], str) else None
    text = (None if node.children else node.name) if node.name else single
    return bool(text) and text == parent.name


def _unwraps(node: _Node, ancestors: Sequence[_Node]) -> bool:
    if node.role != "generic" or node.name or len(node.children) > 1:
        return False
    if not all(not isinstance(c, str) and c.ref for c in node.children):
        return False
    click_root = bool(node.ref) and node.pointer and not any(a.ref and a.pointer for a in ancestors)
    return not (not node.children and click_root)


def _distill(node: _Node, ancestors: list[_Node]) -> None:
    children: list[_Node | str] = []
    ancestors.append(node)
    for child in node.children:
        if isinstance(child, str):
            children.append(child)
            continue
        _distill(child, ancestors)
        _merge_strings(child)
        if child.role == "img" and not child.name and not child.children:
            continue
        _inline_text_into_generic(child)
        if _removes_name_repeating_child(child, node):
            continue
        if _unwraps(child, ancestors):
            children.extend(child.children)
            continue
        children.append(child)
    ancestors.pop()
    node.children = children


# ---- YAML rendering (Playwright's renderAriaSnapshotAsYaml) ---------------------------------------------------
def _key(node: _Node, pointer_allowed: bool) -> str:
    key = node.role
    if node.name and len(node.name) <= 900:
        key += " " + js_string(node.name)
    if node.checked:
        key += " [checked]"
    if node.disabled:
        key += " [disabled]"
    if node.active:
        key += " [active]"
    if node.level:
        key += f" [level={node.level}]"
    if node.selected:
        key += " [selected]"
    if node.ref:
        key += f" [ref={node.ref}]"
        if pointer_allowed and node.pointer:
            key += " [cursor=pointer]"
    return key


def _render(node: _Node | str, depth: int, lines: list[str], pointer_allowed: bool) -> None:
    pad = "  " * depth
    if isinstance(node, str):
        lines.append(f"{pad}- text: {yaml_escape_value(node)}")
        return
    key = pad + "- " + yaml_escape_key(_key(node, pointer_allowed))
    props = list(node.props.items())
    single = node.children[0] if len(node.children) == 1 and isinstance(node.children[0], str) else None
    if single is None and not props and not node.children:
        lines.append(key)
    elif single is not None and not props:
        lines.append(f"{key}: {yaml_escape_value(single)}")
    else:
        lines.append(key + ":")
        for name, value in props:
            lines.append(f"{pad}  - /{name}: {yaml_escape_value(value)}")
        inner_pointer = pointer_allowed and not (node.ref and node.pointer)
        if single is not None:
            lines.append(f"{pad}  - text: {yaml_escape_value(single)}")
        else:
            for child in node.children:
                _render(child, depth + 1, lines, inner_pointer)


def render_snapshot(doc: Document) -> Snapshot:
    """The page as Playwright's ``aria_snapshot(mode="ai")`` renders it (refs stable within the page)."""
    doc.by_ref = {}
    root = _Node("fragment")
    _visit(doc, root, doc.body)
    _distill(root, [])
    _merge_strings(root)
    lines: list[str] = []
    for child in root.children:
        _render(child, 0, lines, True)
    return Snapshot.from_text("\n".join(lines))


# ---- forms -------------------------------------------------------------------------------------------------------
def _form_encode(pairs: Iterable[tuple[str, str]]) -> str:
    """``application/x-www-form-urlencoded`` as browsers serialise it (the URL standard's byte set)."""

    def enc(text: str) -> str:
        out = []
        for byte in text.encode("utf-8"):
            char = chr(byte)
            if char.isascii() and (char.isalnum() or char in "*-._"):
                out.append(char)
            elif char == " ":
                out.append("+")
            else:
                out.append(f"%{byte:02X}")
        return "".join(out)

    return "&".join(f"{enc(k)}={enc(v)}" for k, v in pairs)


def _form_of(element: Element) -> Element | None:
    return next((a for a in element.ancestors() if a.tag == "form"), None)


def _is_submit_button(element: Element) -> bool:
    if element.tag == "button":
        return element.attrs.get("type", "submit").lower() == "submit"
    return element.tag == "input" and element.input_type in ("submit", "image")


def _form_data(form: Element, submitter: Element | None) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for element in form.iter():
        name = element.attrs.get("name")
        if not name or "disabled" in element.attrs:
            continue
        if element.tag == "input":
            kind = element.input_type
            if kind in ("submit", "image", "button", "reset", "file"):
                if element is submitter:
                    pairs.append((name, element.attrs.get("value", "")))
                continue
            if kind in ("checkbox", "radio") and "checked" not in element.attrs:
                continue
            pairs.append((name, element.value or ("on" if kind in ("checkbox", "radio") else "")))
        elif element.tag == "textarea":
            pairs.append((name, element.value))
        elif element.tag == "select":
            options = element.options()
            if 0 <= element.selected < len(options):
                option = options[element.selected]
                pairs.append((name, option.attrs.get("value", normalize_whitespace(option.text()))))
        elif element.tag == "button" and element is submitter:
            pairs.append((name, element.attrs.get("value", "")))
    return pairs


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
        if _is_submit_button(element):
            doc.active = element
            form = _form_of(element)
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
            form = _form_of(element)
            if form is not None:
                default = next((e for e in form.iter() if _is_submit_button(e)), None)
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
        data = _form_encode(_form_data(form, submitter))
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
