"""Accessibility snapshots with stable element refs.

Playwright's ``page.aria_snapshot(mode="ai")`` renders the page as YAML with a ``[ref=...]`` on every
element the agent can act on, and ``page.locator("aria-ref=...")`` finds the element again. Playwright
prefixes refs with a per-document frame id (``e4`` on the first page, ``f2e4`` after two navigations),
which would make the same link carry a different ref depending on how the agent got to the page. We show
the main frame's refs without that prefix (``e4``; numbered in document order from ``e1`` on every new
page, stable while the page stays) and keep the mapping to Playwright's real ref for the locator.

The YAML quoting helpers are a port of Playwright's own (``packages/isomorphic/yaml.ts``), so that the
text-only browser of the shop renders pages in exactly the same format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "REF_PATTERN",
    "SELECT_ROLES",
    "TEXT_ROLES",
    "Snapshot",
    "js_string",
    "match_option",
    "normalize_refs",
    "normalize_whitespace",
    "truncate_snapshot",
    "yaml_escape_key",
    "yaml_escape_value",
    "yaml_needs_quotes",
]

REF_PATTERN = re.compile(r"\[ref=((?:f\d+)?e\d+)\]")
_DISPLAY_REF = re.compile(r"^(?:f\d+)?e\d+$")


_ROLE = re.compile(r"^\s*- '?([a-z]+)")


@dataclass(frozen=True)
class Snapshot:
    """An accessibility snapshot as shown to the model, and the refs it may use.

    Attributes:
        text: YAML lines such as ``- link "Cart" [ref=e4] [cursor=pointer]``.
        refs: Shown ref -> Playwright's ref (identity in the text-only browser).
        roles: Shown ref -> its role (``link``, ``textbox``, ``combobox``...), read from the text.
    """

    text: str
    refs: Mapping[str, str] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str, refs: Mapping[str, str] | None = None) -> Snapshot:
        """A snapshot whose roles are read from ``text`` (refs default to identity)."""
        roles: dict[str, str] = {}
        for line in text.splitlines():
            found = REF_PATTERN.search(line)
            role = _ROLE.match(line)
            if found and role:
                roles[found.group(1)] = role.group(1)
        return cls(text, dict(refs) if refs is not None else {r: r for r in roles}, roles)

    @staticmethod
    def clean_ref(ref: object) -> str:
        """``"e4"``, ``"[ref=e4]"`` and ``"ref=e4"`` all mean ``e4``."""
        text = str(ref).strip().strip("[]")
        return text.removeprefix("ref=")

    def resolve(self, ref: str) -> str | None:
        """Playwright's ref for a shown ref, or None when the page has no such ref."""
        return self.refs.get(self.clean_ref(ref))

    def require(self, ref: object, *, roles: tuple[str, ...] = (), action: str = "") -> str:
        """The shown ref, checked to exist (and to have one of ``roles``); else an ActionError for the model.

        Both browsers use this check, so a bad ref reads the same in the browser and the text-only shop.
        """
        from agentgym.tools.browser.errors import ActionError

        shown = self.clean_ref(ref) if isinstance(ref, str) else ""
        if shown not in self.refs:
            known = ", ".join(list(self.refs)[:8])
            raise ActionError(
                f"Error: there is no element [ref={str(ref)[:40]}] on the current page. Use a ref from the latest "
                "page snapshot" + (f" (for example {known})." if known else ".")
            )
        role = self.roles.get(shown, "element")
        if roles and role not in roles:
            what = {"textbox": "text field", "combobox": "drop-down list"}.get(roles[0], roles[0])
            raise ActionError(f"Error: [ref={shown}] is a {role}, not a {what}; {action}() works on "
                              f"{what}s only.")
        return shown


#: Roles that type() and select() accept.
TEXT_ROLES = ("textbox", "searchbox", "spinbutton")
SELECT_ROLES = ("combobox", "listbox")


