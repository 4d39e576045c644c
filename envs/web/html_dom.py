"""A small DOM for static HTML: elements, the parser that builds them, and a parsed page (:class:`Document`).

Enough of the HTML model for :mod:`agentgym.envs.web.aria_snapshot` and :mod:`agentgym.envs.web.text_browser`:
void elements, attributes, text, and a document's elements in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

from agentgym.tools.browser.snapshot import normalize_whitespace

__all__ = ["Document", "Element"]

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                   "wbr"})


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
