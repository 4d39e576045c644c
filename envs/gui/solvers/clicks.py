"""Planners for the click tasks: buttons, links, checkboxes, tabs, dialogs, menus, collapsible sections.

Each value is the body of a JS function run with :data:`~.prelude.PRELUDE_JS`; it returns the next steps.
"""

from __future__ import annotations

__all__ = ["PLANNERS"]

# Tick exactly the checkboxes whose labels the utterance lists ("Select A, B and click Submit."), then submit.
_CHECKBOXES = r"""
  const m = U.match(/^Select (.*) and click Submit\.$/);
  const wanted = !m || m[1] === 'nothing' ? [] : m[1].split(', ');
  const steps = [];
  for (const label of $$('#area label')) {
    const box = label.querySelector('input');
    if (wanted.includes(txt(label)) !== box.checked) steps.push(click(box));
  }
  return [...steps, click(byId('subbtn'))];
"""

# Open the tab whose panel holds the link named in the utterance, then click the link.
_TAB_LINK = r"""
  const links = $$('#area .alink').filter((l) => txt(l) === Q[0]);
  const open = links.find(shown);
  if (open) return [click(open)];
  if (!links.length) {  // click-tab-2-medium: the link was in the emptied tab, whose own tab is the answer
    return [click($$('#area .ui-tab a')[1])];
  }
  const panel = links[0].closest('.ui-tabs-panel');
  return [click($$('#area .ui-tab a').find((a) => a.getAttribute('href') === '#' + panel.id)), wait(100)];
"""

# jQuery UI animations (accordion, menus) must settle before the next click lands where it was planned.
_SETTLED = "if (window.jQuery && jQuery(':animated').length) return [];\n"

# Open the section that holds the link named in the utterance, then click the link.
_COLLAPSIBLE_2 = _SETTLED + r"""
  const links = $$('#area .alink').filter((l) => txt(l) === Q[0]);
  const open = links.find(shown);
  if (open) return [click(open)];
  const header = links[0].closest('.ui-accordion-content').previousElementSibling;
  return [click(header), wait(200)];
"""

_COLLAPSIBLE = _SETTLED + r"""
  const content = $$('#area .ui-accordion-content')[0];
  if (!shown(content)) return [click($$('#area .ui-accordion-header')[0]), wait(200)];
  return [click(byId('subbtn'))];
"""

