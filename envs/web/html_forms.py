"""HTML form submission as a browser does it: which form a control belongs to, its data set, and its encoding."""

from __future__ import annotations

from collections.abc import Iterable

from agentgym.tools.browser.snapshot import normalize_whitespace

from agentgym.envs.web.html_dom import Element

__all__ = ["form_data", "form_encode", "form_of", "is_submit_button"]

# ---- forms -------------------------------------------------------------------------------------------------------
def form_encode(pairs: Iterable[tuple[str, str]]) -> str:
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


def form_of(element: Element) -> Element | None:
    """The form a control submits with: its nearest ``<form>`` ancestor (the ``form=`` attribute is not used)."""
    return next((a for a in element.ancestors() if a.tag == "form"), None)


def is_submit_button(element: Element) -> bool:
    """Whether activating ``element`` submits its form (a ``<button>`` defaults to type submit)."""
    if element.tag == "button":
        return element.attrs.get("type", "submit").lower() == "submit"
    return element.tag == "input" and element.input_type in ("submit", "image")


def form_data(form: Element, submitter: Element | None) -> list[tuple[str, str]]:
    """The form's data set in document order, as a browser builds it on submission (with the submitter's own
    name and value, and without the other buttons)."""
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
