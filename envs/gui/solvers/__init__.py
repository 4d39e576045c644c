"""Reference solvers for MiniWoB++ tasks: JS planners that read the page's DOM and act by pixels.

Each solvable task has a planner (a JS function body, see :mod:`.prelude`) in one of the group modules
(:mod:`.clicks`, :mod:`.forms`, :mod:`.widgets`, :mod:`.drags`, :mod:`.reading`, :mod:`.apps`). The solver
evaluates the task's planner in the live page, plays the returned steps one per turn as the agent's own action text
(``click(57, 112)``, ``type("Bob")``, ``key("Enter")``, ``scroll(80, 120, 60)``, ``drag(...)``), and plans
again whenever its steps run out and the episode is still going, so multi-stage tasks (open a menu, then
pick an item) are planned from the page as it is now. A planner may read anything in the DOM (it is a
reference solution, not an agent); the reward still comes only from the page's own ``core.endEpisode``.
These solvers prove the listed tasks solvable through the agent's action space; they do not claim to solve
MiniWoB in general.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentgym.envs.gui.solvers import apps, clicks, drags, forms, reading, widgets
from agentgym.envs.gui.solvers.prelude import PRELUDE_JS

__all__ = ["PLANNERS", "SOLVABLE_TASKS", "planner_js", "reference_solver", "step_to_action"]


def _merge(*groups: Mapping[str, str]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for group in groups:
        for task, body in group.items():
            if task in merged:
                raise ValueError(f"two planners for MiniWoB task {task!r}")
            merged[task] = body
    return merged


#: Task id -> JS planner body.
PLANNERS: dict[str, str] = _merge(clicks.PLANNERS, forms.PLANNERS, widgets.PLANNERS, drags.PLANNERS,
                                  reading.PLANNERS, apps.PLANNERS)
#: Tasks with a DOM-reading solver, sorted (each one proved by the ``gui-validated`` suite's validate()).
SOLVABLE_TASKS: tuple[str, ...] = tuple(sorted(PLANNERS))

REPLAN_WAIT_S = 0.1  # pause before planning again when a planner has nothing to do yet (an animation runs)
MAX_IDLE_PLANS = 30  # that many empty plans in a row (3 s) and the solver gives up on the turn
MAX_WAIT_MS = 3000


def planner_js(task: str) -> str:
    """The JS function evaluated in the page: ``(memory) => {"steps": [...], "memory": {...}}`` or
    ``{"error": why}``. ``memory`` is the planner's own notes from its earlier plans of this episode (what a
    person remembers: the guesses made, the cards seen); it lives in the solver, never in the page."""
    if task not in PLANNERS:
        raise KeyError(task)
    return ("(memory) => {\n" + PRELUDE_JS + "\n  try {\n    const steps = (() => {\n" + PLANNERS[task]
            + "\n    })();\n    return {steps: Array.isArray(steps) ? steps : [], memory};\n"
            "  } catch (e) {\n    return {error: String((e && e.message) || e)};\n  }\n}")


def step_to_action(step: Mapping[str, Any]) -> str:
    """One planner step as the agent's function-call action text."""
    if "click" in step:
        x, y = step["click"]
        return f"click({int(x)}, {int(y)})"
    if "type" in step:
        return f"type({json.dumps(str(step['type']), ensure_ascii=False)})"
    if "key" in step:
        return f"key({json.dumps(str(step['key']))})"
    if "scroll" in step:
        x, y, dy = step["scroll"]
        return f"scroll({int(x)}, {int(y)}, {int(dy)})"
    if "hover" in step:
        x, y = step["hover"]
        return f"scroll({int(x)}, {int(y)}, 0)"
    if "drag" in step:
        x1, y1, x2, y2 = step["drag"]
        return f"drag({int(x1)}, {int(y1)}, {int(x2)}, {int(y2)})"
    raise ValueError(f"unknown planner step {dict(step)!r}")


def reference_solver(task: str, evaluate: Callable[[str, Any], Any]) -> Callable[[Any], str]:
    """A solver for one episode of ``task``: observation -> next action text.

    ``evaluate(script, arg)`` runs a JS function in the episode's page and returns its result. Steps are played one per
    turn; a ``wait`` step pauses (the agent's thinking time, not an action); a scroll ends a plan, because
    every point after it has moved. When no plan can be made, the turn's action says so (a void turn).
    """
    if task not in PLANNERS:
        raise NotImplementedError(f"No reference solver for MiniWoB task {task!r}; solvable: "
                                  f"{', '.join(SOLVABLE_TASKS)}.")
    script = planner_js(task)
    queue: list[dict[str, Any]] = []
    memory: dict[str, Any] = {}

    def plan() -> str | None:
        result = evaluate(script, memory)
        if not isinstance(result, dict):
            return f"the planner returned {result!r}"
        if "error" in result:
            return str(result["error"])
        memory.clear()
        memory.update(result.get("memory") or {})
        for step in result.get("steps") or []:
            if isinstance(step, dict):
                queue.append(step)
                if "scroll" in step:
                    break
        return None

    def solve(observation: Any) -> str:
        why = "no step planned"
        for _ in range(MAX_IDLE_PLANS):
            while queue:
                step = queue.pop(0)
                if "wait" in step:
                    time.sleep(min(float(step["wait"]), MAX_WAIT_MS) / 1000)
                    continue
                return step_to_action(step)
            error = plan()
            if error is not None:
                why = error
                break
            if not queue:
                time.sleep(REPLAN_WAIT_S)
        return f"(the reference solver has no move: {why})"

    return solve
