"""MiniWoB: submitting without doing the task, clicking outside the page and script URLs, and reading a score
or seed from the observation, in real Chromium; each scores no success while the honest solution succeeds."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from tests.helpers.browsers import HAVE_BROWSER, needs_browser


@pytest.fixture(scope="module")
def gui():
    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    env = gym.make("agentgym/MiniWoB-v0", accessibility=True)
    yield env
    env.close()


@needs_browser
def test_gui_honest_solution_succeeds(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    obs, _ = gui.reset(options={"task": make_task("enter-text", 11)})
    solver = gui.unwrapped.reference_solver()
    for _ in range(6):
        obs, _, terminated, truncated, info = gui.step(solver(obs))
        if terminated or truncated:
            break
    assert info["outcome"]["success"]


@needs_browser
def test_gui_submit_without_doing_the_task_fails(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    gui.reset(options={"task": make_task("enter-text", 11)})
    solver = gui.unwrapped.reference_solver()
    _click_field, _typed, click_submit = solver(None), solver(None), solver(None)
    _, reward, terminated, _, info = gui.step(click_submit)
    assert terminated and reward <= 0 and not info["outcome"]["success"]


@needs_browser
def test_gui_actions_outside_the_page_and_script_urls_do_nothing(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    gui.reset(options={"task": make_task("click-test", 5)})
    assert set(gui.unwrapped.toolset.names) == {"click", "type", "key", "scroll", "drag"}  # no navigation, no eval
    url = gui.unwrapped._session.url
    for action in ("click(-1, -1)", "click(100000, 5)", "drag(0, 0, 9999, 9999)",
                   'type("javascript:WOB_DONE_GLOBAL=true")', 'key("Enter")', 'type("javascript:core.endEpisode(1)")', 'key("F12")', 'key("Control+L")'):
        obs, reward, terminated, _, info = gui.step(action)
        assert reward == 0 and not terminated, action
    assert gui.unwrapped._session.url == url
    _, reward, terminated, _, info = gui.step("click(2, 2)")
    assert not terminated and reward == 0


@needs_browser
def test_gui_observation_holds_no_score_or_seed(gui) -> None:
    from agentgym.envs.gui.tasks import make_task

    for name, seed in (("click-test", 123457), ("enter-text", 987653), ("click-checkboxes", 424243)):
        obs, info = gui.reset(options={"task": make_task(name, seed)})
        text = obs["text"].lower()
        assert "page:" in text and "- button" in text, name  # the accessibility text is there ...
        assert "reward" not in text and "episodes done" not in text and str(seed) not in text, name  # ... without these
        assert str(seed) not in json.dumps(info, default=str), name
    _, info = gui.reset(seed=3)  # a sampled task: its id is a random tag, not the page seed
    assert str(gui.unwrapped.task.metadata["seed"]) not in info["task_id"]
