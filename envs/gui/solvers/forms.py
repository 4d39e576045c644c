"""Planners for the form tasks: text fields, passwords, dates and times, logins, multi-step forms.

Each value is the body of a JS function run with :data:`~.prelude.PRELUDE_JS`; it returns the next steps.
Fields are filled with ``fill(el, text)`` (click, type; select all first when it holds text), which plans
nothing for a field that already holds the text, so a planner run again after a popup or a scroll resumes
where it stopped.
"""

from __future__ import annotations

__all__ = ["PLANNERS"]

# The movie-search forms of multi-layouts / multi-orderings: each input's label is the text of its row.
_MOVIE_SEARCH = r"""
  const [, genre, name, year] = U.match(/^Search for (.+) movies directed by (.+) from year (\d+)\.$/);
  const labelOf = (input) => txt(input.closest('p, tr, .row, .field, .ui-entry') || input.parentElement);
  const value = (label) => /genre/i.test(label) ? genre : /director/i.test(label) ? name : year;
  const steps = [];
  for (const input of $$('#area input')) steps.push(...fill(input, value(labelOf(input))));
  const submit = $$('#area button, #area .final, #area .ui-submit')[0];
  return [...steps, click(submit)];
"""

PLANNERS: dict[str, str] = {
    "enter-date": r"""
  // A date input takes the digits of month, day and year in turn once its month part has focus.
  const [, mm, dd, yyyy] = U.match(/(\d\d)\/(\d\d)\/(\d{4})/);
  const field = byId('tt'), r = field.getBoundingClientRect();
  return [clickAt(r.left + 8, r.top + r.height / 2), type(mm + dd + yyyy), click(byId('subbtn'))];
""",
    "enter-password": r"""
  return [...fill(byId('password'), Q[0]), ...fill(byId('verify'), Q[0]), click(byId('subbtn'))];
""",
    "enter-text": r"""
  return [...fill(byId('tt'), Q[0]), click(byId('subbtn'))];
""",
    "enter-text-2": r"""
  const word = /upper case/.test(U) ? Q[0].toUpperCase() : Q[0].toLowerCase();
  return [...fill(byId('tt'), word), click(byId('subbtn'))];
""",
    "enter-text-dynamic": r"""
  return [...fill(byId('tt'), Q[0]), click(byId('subbtn'))];
""",
    "enter-time": r"""
  // A time input takes hours, minutes and AM/PM in turn once its hour part has focus.
  const [, h, m, ampm] = U.match(/Enter (\d+):(\d\d) ?([AP]M)/);
  const field = byId('tt'), r = field.getBoundingClientRect();
  return [clickAt(r.left + 8, r.top + r.height / 2), type(h.padStart(2, '0') + m + ampm[0]), click(byId('subbtn'))];
""",
    "focus-text": r"""
  return [click(byId('tt'))];
""",
    "focus-text-2": r"""
  const index = ['1st', '2nd', '3rd'].findIndex((p) => U.includes(' ' + p + ' '));
  return [click($$('#area input')[index])];
""",
    "form-sequence-2": r"""
  const pos = (word) => ['1st', '2nd', '3rd'].indexOf(word);
  const [, radio, number, box] = U.match(/the (\w+) radio button and enter the number "(-?\d+)" into the (\w+) textbox/);
  return [click($$('#area input[type=radio]')[pos(radio)]), ...fill($$('#area input[type=text]')[pos(box)], number),
          click(byId('subbtn'))];
""",
    "login-user": r"""
  return [...fill(byId('username'), Q[0]), ...fill(byId('password'), Q[1]), click(byId('subbtn'))];
""",
    "login-user-popup": r"""
  // A popup may cover the form when a field takes focus: cancel it, then carry on (one step at a time).
  const popup = byId('popup');
  if (popup) return [click(byId('popup-cancel'))];
  for (const [id, want] of [['username', Q[0]], ['password', Q[1]]]) {
    const field = byId(id);
    if (field.value === want) continue;
    return document.activeElement === field ? [key('Control+a'), type(want)] : [click(field)];
  }
  return [click(byId('subbtn'))];
""",
    "multi-layouts": _MOVIE_SEARCH,
    "multi-orderings": _MOVIE_SEARCH,
    "sign-agreement": r"""
  if (U === 'Click the cancel button.') return [click(byId('cancel'))];
  const name = byId('name');
  if (name.disabled) {  // the form unlocks once the agreement has been scrolled to its end
    const text = byId('text-area'), r = text.getBoundingClientRect();
    return [{scroll: [Math.round(r.left + r.width / 2), Math.round(r.top + r.height / 2), text.scrollHeight]}];
  }
  return [...fill(name, Q[0]), click(byId(/"Agree"/.test(U) ? 'agree' : 'cancel'))];
""",
    "text-transform": r"""
  // The distorted word is drawn letter by letter; read the letters back in order.
  const word = $$('#captcha span').map((s) => s.textContent).join('');
  return [...fill(byId('tt'), word), click(byId('subbtn'))];
""",
    "unicode-test": r"""
  return [click(byText('#area button', Q[0]))];
""",
}
