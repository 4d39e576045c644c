"""Planners for the widget tasks: sliders, spinners, date pickers, drop-down lists, autocomplete.

Each value is the body of a JS function run with :data:`~.prelude.PRELUDE_JS`; it returns the next steps.
These planners are state-based: they look at the widget as it is now (its shown value, whether a popup is
open) and return the one or two steps that bring it closer, so the solver's re-planning drives them.
"""

from __future__ import annotations

__all__ = ["PLANNERS"]

# Steps that move a jQuery UI slider to `target`: drag the handle to the value's position, then fix the last
# step or two with the arrow keys (the handle keeps focus after the drag). [] when the slider shows `target`.
_SLIDER_JS = r"""
  const sliderSteps = (slider, target, shownValue) => {
    if (shownValue === target) return [];
    const handle = slider.querySelector('.ui-slider-handle');
    const min = jQuery(slider).slider('option', 'min'), max = jQuery(slider).slider('option', 'max');
    if (document.activeElement === handle && Math.abs(shownValue - target) <= 3) {
      return [key(shownValue < target ? 'ArrowRight' : 'ArrowLeft')];
    }
    const r = slider.getBoundingClientRect(), frac = (target - min) / (max - min);
    const vertical = slider.classList.contains('ui-slider-vertical');
    const to = vertical ? [r.left + r.width / 2, r.bottom - frac * r.height] : [r.left + frac * r.width, r.top + r.height / 2];
    return [drag(centre(handle), to)];
  };
"""

# jQuery UI datepicker: open it, page to the month, click the day. The utterance holds MM/DD/YYYY.
_DATEPICKER = r"""
  const [, mm, dd, yyyy] = U.match(/(\d\d)\/(\d\d)\/(\d{4})/);
  const input = byId('datepicker');
  if (input.value === mm + '/' + dd + '/' + yyyy) return [click(byId('subbtn'))];
  const picker = byId('ui-datepicker-div');
  if (!shown(picker)) return [click(input), wait(100)];
  if (jQuery(':animated').length) return [];
  const months = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September',
                  'October', 'November', 'December'];
  const showing = months.indexOf(txt(picker.querySelector('.ui-datepicker-month'))) +
                  12 * Number(txt(picker.querySelector('.ui-datepicker-year')));
  const wanted = Number(mm) - 1 + 12 * Number(yyyy);
  if (showing > wanted) return [click(picker.querySelector('.ui-datepicker-prev'))];
  if (showing < wanted) return [click(picker.querySelector('.ui-datepicker-next'))];
  return [click($$('td a', picker).find((a) => Number(txt(a)) === Number(dd))), wait(100)];
"""

# jQuery UI autocomplete: type the wanted start, then pick the suggestion that also has the wanted end.
_AUTOCOMPLETE = r"""
  const [start, end] = [Q[0], Q.length > 1 ? Q[1] : ''];
  const field = byId('tags');
  const fits = (s) => s.startsWith(start) && s.endsWith(end);
  const menu = $$('ul.ui-autocomplete').find(shown);  // open, it may cover Submit: pick from it first
  if (menu) {
    const item = $$('li', menu).find((li) => fits(txt(li)));
    if (item) return [click(item), wait(100)];
  }
  if (fits(field.value)) return [click(byId('subbtn'))];
  if (field.value !== start) return [...fill(field, start), wait(300)];
  return [];
"""

# Select text by dragging the mouse across it: from the left edge of its first letter to the right edge of its
# last one (found with a DOM Range over the text nodes).
_SELECT_JS = r"""
  const letterRect = (root, index) => {  // the box of the index-th non-space letter of root's text
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    let seen = 0;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        if (/\s/.test(node.data[i])) continue;
        if (seen++ !== index) continue;
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        return range.getBoundingClientRect();
      }
    }
    return null;
  };
  const selectLetters = (root, from, to) => {  // drag over letters from..to (non-space indices)
    const a = letterRect(root, from), b = letterRect(root, to);
    return drag([a.left + 0.5, a.top + a.height / 2], [b.right - 0.5, b.top + b.height / 2]);
  };
"""

