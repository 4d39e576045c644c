"""MiniWoB reference solvers: DOM-reading planners that act only through the agent's pixel actions.

The fast tests play one seed of ten multi-stage tasks (menus, date pickers, sliders, popups, apps) in one
shared browser; the slow test validates the whole ``gui-validated`` suite. Every reward comes from the
page's own ``core.endEpisode``.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from agentgym.envs.gui.miniwob import task_ids
from agentgym.envs.gui.solvers import PLANNERS, SOLVABLE_TASKS, planner_js, reference_solver, step_to_action
from agentgym.envs.gui.tasks import make_task

from agentgym.rollout import run_reference_episode
from agentgym.registration.suites import load_suite
from tests.helpers.browsers import HAVE_BROWSER, needs_browser

if "agentgym/MiniWoB-v0" not in gym.registry:
    gym.register(id="agentgym/MiniWoB-v0", entry_point="agentgym.envs.gui.env:MiniWoBEnv")

#: One task per kind of difficulty: hover menus, paging a date picker, dragging a slider, a popup that
#: interrupts a form, bisecting with feedback, keyboard copy and paste, positions remembered after they
#: vanish, app screens (email, feed, search pages) and a scrolled list.
FAST_TASKS = ("click-menu", "choose-date-easy", "use-slider", "login-user-popup", "guess-number", "copy-paste",
              "ascending-numbers", "email-inbox-forward", "social-media", "search-engine")


@pytest.fixture(scope="module")
def env():
    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    e = gym.make("agentgym/MiniWoB-v0", max_turns=20)
    yield e
    e.close()


def test_solvable_tasks_are_real_tasks_and_the_validated_suite_lists_them_all():
    assert len(SOLVABLE_TASKS) >= 60 and set(SOLVABLE_TASKS) <= set(task_ids())
    suite = load_suite("gui-validated")
    for split in ("train", "test"):
        assert {t.metadata["task"] for t in suite.split(split)} == set(SOLVABLE_TASKS)
    assert not {t.metadata["seed"] for t in suite.train} & {t.metadata["seed"] for t in suite.test}
    assert set(FAST_TASKS) <= set(SOLVABLE_TASKS)


def test_steps_become_the_agents_own_action_texts():
    assert step_to_action({"click": [12.4, 30]}) == "click(12, 30)"
    assert step_to_action({"type": 'say "hi"\n'}) == 'type("say \\"hi\\"\\n")'
    assert step_to_action({"key": "Control+a"}) == 'key("Control+a")'
    assert step_to_action({"scroll": [80, 120, -300]}) == "scroll(80, 120, -300)"
    assert step_to_action({"hover": [5, 6]}) == "scroll(5, 6, 0)"  # moves the pointer, turns the wheel by nothing
    assert step_to_action({"drag": [1, 2, 3, 4]}) == "drag(1, 2, 3, 4)"
    with pytest.raises(ValueError, match="unknown planner step"):
        step_to_action({"teleport": [1, 2]})
    with pytest.raises(NotImplementedError, match="No reference solver for MiniWoB task 'chase-circle'"):
        reference_solver("chase-circle", lambda script, arg: None)


def test_solver_replans_keeps_memory_and_stops_a_plan_at_a_scroll():
    """The solver against a scripted page: plans are re-made when used up, memory round-trips, waits are
    not actions, a scroll ends its plan, and a planner error becomes a void turn that says why."""
    plans = [
        {"steps": [{"click": [1, 1]}, {"wait": 1}, {"scroll": [5, 5, 40]}, {"click": [9, 9]}], "memory": {"n": 1}},
        {"steps": [{"type": "x"}], "memory": {"n": 2}},
        {"error": "cannot reach BUTTON"},
    ]
    seen: list[dict] = []

    def evaluate(script: str, memory: dict) -> dict:
        assert script == planner_js("click-test")
        seen.append(dict(memory))
        return plans.pop(0)

    solve = reference_solver("click-test", evaluate)
    assert [solve(None) for _ in range(3)] == ["click(1, 1)", "scroll(5, 5, 40)", 'type("x")']
    assert seen == [{}, {"n": 1}]
    assert solve(None) == "(the reference solver has no move: cannot reach BUTTON)"


@needs_browser
def test_every_planner_is_valid_javascript(env):
    env.reset(options={"task": make_task("click-test", 1)})
    bad = env.unwrapped._session.evaluate(
        "(scripts) => Object.entries(scripts).filter(([task, s]) => { try { new Function('return ' + s); "
        "return false; } catch (e) { return true; } }).map(([task]) => task)",
        {task: planner_js(task) for task in PLANNERS})
    assert bad == []


@needs_browser
@pytest.mark.parametrize("task", FAST_TASKS)
def test_reference_solver_earns_the_pages_own_reward(env, task):
    traj = run_reference_episode(env, make_task(task, 7))
    assert traj.outcome["success"], (task, [t.action for t in traj.turns], traj.outcome)
    done, raw, _ = env.unwrapped._session.evaluate("() => [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON]")
    assert done is True and raw == pytest.approx(1.0)  # the page's core.endEpisode paid it
    actions = [t.action for t in traj.turns]
    assert all(a.split("(")[0] in {"click", "type", "key", "scroll", "drag"} for a in actions), actions


@needs_browser
@pytest.mark.slow
def test_gui_validated_suite_is_solved_by_pixel_actions():
    report = load_suite("gui-validated").validate()
    assert report.ok, str(report)
