"""Planners for the drag tasks: boxes into boxes, sortable lists and grids, SVG shapes.

Each value is the body of a JS function run with :data:`~.prelude.PRELUDE_JS`; it returns the next steps.
A drag is ``drag(from, to)``: press at ``from`` (a point really on the item), move there in steps, release.
"""

from __future__ import annotations

__all__ = ["PLANNERS"]

# Move item `from` of a jQuery UI sortable to index `to` with one drag. The sortable inserts the dragged item
# *after* the item under the pointer when the pointer moves right or down, *before* it when it moves left or
# up, and only once the pointer is past that item's middle in the direction of travel; so the drag ends on the
# far side of the item that will precede (or follow) it. Along a row, a rightward drag also drifts down a
# little, without which the sortable stops after passing one neighbour (measured on all 72 moves of a 3x3
# grid).
_SORTABLE_JS = r"""
  const moveItem = (items, from, to) => {
    const item = items[from], rest = items.filter((_, i) => i !== from);
    const [sx, sy] = pointOf(item) || centre(item), [tx, ty] = centre(items[to]);
    const h = Math.sign(Math.round(tx - sx)), v = Math.sign(Math.round(ty - sy));
    const after = h > 0 || v > 0;
    const r = (after ? rest[to - 1] : rest[to]).getBoundingClientRect();
    let x, y;
    if (h !== 0) {
      x = r.left + r.width * (h > 0 ? 0.85 : 0.15);
      const sameRow = Math.abs(r.top + r.height / 2 - sy) < r.height / 2;
      y = sameRow ? (h > 0 ? r.top + r.height * 0.7 : sy) : r.top + r.height / 2;
    } else {
      x = sx;
      y = r.top + r.height * (v > 0 ? 0.85 : 0.15);
    }
    return drag([sx, sy], [x, y]);
  };
"""

# Drag the one shape 30 px the asked way ("Drag the item left", "Drag the circle up"), then submit.
_DRAG_ONE = r"""
  const dir = U.match(/^Drag the \w+ (\w+)/)[1];
  if (memory.dragged) return [click(byId('subbtn'))];
  const shape = document.querySelector('.black-shape, .black-circle'), from = pointOf(shape) || fail('the shape is covered');
  const D = {left: [-30, 0], right: [30, 0], up: [0, -30], down: [0, 30]}[dir];
  memory.dragged = true;
  return [drag(from, [from[0] + D[0], from[1] + D[1]])];
"""

PLANNERS: dict[str, str] = {
    "drag-box": r"""
  // Put the small box's top-left corner 15 px inside the large box's.
  const small = byId('draggableSmall'), large = byId('draggableLarge');
  const s = small.getBoundingClientRect(), l = large.getBoundingClientRect();
  const inside = s.left > l.left && s.top > l.top && s.right < l.right && s.bottom < l.bottom;
  if (memory.dragged && inside) return [click(byId('subbtn'))];
  const from = pointOf(small) || fail('the small box is covered');
  memory.dragged = true;
  return [drag(from, [from[0] + (l.left + 15 - s.left), from[1] + (l.top + 15 - s.top)])];
""",
    "drag-circle": _DRAG_ONE,
    "drag-items": _SORTABLE_JS + r"""
  const [, name, where] = U.match(/^Drag (.+?) (to the .*|up by one position\.|down by one position\.)$/);
  const items = $$('#sortable li'), from = items.findIndex((li) => txt(li) === name);
  let to;
  if (where === 'to the top.') to = 0;
  else if (where === 'to the bottom.') to = items.length - 1;
  else if (where.startsWith('up')) to = from - 1;
  else if (where.startsWith('down')) to = from + 1;
  else to = parseInt(where.match(/(\d+)/)[1], 10) - 1;
  return [moveItem(items, from, to)];
""",
    "drag-items-grid": _SORTABLE_JS + r"""
  const [, name, where] = U.match(/^Drag (.+?) (to the .*|(?:up|down|left|right) by one)\.$/);
  const items = $$('#sortable li'), from = items.findIndex((li) => txt(li) === name);
  const CELLS = ['top left', 'top center', 'top right', 'center left', 'center', 'center right',
                 'bottom left', 'bottom center', 'bottom right'];
  const STEP = {up: -3, down: 3, left: -1, right: 1};
  const m = where.match(/^(up|down|left|right) by one$/);
  const to = m ? from + STEP[m[1]] : CELLS.indexOf(where.replace(/^to the /, ''));
  return [moveItem(items, from, to)];
""",
    "drag-shapes": r"""
  // Drag every shape of the asked kind into the black box, each to its own spot.
  const TAG = {rectangles: 'rect', circles: 'circle', triangles: 'polygon'};
  const kind = TAG[U.match(/^Drag all (\w+) into/)[1]];
  const box = byId('shape-container').getBoundingClientRect();
  const inBox = (el) => {
    const [x, y] = centre(el);
    return x > box.left + 4 && x < box.right - 4 && y > box.top + 4 && y < box.bottom - 4;
  };
  const todo = $$('#area_svg > ' + kind).filter((el) => el.id !== 'shape-container' && !inBox(el));
  if (!todo.length) return [click(byId('subbtn'))];
  memory.placed = (memory.placed || 0) + 1;
  const spot = [box.left + box.width * (0.25 + 0.25 * ((memory.placed - 1) % 3)), box.top + box.height / 2];
  return [drag(pointOf(todo[0]) || fail('the shape is covered'), spot)];
""",
    "drag-single-shape": _DRAG_ONE,
    "drag-sort-numbers": _SORTABLE_JS + r"""
  // Selection sort by drags: bring the smallest misplaced number up to its slot, one drag per plan.
  const items = $$('#sortable li'), values = items.map((li) => Number(txt(li)));
  const sorted = values.slice().sort((a, b) => a - b);
  const slot = values.findIndex((v, i) => v !== sorted[i]);
  if (slot < 0) return [click(byId('subbtn'))];
  const from = values.indexOf(sorted[slot], slot);
  return [moveItem(items, from, slot), wait(100)];
""",
}