# A jscolor field: its text is the colour's hex code, so type the wanted colour's code (as the browser paints
# it) into the field, click beside the picker (which closes it, uncovering Submit), then submit.
_COLOR_FIELD = r"""
  const hex = (css) => {
    const probe = document.createElement('div');
    probe.style.backgroundColor = css;
    document.body.appendChild(probe);
    const rgb = getComputedStyle(probe).backgroundColor.match(/\d+/g).slice(0, 3).map(Number);
    probe.remove();
    return rgb.map((c) => c.toString(16).padStart(2, '0')).join('');
  };
  const field = byId('col');
  const pointed = $$('#query .cc')[0];
  const want = hex(pointed ? pointed.style.backgroundColor : U.match(/^Select (\w+) with the color picker/)[1]);
  if (field.value.toLowerCase() === want && !memory.typed) memory.typed = true;
  if (memory.typed) return [click(byId('subbtn'))];
  memory.typed = true;
  return [click(field), key('Control+a'), type(want), click(byId('query')), wait(100)];  // a click outside closes the picker
"""

PLANNERS: dict[str, str] = {
    "choose-date": _DATEPICKER,
    "choose-date-easy": _DATEPICKER,
    "choose-date-medium": _DATEPICKER,
    "choose-date-nodelay": _DATEPICKER,
    "choose-list": r"""
  // A native drop-down: focus it with a click, type the option's name, confirm with Enter.
  const name = U.match(/^Select (.*) from the list and click Submit\.$/)[1];
  const select = byId('options');
  if (select.options[select.selectedIndex].text === name) return [click($$('#area button')[0])];
  return [click(select), type(name), key('Enter'), wait(100)];
""",
    "click-scroll-list": r"""
  // A multi-select list: click the first wanted option (that selects it alone), then walk down with
  // Control+ArrowDown (moves without selecting) and add each other wanted option with Control+Space.
  const options = $$('#options option'), names = options.map((o) => o.text);
  const parts = U.match(/^Select (.*) from the scroll list and click Submit\.$/)[1].split(', ');
  const wanted = [];
  for (let i = 0, name = ''; i < parts.length; i++) {  // names may themselves hold ", "
    name = name ? name + ', ' + parts[i] : parts[i];
    if (names.includes(name)) { wanted.push(names.indexOf(name)); name = ''; }
  }
  const chosen = options.map((o) => o.selected);
  if (chosen.every((c, i) => c === wanted.includes(i))) return [click(byText('#area button', 'Submit'))];
  if (memory.walked) fail('the list selection went wrong');
  memory.walked = true;
  wanted.sort((a, b) => a - b);
  const start = pointOf(options[wanted[0]]) ? wanted[0] : 0;
  const steps = [click(options[start])];
  if (!wanted.includes(start)) steps.push(key('Control+Space'));
  let at = start;
  for (const index of wanted.filter((i) => i > start)) {
    for (; at < index; at++) steps.push(key('Control+ArrowDown'));
    steps.push(key('Control+Space'));
  }
  return steps;
""",
    "form-sequence": _SLIDER_JS + r"""
  const [, n, pos] = U.match(/^Select (-?\d+) with the slider, click the (\w+) checkbox/);
  const steps = sliderSteps(byId('slider'), Number(n), Number(txt(byId('val'))));
  if (steps.length) return steps;
  const box = byId('checkbox-' + (['1st', '2nd', '3rd'].indexOf(pos) + 1));
  return [...(box.checked ? [] : [click(box)]), click(byId('subbtn'))];
""",
    "form-sequence-3": r"""
  // A selectric drop-down: open it, click the height, then the button.
  const [, height, button] = U.match(/^Choose (.+) from the dropdown, then click the button labeled "(.+)"\.$/);
  if (byId('dropdown').value === height) return [click(byText('#buttons button', button))];
  const items = document.querySelector('.selectric-items');
  if (!shown(items)) return [click(document.querySelector('.selectric')), wait(100)];
  return [click(byText('.selectric-items li', height)), wait(100)];
""",
    "highlight-text": _SELECT_JS + r"""
  const text = byId('randomText'), letters = txt(text).replace(/\s/g, '').length;
  if (window.getSelection().toString().replace(/\s/g, '') === txt(text).replace(/\s/g, '')) return [click(byId('subbtn'))];
  return [selectLetters(text, 0, letters - 1)];
""",
    "highlight-text-2": _SELECT_JS + r"""
  const index = ['1st', '2nd', '3rd'].indexOf(U.match(/in the (\w+) paragraph/)[1]);
  const para = $$('#randomText p')[index], letters = txt(para).replace(/\s/g, '').length;
  if (window.getSelection().toString().replace(/\s/g, '') === txt(para).replace(/\s/g, '')) return [click(byId('subbtn'))];
  return [selectLetters(para, 0, letters - 1)];
""",
    "resize-textarea": r"""
  // Drag the resizable's right (width) or bottom (height) handle 20 px out or in.
  const [, dim, dir] = U.match(/the (width|height) is (smaller|larger)/);
  memory.done = memory.done || false;
  if (memory.done) return [click(byId('submit'))];
  const handle = document.querySelector(dim === 'width' ? '.ui-resizable-e' : '.ui-resizable-s');
  const [x, y] = pointOf(handle) || fail('the resize handle is covered'), d = dir === 'larger' ? 20 : -20;
  memory.done = true;
  return [drag([x, y], dim === 'width' ? [x + d, y] : [x, y + d])];
""",
    "text-editor": _SELECT_JS + r"""
  // Select the word (drag) or everything (Control+a), then press the toolbar's style or colour.
  const editor = document.querySelector('#editor .ql-editor');
  const all = /everything/.test(U);
  const m = U.match(/the (?:style|color) (\w+)/);
  const style = m[1], word = all ? null : U.match(/give the text (\S+) the/)[1];
  const BUTTON = {bold: '.ql-bold', italics: '.ql-italic', underlined: '.ql-underline'};
  const PRIMARY = {red: '#e60000', orange: '#ff9900', yellow: '#ffff00', green: '#008a00', blue: '#0066cc', purple: '#9933ff'};
  if (memory.styled) return [click(byId('subbtn'))];
  if (!memory.selected) {
    memory.selected = true;
    if (all) return [click(editor), key('Control+a'), wait(300)];
    const words = txt(editor).split(' '), at = words.indexOf(word);
    const before = words.slice(0, at).join('').length;
    return [selectLetters(editor, before, before + word.length - 1), wait(300)];  // Quill syncs its selection late
  }
  if (BUTTON[style]) { memory.styled = true; return [click(document.querySelector(BUTTON[style]))]; }
  const options = document.querySelector('.ql-color .ql-picker-options');
  if (!shown(options)) return [click(document.querySelector('.ql-color .ql-picker-label'))];
  memory.styled = true;
  return [click(options.querySelector('[data-value="' + PRIMARY[style] + '"]'))];
""",
    "use-autocomplete": _AUTOCOMPLETE,
    "use-autocomplete-nodelay": _AUTOCOMPLETE,
    "use-colorwheel": _COLOR_FIELD,
    "use-colorwheel-2": _COLOR_FIELD,
    "use-slider": _SLIDER_JS + r"""
  const n = Number(U.match(/^Select (-?\d+) with the slider/)[1]);
  const steps = sliderSteps(byId('slider'), n, Number(txt(byId('val'))));
  return steps.length ? steps : [click(byId('subbtn'))];
""",
    "use-slider-2": _SLIDER_JS + r"""
  const combo = JSON.parse(U.match(/combination (\[.*\])/)[1]);
  for (let i = 1; i <= 3; i++) {
    const steps = sliderSteps(byId('slider-' + i), combo[i - 1], Number(txt(byId('val-' + i))));
    if (steps.length) return steps;
  }
  return [click(byId('subbtn'))];
""",
    "use-spinner": r"""
  // The field ignores typing: step with the spinner's arrow buttons.
  const n = Number(U.match(/^Select (-?\d+) with the spinner/)[1]);
  const value = Number(byId('spinner').value);
  if (value === n) return [click(byId('subbtn'))];
  return [click(document.querySelector(value < n ? '.ui-spinner-up' : '.ui-spinner-down'))];
""",
}
