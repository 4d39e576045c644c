"""The JavaScript every planner runs with: DOM look-ups and the step builders.

A planner is the body of a JS function evaluated in the task page. It reads the page (utterance, elements,
their boxes) and returns the steps a person would take next, built with these helpers:

- ``click(el)``: a click on a point of ``el`` that is really on top there (``document.elementFromPoint``), so
  overlapping widgets are not mis-clicked; an element outside the viewport becomes a ``scroll`` step that
  brings it into view (the solver plans again after any scroll).
- ``hover(el)``: move the pointer onto ``el`` (played as ``scroll(x, y, 0)``, which moves the mouse there and
  turns the wheel by nothing), for menus that open on hover.
- ``clickAt(x, y)``, ``type(text)``, ``key(name)``, ``drag(from, to)``, ``wait(ms)``.

Steps are ``{"click": [x, y]}``, ``{"type": text}``, ``{"key": name}``, ``{"scroll": [x, y, dy]}``,
``{"hover": [x, y]}``, ``{"drag": [x1, y1, x2, y2]}`` or ``{"wait": ms}``, in CSS pixels of the viewport.
A planner that returns ``[]`` means "nothing to do yet" (an animation is running); the solver waits and plans
again. ``memory`` (an object the planner may update) carries notes from one plan of the episode to the next.
"""

from __future__ import annotations

__all__ = ["PRELUDE_JS"]

PRELUDE_JS = r"""
  const VW = window.innerWidth, VH = window.innerHeight;
  const byId = (id) => document.getElementById(id);
  const $$ = (selector, root) => Array.from((root || document).querySelectorAll(selector));
  const txt = (el) => (el ? el.textContent : '').replace(/\s+/g, ' ').trim();
  // Three email tasks return {utterance, fields}; FIELDS are MiniWoB's own structured reading of the words.
  const UTTERANCE = core.getUtterance();
  const U = typeof UTTERANCE === 'string' ? UTTERANCE : UTTERANCE.utterance;
  const FIELDS = (typeof UTTERANCE === 'string' ? null : UTTERANCE.fields) || core.currentFields || {};
  const Q = Array.from(U.matchAll(/"([^"]*)"/g)).map((m) => m[1]);
  const area = byId('area');
  const shown = (el) => !!el && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
  const byText = (selector, text, root) => $$(selector, root).find((el) => txt(el) === text);
  const fail = (why) => { throw new Error(why); };
  const hits = (el, x, y) => {
    const hit = document.elementFromPoint(x, y);
    return !!hit && (hit === el || el.contains(hit));
  };
  const FRACTIONS = [0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9];
  // A viewport point where a click lands on el (or its children), or null.
  const pointOf = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0) return null;
    const clear = (x, y) => x >= 0 && y >= 0 && x < VW && y < VH && hits(el, x, y);
    for (const fy of FRACTIONS) for (const fx of FRACTIONS) {
      const x = Math.round(r.left + r.width * fx), y = Math.round(r.top + r.height * fy);
      if (clear(x, y)) return [x, y];
    }
    // Mostly covered (another widget on top): scan the whole box for a pixel that is still its own.
    const step = Math.max(1, Math.ceil(Math.sqrt(r.width * r.height / 4000)));
    for (let y = Math.ceil(r.top); y < r.bottom; y += step) for (let x = Math.ceil(r.left); x < r.right; x += step) {
      if (clear(x, y)) return [x, y];
    }
    return null;
  };
  const scrollParent = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (/(auto|scroll)/.test(s.overflowY) && p.scrollHeight > p.clientHeight + 1) return p;
    }
    return null;
  };
  // A wheel step that brings el's centre to the middle of its scroll container (or of the viewport).
  const scrollTo = (el) => {
    const r = el.getBoundingClientRect();
    const box = scrollParent(el);
    let top = 0, bottom = VH, left = 0, right = VW;
    if (box) {
      const b = box.getBoundingClientRect();
      top = Math.max(0, b.top); bottom = Math.min(VH, b.bottom);
      left = Math.max(0, b.left); right = Math.min(VW, b.right);
    }
    const cy = (top + bottom) / 2, dy = Math.round(r.top + r.height / 2 - cy);
    if (Math.abs(dy) < 2 || bottom <= top) fail('cannot reach ' + el.tagName + ' "' + txt(el).slice(0, 30) + '"');
    return {scroll: [Math.round((left + right) / 2), Math.round(cy), dy]};
  };
  const click = (el) => {
    if (!el) fail('nothing to click');
    const p = pointOf(el);
    if (p) return {click: p};
    const r = el.getBoundingClientRect();
    if (r.bottom > VH || r.top < 0 || (scrollParent(el) && r.height > 0)) return scrollTo(el);
    fail('no clickable point on ' + el.tagName + ' "' + txt(el).slice(0, 30) + '"');
  };
  // Move the pointer onto el without clicking: the agent's scroll(x, y, 0) does exactly that.
  const hover = (el) => {
    const p = el && pointOf(el);
    if (!p) fail('nothing to hover');
    return {hover: p};
  };
  const clickAt = (x, y) => ({click: [Math.round(x), Math.round(y)]});
  const type = (text) => ({type: String(text)});
  const key = (name) => ({key: name});
  const wait = (ms) => ({wait: ms});
  const drag = (from, to) => ({drag: [Math.round(from[0]), Math.round(from[1]), Math.round(to[0]), Math.round(to[1])]});
  const centre = (el) => { const r = el.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; };
  // Click a text field and type into it (replacing what it holds), unless it already holds the text.
  const fill = (el, text) => (el.value === String(text) ? []
    : el.value ? [click(el), key('Control+a'), type(text)] : [click(el), type(text)]);
"""