def match_option(wanted: object, options: Sequence[tuple[str, str]], ref: object) -> str:
    """The label of the option the model meant: exact label, then exact value, then label ignoring case."""
    from agentgym.tools.browser.errors import ActionError

    text = str(wanted).strip() if isinstance(wanted, (str, int, float)) else None
    if text is not None:
        for label, value in options:
            if label == text:
                return label
        for label, value in options:
            if value == text:
                return label
        for label, _ in options:
            if label.casefold() == text.casefold():
                return label
    listed = ", ".join(repr(label) for label, _ in options[:30])
    raise ActionError(f"Error: {str(wanted)[:80]!r} is not an option of [ref={Snapshot.clean_ref(ref)}]; the options "
                      f"are {listed}.")


def normalize_refs(raw: str) -> Snapshot:
    """Strip the main frame's prefix from the refs of a ``mode="ai"`` snapshot and record the mapping.

    The main frame is the one of the first ref (the page's root element); refs inside iframes keep their
    own ``fNeM`` form, which is unique anyway.
    """
    refs: dict[str, str] = {}
    found = REF_PATTERN.findall(raw)
    if not found:
        return Snapshot.from_text(raw, refs)
    first = found[0]
    prefix = first[: first.index("e")]

    def shorten(match: re.Match[str]) -> str:
        real = match.group(1)
        shown = real[len(prefix):] if prefix and real.startswith(prefix + "e") else real
        refs[shown] = real
        return f"[ref={shown}]"

    text = REF_PATTERN.sub(shorten, raw)
    return Snapshot.from_text(text, refs)


def truncate_snapshot(text: str, max_chars: int) -> str:
    """Cut a snapshot at a line boundary and say how much was left out (the model must know)."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    cut = cut if cut > 0 else max_chars
    hidden = text[cut:].count("\n") + 1
    return f"{text[:cut]}\n[... {hidden} more lines not shown; the page is long]"


# ---- Playwright's YAML quoting, ported -------------------------------------------------------------
_WS = re.compile(r"[ \t\n\r\f\v\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+")
_JS_NUMBER = re.compile(r"^\s*(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Infinity)|0[xX][0-9a-fA-F]+|"
                        r"0[bB][01]+|0[oO][0-7]+)?\s*$")
_JS_SPACE = "[ \t\n\r\f\v\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"


def normalize_whitespace(text: str) -> str:
    """Playwright's ``normalizeWhiteSpace``: runs of whitespace become one space, ends trimmed."""
    return _WS.sub(" ", text).strip()


def _is_js_number(text: str) -> bool:
    """``!isNaN(Number(text))`` in JavaScript (the empty and all-space strings are 0, so numbers)."""
    return bool(_JS_NUMBER.match(text))


def yaml_needs_quotes(text: str) -> bool:
    """Playwright's ``yamlStringNeedsQuotes``."""
    if not text:
        return True
    if re.match(f"^{_JS_SPACE}", text) or re.search(f"{_JS_SPACE}$", text):
        return True
    if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", text):
        return True
    if text.startswith("-"):
        return True
    if re.search(f"[\n:](?:{_JS_SPACE}|$)", text):
        return True
    if re.search(f"{_JS_SPACE}#", text):
        return True
    if re.search(r"[\n\r]", text):
        return True
    if re.match(r"^[&*\],?!>|@\"'#%]", text):
        return True
    if re.search(r"[{}`]", text):
        return True
    if text.startswith("["):
        return True
    if _is_js_number(text) or text.lower() in ("y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"):
        return True
    return bool(re.match(r"^[-+]?\.(inf|nan)$", text, re.IGNORECASE))


_VALUE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def yaml_escape_value(text: str) -> str:
    """Playwright's ``yamlEscapeValueIfNeeded``: double-quote and escape when YAML needs it."""
    if not yaml_needs_quotes(text):
        return text

    def escape(match: re.Match[str]) -> str:
        char = match.group(0)
        return _VALUE_ESCAPES.get(char, f"\\x{ord(char):02x}")

    return '"' + re.sub(r'[\\"\x00-\x1f\x7f-\x9f]', escape, text) + '"'


def yaml_escape_key(text: str) -> str:
    """Playwright's ``yamlEscapeKeyIfNeeded``: single-quote the whole key when YAML needs it."""
    if not yaml_needs_quotes(text):
        return text
    return "'" + text.replace("'", "''") + "'"


def js_string(text: str) -> str:
    """``JSON.stringify`` of a string (how Playwright quotes accessible names)."""
    return json.dumps(text, ensure_ascii=False)