PLANNERS: dict[str, str] = {
    "click-button": r"""
  return [click(byText('#area button', Q[0]))];
""",
    "click-button-sequence": r"""
  return [click(byId('subbtn')), click(byId('subbtn2'))];
""",
    "click-checkboxes": _CHECKBOXES,
    "click-checkboxes-large": _CHECKBOXES,
    "click-checkboxes-soft": r"""
  // "Select words similar to A, B": tick each box whose word shares a synonym group (the page's own
  // thesaurus, SYNONYMS) with a listed word.
  const listed = U.match(/^Select words similar to (.*) and click Submit\.$/)[1].split(', ');
  const group = (word) => SYNONYMS.findIndex((g) => g.includes(word));
  const wanted = new Set(listed.map(group));
  const steps = [];
  for (const label of $$('#boxes label')) {
    const box = label.querySelector('input');
    if (wanted.has(group(txt(label))) !== box.checked) steps.push(click(box));
  }
  return [...steps, click(byId('subbtn'))];
""",
    "click-checkboxes-transfer": _CHECKBOXES,
    "click-collapsible": _COLLAPSIBLE,
    "click-collapsible-nodelay": _COLLAPSIBLE,
    "click-collapsible-2": _COLLAPSIBLE_2,
    "click-collapsible-2-nodelay": _COLLAPSIBLE_2,
    "click-color": r"""
  const name = U.match(/^Click on the (.*) colored box\.$/)[1];
  // Compare what is painted: the computed background of each box against the named CSS colour.
  const probe = document.createElement('div');
  probe.style.backgroundColor = name;
  document.body.appendChild(probe);
  const wanted = getComputedStyle(probe).backgroundColor;
  probe.remove();
  return [click($$('#area .color').find((b) => getComputedStyle(b).backgroundColor === wanted))];
""",
    "click-dialog": r"""
  return [click(document.querySelector('.ui-dialog button.ui-button'))];
""",
    "click-dialog-2": r"""
  if (Q[0] === 'x') return [click(document.querySelector('.ui-dialog-titlebar button'))];
  return [click(byText('.ui-dialog-buttonpane button', Q[0]))];
""",
    "click-link": r"""
  return [click(byText('#area .alink', Q[0]))];
""",
    "click-menu": _SETTLED + r"""
  // "Select A>B>C": hover each open item's parent (scroll(x, y, 0) moves the pointer there), then click the leaf.
  const path = U.replace(/^Select /, '').split('>');
  let list = byId('menu');
  for (let i = 0; i < path.length; i++) {
    const item = Array.from(list.children).find((li) => txt(li.querySelector(':scope > div')) === path[i]);
    if (i === path.length - 1) return [click(item.querySelector(':scope > div'))];
    const sub = item.querySelector(':scope > ul');
    if (!shown(sub) || getComputedStyle(sub).display === 'none') return [hover(item.querySelector(':scope > div')), wait(500)];
    list = sub;
  }
""",
    "click-menu-2": _SETTLED + r"""
  const menu = byId('menu');
  if (!shown(menu)) return [click(byId('open-menu'))];
  const icon = $$('#query .ui-icon')[0];
  const cls = icon && Array.from(icon.classList).find((c) => c.startsWith('ui-icon-'));
  const item = $$('#menu li').find((li) => cls ? !!li.querySelector(':scope > div > .' + cls) : txt(li) === Q[Q.length - 1]);
  const parent = item.parentElement.closest('li');
  if (parent && !shown(item)) return [hover(parent.querySelector(':scope > div')), wait(500)];
  return [click(item.querySelector(':scope > div'))];
""",
    "number-checkboxes": r"""
  // Copy the digit's 7x4 pattern (the page's example picture, PATTERNS) into the grid of checkboxes.
  const digit = Number(Q[0]);
  const boxes = $$('#checkboxes input[type=checkbox]');
  const todo = boxes.filter((box, i) => (PATTERNS[digit][Math.floor(i / 4)][i % 4] === 1) !== box.checked);
  return [...todo.map(click), click(byId('subbtn'))];
""",
    "click-option": r"""
  const name = U.match(/^Select (.*) and click Submit\.$/)[1];
  const label = $$('#area label').find((l) => txt(l) === name);
  return [click(label.querySelector('input')), click(byId('subbtn'))];
""",
    "click-shades": r"""
  // The shade's family is the channel that dominates its painted colour.
  const want = U.match(/shades of (\w+)/)[1];
  const family = (el) => {
    const [r, g, b] = getComputedStyle(el).backgroundColor.match(/\d+/g).map(Number);
    return r > g && r > b ? 'red' : g > r && g > b ? 'green' : 'blue';
  };
  const steps = $$('#area span').filter((s) => (family(s) === want) !== s.classList.contains('selected')).map(click);
  return [...steps, click(byId('submit'))];
""",
    "click-tab": r"""
  return [click(byText('#area ul a', U.match(/^Click on (Tab #\d)\.$/)[1]))];
""",
    "click-tab-2": _TAB_LINK,
    "click-tab-2-easy": _TAB_LINK,
    "click-tab-2-medium": _TAB_LINK,
    "click-tab-2-hard": _TAB_LINK,
    "click-test": r"""
  return [click(byId('subbtn'))];
""",
    "click-test-2": r"""
  return [click(byText('#area button', 'ONE'))];
""",
    "click-test-transfer": r"""
  return [click(byText('#area button', U.match(/^Click button (\w+)\.$/)[1]))];
""",
    "click-widget": r"""
  // What each widget kind looks like in the DOM (the page's data-type attribute is not read).
  const kinds = {radio: 'input[type=radio]', checkbox: 'input[type=checkbox]', text: 'input[type=input]',
                 textarea: 'textarea', button: 'button'};
  return [click($$('#area .widget ' + kinds[Q[0]])[0])];
""",
}
