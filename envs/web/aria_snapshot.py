"""A page as Chromium's accessibility snapshot: Playwright's ``page.aria_snapshot(mode="ai")``, for static HTML.

Same roles, names, ``[ref=eN]`` numbering, ``[active]`` and ``[cursor=pointer]`` markers, ``/url:`` lines and
YAML quoting. The rendering follows Playwright's ``generateAriaTree`` and its ``ai`` distillation plugins
(``mergeStringChildren``, ``inlineTextIntoGeneric``, ``removeNameRepeatingChild``,
``unwrapSingleChildGenerics``), restricted to what static HTML can produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentgym.tools.browser.snapshot import (
    Snapshot,
    js_string,
    normalize_whitespace,
    yaml_escape_key,
    yaml_escape_value,
)

from agentgym.envs.web.html_dom import Document, Element

__all__ = ["render_snapshot"]

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
