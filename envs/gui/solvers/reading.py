"""Planners for the reading tasks: tables, words, arithmetic, shapes, grids, cards, guessing.

Each value is the body of a JS function run with :data:`~.prelude.PRELUDE_JS`; it returns the next steps.
Shapes are read as drawn (SVG tag, fill colour, size, glyph), cards and guesses only once shown on screen;
``memory`` carries what was seen between plans.
"""

from __future__ import annotations

__all__ = ["PLANNERS"]

# The shapes of MiniWoB's shape grids (common/shapes.js) as a person would describe them, and the matcher
# for descriptions like "large red circle", "small item", "blue letter", "digit" or "k".
_SHAPES_JS = r"""
  const COLORS = ['red', 'green', 'blue', 'aqua', 'black', 'magenta', 'yellow'];
  const GEOMETRY = {rect: 'rectangle', circle: 'circle', polygon: 'triangle'};
  const readShapes = (svg) => Array.from(svg.children).filter((el) => el.tagName === 'text' || el.tagName in GEOMETRY)
    .map((el) => {
      const box = el.getBBox();
      const glyph = el.tagName === 'text' ? el.textContent : null;
      const big = glyph !== null ? parseFloat(el.getAttribute('font-size')) > 15 : Math.max(box.width, box.height) > 15;
      return {el, color: el.getAttribute('fill'), size: big ? 'large' : 'small',
              type: glyph === null ? 'shape' : /\d/.test(glyph) ? 'digit' : 'letter',
              text: glyph === null ? GEOMETRY[el.tagName] : glyph};
    });
  const describes = (desc) => {
    const words = desc.trim().split(' '), what = words[words.length - 1];
    const size = words.find((w) => w === 'large' || w === 'small');
    const color = words.slice(0, -1).find((w) => COLORS.includes(w));
    return (s) => (!size || s.size === size) && (!color || s.color === color) &&
      (what === 'item' || s.text === what || s.type === what);
  };
"""

PLANNERS: dict[str, str] = {
    "click-shape": _SHAPES_JS + r"""
  const desc = describes(U.replace(/^Click on a /, ''));
  return [click(readShapes(byId('area_svg')).find(desc).el)];
""",
    "count-shape": _SHAPES_JS + r"""
  const desc = describes(U.match(/^How many (.*)s are there\?/)[1]);
  const count = readShapes(byId('area_svg')).filter(desc).length;
  return [click(byText('#count-buttons button', String(count)))];
""",
    "find-greatest": r"""
  // Turn the cards over one by one (only the face-up card shows its number), then pick the greatest.
  const cards = $$('#cardholder .card');
  memory.seen = memory.seen || {};
  const up = cards.findIndex((c) => !c.classList.contains('hidden'));
  if (up >= 0) memory.seen[up] = Number(txt(cards[up]));
  const unseen = cards.findIndex((c, i) => !(i in memory.seen));
  if (unseen >= 0) return [click(cards[unseen])];
  const best = Object.keys(memory.seen).reduce((a, b) => (memory.seen[a] >= memory.seen[b] ? a : b));
  return up === Number(best) ? [click(byId('submit'))] : [click(cards[Number(best)])];
""",
    "find-word": r"""
  const n = parseInt(U.match(/Find the (\d+)/)[1], 10);
  const word = txt($$('#area p')[0]).split(' ')[n - 1].replace(/[^a-zA-Z]/g, '');
  return [...fill(byId('answer-input'), word), click(byId('subbtn'))];
""",
    "grid-coordinate": r"""
  // Grid points sit 30 px apart around the crossing of the two axes.
  const [, gx, gy] = U.match(/\((-?\d+),(-?\d+)\)/).map(Number);
  const [h, v] = $$('svg line').map((l) => l.getBoundingClientRect());
  const ox = v.left + v.width / 2, oy = h.top + h.height / 2;
  const point = $$('svg circle').find((c) => {
    const [cx, cy] = centre(c);
    return Math.round((cx - ox) / 30) === gx && Math.round((oy - cy) / 30) === gy;
  });
  return [click(point)];
""",
    "guess-number": r"""
  // Bisect 0-9 with the page's feedback ("higher than 4" / "lower than 7").
  memory.lo = memory.lo ?? 0; memory.hi = memory.hi ?? 9;
  const field = byId('tt');
  const said = (id) => {  // the number in "higher than 4" / "lower than 7", when that line shows
    const shownNumber = txt(byId(id).querySelector('span'));
    return shown(byId(id)) && shownNumber !== '' ? Number(shownNumber) : null;
  };
  if (said('higher') !== null) memory.lo = Math.max(memory.lo, said('higher') + 1);
  if (said('lower') !== null) memory.hi = Math.min(memory.hi, said('lower') - 1);
  const guess = Math.floor((memory.lo + memory.hi) / 2);
  // Enter submits the form and keeps the focus in the field for the next guess.
  const focus = document.activeElement === field ? [] : [click(field)];
  return [...focus, ...(field.value ? [key('Control+a')] : []), type(guess + '\n'), wait(50)];
""",
    "identify-shape": _SHAPES_JS + r"""
  const shape = readShapes(byId('area_svg'))[0];
  const answer = {rectangle: 'Rectangle', circle: 'Circle', triangle: 'Triangle', letter: 'Letter', digit: 'Number'};
  return [click(byText('#area-buttons button', answer[shape.type === 'shape' ? shape.text : shape.type]))];
""",
    "odd-or-even": r"""
  const steps = [];
  for (const row of $$('#numbers .row')) {
    const odd = Math.abs(Number(txt(row.querySelector('.display-number')))) % 2 === 1;
    const button = row.querySelector(odd ? '.odd' : '.even');
    if (!button.classList.contains('selected')) steps.push(click(button));
  }
  return [...steps, click(byId('submit'))];
""",
    "read-table": r"""
  const wanted = U.match(/^Enter the value of (.*) into the text field/)[1];
  const row = $$('#tab tr').find((tr) => txt(tr.cells[0]) === wanted);
  return [...fill(byId('tt'), txt(row.cells[1])), click(byId('subbtn'))];
""",
    "read-table-2": r"""
  const valueOf = (label) => txt($$('#tab tr').find((tr) => txt(tr.cells[0]) + ':' === txt(label)).cells[1]);
  return [...fill(byId('tt1'), valueOf(byId('ll1'))), ...fill(byId('tt2'), valueOf(byId('ll2'))), click(byId('subbtn'))];
""",
    "simple-algebra": r"""
  // "x + 3 = 10", "x - 3 = 10" or "3 - x = 10".
  const problem = txt(byId('math-problem'));
  let m, x;
  if ((m = problem.match(/^x ([+-]) (\d+) = (-?\d+)$/))) x = m[1] === '+' ? m[3] - m[2] : Number(m[3]) + Number(m[2]);
  else if ((m = problem.match(/^(\d+) ([+-]) x = (-?\d+)$/))) x = m[2] === '+' ? m[3] - m[1] : m[1] - m[3];
  else fail('unreadable problem ' + problem);
  return [...fill(byId('math-answer'), String(x)), click(byId('subbtn'))];
""",
    "simple-arithmetic": r"""
  const [, a, op, b] = txt(byId('math-problem')).match(/^(\d+) ([-+x]) (\d+) =$/);
  const x = op === '+' ? Number(a) + Number(b) : op === '-' ? a - b : a * b;
  return [...fill(byId('math-answer'), String(x)), click(byId('subbtn'))];
""",
}
