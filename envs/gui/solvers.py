"""Reference solvers for the MiniWoB tasks of the ``gui-smoke`` suite, found by reading the page's DOM.

A solver looks at the live page once (the utterance and the elements' bounding boxes), plans the pixel
actions a person would take, and then plays them one per turn as the agent's action text
(``click(57, 112)``, ``type("Bob")``). It proves the tasks solvable through the same coordinate actions
the agent has; it does not claim to solve MiniWoB in general.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["PLAN_JS", "SOLVABLE_TASKS", "plan_to_actions"]

#: Tasks with a DOM-reading solver (each one proved by ``gui-smoke``'s validate()).
SOLVABLE_TASKS = (
    "click-button", "click-checkboxes", "click-dialog", "click-link", "click-test", "enter-password",
    "enter-text", "focus-text", "focus-text-2", "login-user",
)

#: Returns a list of steps: {"click": [x, y]} or {"type": "text"}; [] when the task is not known.
PLAN_JS = r"""(task) => {
  const center = (el) => {
    const r = el.getBoundingClientRect();
    return {click: [Math.round(r.left + r.width / 2), Math.round(r.top + r.height / 2)]};
  };
  const byId = (id) => document.getElementById(id);
  const utterance = core.getUtterance();
  const quoted = Array.from(utterance.matchAll(/"([^"]*)"/g)).map((m) => m[1]);
  const area = byId('area');
  switch (task) {
    case 'click-button': {
      const button = Array.from(area.querySelectorAll('button')).find((b) => b.textContent === quoted[0]);
      return button ? [center(button)] : [];
    }
    case 'click-link': {
      const link = Array.from(area.querySelectorAll('.alink')).find((s) => s.textContent === quoted[0]);
      return link ? [center(link)] : [];
    }
    case 'click-dialog': {
      const close = document.querySelector('.ui-dialog button.ui-button');
      return close ? [center(close)] : [];
    }
    case 'click-test':
      return [center(byId('subbtn'))];
    case 'enter-text':
      return [center(byId('tt')), {type: quoted[0]}, center(byId('subbtn'))];
    case 'enter-password':
      return [center(byId('password')), {type: quoted[0]}, center(byId('verify')), {type: quoted[0]},
              center(byId('subbtn'))];
    case 'login-user':
      return [center(byId('username')), {type: quoted[0]}, center(byId('password')), {type: quoted[1]},
              center(byId('subbtn'))];
    case 'focus-text':
      return [center(byId('tt'))];
    case 'focus-text-2': {
      const index = POS.findIndex((p) => utterance.includes(' ' + p + ' '));
      return index >= 0 ? [center(byId(textIds[index]))] : [];
    }
    case 'click-checkboxes': {
      const match = utterance.match(/^Select (.*) and click Submit\.$/);
      const wanted = !match || match[1] === 'nothing' ? [] : match[1].split(', ');
      const steps = [];
      for (const label of area.querySelectorAll('#boxes label')) {
        const box = label.querySelector('input');
        if (wanted.includes(label.textContent.trim()) !== box.checked) steps.push(center(box));
      }
      steps.push(center(byId('subbtn')));
      return steps;
    }
    default:
      return [];
  }
}"""


def plan_to_actions(plan: Any) -> list[str]:
    """Turn the page's plan into action texts in the env's function-call format."""
    actions: list[str] = []
    for step in plan if isinstance(plan, list) else []:
        if isinstance(step, dict) and "click" in step:
            x, y = step["click"]
            actions.append(f"click({int(x)}, {int(y)})")
        elif isinstance(step, dict) and "type" in step:
            actions.append(f"type({json.dumps(str(step['type']), ensure_ascii=False)})")
    return actions
