"""Set-of-marks: numbered boxes over a page's interactive elements, drawn on the screenshot after capture.

Vision agents click far more reliably when each clickable element carries a number they can name
(``click_mark(7)``) instead of a pixel coordinate they must estimate. :data:`MARKS_JS` lists the visible,
interactive elements of the page in document order (read-only: it never touches the DOM or fires an
event, so the task's own reward logic is unchanged), and :func:`draw_marks` draws the boxes and numbers on
the captured pixels with Pillow. Drawing after capture was measured against injecting an overlay into the
page (``benchmarks/browser.py``): the overlay needs two more browser round trips per step (add, remove) and
lives in the page's DOM while it is shown, where it could take clicks or be seen by the page's scripts;
the Pillow drawing costs well under a millisecond.

A mark is kept only when a hit test at its centre reaches the element itself (or something inside it), so
clicking a mark's centre reaches what the box shows even under dialogs and overlapping layouts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MARKS_JS", "MAX_MARKS", "Mark", "describe_marks", "draw_marks", "parse_marks"]

#: At most this many marks per screenshot (the rest of a long page is reached by scrolling).
MAX_MARKS = 99

#: ``(limit) => [[x, y, width, height, role, name, checked], ...]`` in CSS pixels of the viewport, clipped to it.
MARKS_JS = r"""(limit) => {
  const W = window.innerWidth, H = window.innerHeight;
  const ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem', 'menuitemcheckbox',
    'menuitemradio', 'option', 'treeitem', 'switch', 'combobox', 'textbox', 'searchbox', 'slider', 'spinbutton',
    'listbox', 'gridcell']);
  const INPUT_ROLES = {checkbox: 'checkbox', radio: 'radio', button: 'button', submit: 'button', reset: 'button',
    image: 'button', range: 'slider', number: 'spinbutton', search: 'searchbox'};
  const clean = (s) => String(s || '').replace(/\s+/g, ' ').trim();
  const roleOf = (el) => {
    const explicit = (el.getAttribute('role') || '').trim().split(/\s+/)[0];
    if (ROLES.has(explicit)) return explicit;
    const tag = el.tagName.toLowerCase();
    if (tag === 'a') return 'link';
    if (tag === 'button' || tag === 'summary') return 'button';
    if (tag === 'select') return el.multiple || el.size > 1 ? 'listbox' : 'combobox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'input') {
      const type = (el.getAttribute('type') || 'text').toLowerCase();
      if (type === 'hidden') return null;
      return INPUT_ROLES[type] || 'textbox';
    }
    if (el.isContentEditable && (el.parentElement === null || !el.parentElement.isContentEditable)) return 'textbox';
    const tabindex = el.getAttribute('tabindex');
    if (el.hasAttribute('onclick') || (tabindex !== null && Number(tabindex) >= 0)) return 'clickable';
    if (getComputedStyle(el).cursor === 'pointer'
        && !(el.parentElement && getComputedStyle(el.parentElement).cursor === 'pointer')) return 'clickable';
    return null;
  };
  const nameOf = (el, role) => {
    let name = el.getAttribute('aria-label') || '';
    if (!name && el.labels && el.labels.length) name = el.labels[0].innerText;
    const tag = el.tagName.toLowerCase();
    if (!name && tag === 'input' && role === 'button') name = el.value;
    if (!name && tag !== 'input' && tag !== 'textarea' && tag !== 'select') name = el.innerText;
    if (!name) name = el.getAttribute('placeholder') || el.getAttribute('title') || el.getAttribute('alt') || '';
    if (!name && (role === 'textbox' || role === 'combobox' || role === 'searchbox' || role === 'spinbutton')) {
      let before = el.previousSibling;  // an unlabelled field: the text just before it ("Username <input>")
      while (before && !clean(before.textContent)) before = before.previousSibling;
      if (before) name = before.textContent;
    }
    name = clean(name);
    return name.length > 60 ? name.slice(0, 57) + '...' : name;
  };
  const out = [], marked = [];
  try {
    for (const el of document.body ? document.body.querySelectorAll('*') : []) {
      if (out.length >= limit) break;
      const role = roleOf(el);
      if (role === null) continue;
      if (el.tagName.toLowerCase() === 'label' && el.control) {  // a visible control carries the label's text
        const c = el.control.getBoundingClientRect();
        if (c.width >= 2 && c.height >= 2) continue;
      }
      if (el.disabled) continue;
      const r = el.getBoundingClientRect();
      const x0 = Math.max(0, r.left), y0 = Math.max(0, r.top);
      const x1 = Math.min(W, r.right), y1 = Math.min(H, r.bottom);
      if (x1 - x0 < 2 || y1 - y0 < 2) continue;
      const style = getComputedStyle(el);
      if (style.visibility !== 'visible' || Number(style.opacity) === 0) continue;
      const hit = document.elementFromPoint((x0 + x1) / 2, (y0 + y1) / 2);
      if (!hit || !(hit === el || el.contains(hit) || (el.labels && Array.from(el.labels).some((l) => l.contains(hit)))))
        continue;
      const name = nameOf(el, role);
      if (marked.some(([m, n]) => n === name && m.contains(el))) continue;  // a link inside its tab, same words
      marked.push([el, name]);
      const checked = (role === 'checkbox' || role === 'radio') ? !!el.checked : null;
      out.push([x0, y0, x1 - x0, y1 - y0, role, name, checked]);
    }
  } catch (e) {
    return out;
  }
  return out;
}"""


@dataclass(frozen=True)
class Mark:
    """One numbered element: its box in page (CSS) pixels, clipped to the viewport, and what it is.

    Attributes:
        id: The number drawn on the screenshot (1, 2, ... in document order).
        box: ``(x, y, width, height)`` in page pixels.
        role: ``button``, ``link``, ``textbox``, ``checkbox``, ... or ``clickable`` (a scripted element).
        name: Its accessible name or text (cut at 60 characters).
        checked: For checkboxes and radio buttons, whether it is checked; else None.
    """

    id: int
    box: tuple[float, float, float, float]
    role: str
    name: str
    checked: bool | None = None

    @property
    def center(self) -> tuple[float, float]:
        """The point ``click_mark`` clicks, in page pixels (the hit test of :data:`MARKS_JS` checked it)."""
        x, y, w, h = self.box
        return x + w / 2, y + h / 2

    def describe(self) -> str:
        state = "" if self.checked is None else (" (checked)" if self.checked else " (not checked)")
        name = f' "{self.name}"' if self.name else ""
        return f"[{self.id}] {self.role}{name}{state}"


def parse_marks(raw: Any) -> list[Mark]:
    """The marks :data:`MARKS_JS` returned, numbered from 1; malformed rows (a hostile page) are dropped."""
    marks: list[Mark] = []
    for row in raw if isinstance(raw, list) else []:
        if not (isinstance(row, list) and len(row) == 7):
            continue
        x, y, w, h, role, name, checked = row
        box = (x, y, w, h)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box):
            continue
        marks.append(Mark(len(marks) + 1, tuple(float(v) for v in box), str(role)[:20], str(name)[:60],  # type: ignore[arg-type]
                          checked if isinstance(checked, bool) else None))
    return marks


def describe_marks(marks: Sequence[Mark]) -> str:
    """One line per mark (``[3] button "Submit"``) for the text part of the observation."""
    return "\n".join(mark.describe() for mark in marks) if marks else "(no interactive elements marked)"


#: Box colours, cycled by mark id: saturated, distinct, readable with white digits.
_PALETTE = ((230, 25, 75), (0, 130, 200), (60, 150, 60), (145, 30, 180), (245, 130, 48), (0, 128, 128),
            (170, 110, 40), (128, 0, 0), (70, 70, 200), (200, 0, 150))


@functools.lru_cache(maxsize=8)
def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):  # Pillow < 10.1 or without FreeType: the fixed bitmap font
        return ImageFont.load_default()


@functools.lru_cache(maxsize=1024)
def _tag(label: str, size: int, colour: tuple[int, int, int]) -> np.ndarray:
    """The filled number tag of a mark as ``uint8[h, w, 3]`` (rendered once per label, size and colour)."""
    from PIL import Image, ImageDraw

    font = _font(size)
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), label, font=font)
    tag = Image.new("RGB", (right - left + 2, bottom - top + 2), colour)
    ImageDraw.Draw(tag).text((1 - left, 1 - top), label, fill=(255, 255, 255), font=font)
    pixels = np.asarray(tag, dtype=np.uint8)
    pixels.setflags(write=False)
    return pixels


def draw_marks(image: np.ndarray, marks: Sequence[Mark], *, scale: tuple[float, float] = (1.0, 1.0)) -> np.ndarray:
    """A copy of ``image`` with each mark's box outlined and its number on a filled tag at the box's corner.

    Tags are rendered once with Pillow and cached; drawing is array slicing (microseconds per mark).

    Args:
        image: ``uint8[H, W, 3]`` pixels.
        marks: The marks, with boxes in page pixels.
        scale: Image pixels per page pixel along x and y (for screenshots resized to another size).
    """
    out = np.array(image, dtype=np.uint8, copy=True)
    height, width = out.shape[:2]
    size = max(8, min(16, round(min(width, height) / 30)))
    sx, sy = scale
    for mark in marks:
        x, y, w, h = mark.box
        left = min(max(int(round(x * sx)), 0), width - 1)
        top = min(max(int(round(y * sy)), 0), height - 1)
        right = min(max(left, int(round((x + w) * sx)) - 1), width - 1)
        bottom = min(max(top, int(round((y + h) * sy)) - 1), height - 1)
        colour = _PALETTE[(mark.id - 1) % len(_PALETTE)]
        out[top, left:right + 1] = colour
        out[bottom, left:right + 1] = colour
        out[top:bottom + 1, left] = colour
        out[top:bottom + 1, right] = colour
        tag = _tag(str(mark.id), size, colour)
        tag_h, tag_w = tag.shape[:2]
        tag_y = top - tag_h if top - tag_h >= 0 and bottom - top < 2 * tag_h else top  # above small boxes
        tag_x = max(0, min(left, width - tag_w))
        visible = tag[: height - tag_y, : width - tag_x]
        out[tag_y:tag_y + visible.shape[0], tag_x:tag_x + visible.shape[1]] = visible
    return out
