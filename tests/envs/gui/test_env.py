"""MiniWoB-v0: the 128 bundled tasks, pixel actions, the pages' own rewards, screenshots, garbage actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from agentgym.envs.gui.miniwob import native_screen, task_ids, task_path
from agentgym.envs.gui.solvers import SOLVABLE_TASKS
from agentgym.envs.gui.tasks import generate_tasks, make_task

from agentgym.errors import TaskError
from agentgym.registration.suites import load_suite
from tests.helpers.browsers import HAVE_BROWSER, needs_browser

if "agentgym/MiniWoB-v0" not in gym.registry:
    gym.register(id="agentgym/MiniWoB-v0", entry_point="agentgym.envs.gui.env:MiniWoBEnv")



@pytest.fixture(scope="module")
def env():
    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    e = gym.make("agentgym/MiniWoB-v0")
    yield e
    e.close()


def test_all_128_bundled_tasks_are_listed_with_their_pages():
    ids = task_ids()
    assert len(ids) == 128 and len(set(ids)) == 128
    assert {"click-button", "enter-text", "flight.AA", "book-flight", "use-autocomplete"} <= set(ids)
    assert task_path("click-button") == "/miniwob/click-button.html"
    assert task_path("flight.AA") == "/flight/AA/wrapper.html" and native_screen("flight.AA") == (375, 667)
    with pytest.raises(TaskError, match="did you mean|Did you mean"):
        task_path("click-buton")
    suite = load_suite("gui-all")
    for split in ("train", "test"):
        assert sorted(t.metadata["task"] for t in suite.split(split)) == sorted(ids)
    assert not {t.metadata["seed"] for t in suite.train} & {t.metadata["seed"] for t in suite.test}
    smoke = load_suite("gui-smoke")
    assert {t.metadata["task"] for t in smoke} <= set(SOLVABLE_TASKS)
    assert generate_tasks(__import__("random").Random(1), 3, tasks=["click-test"])[0].metadata["task"] == "click-test"


@needs_browser
def test_gui_smoke_suite_is_solved_by_pixel_actions():
    report = load_suite("gui-smoke").validate()
    assert report.ok, str(report)


@needs_browser
def test_observation_reward_and_episode_end(env):
    obs, info = env.reset(options={"task": make_task("click-test", 5)})
    assert set(obs) == {"text", "image"} and obs["image"].shape == (210, 160, 3)
    assert "Task: Click the button." in obs["text"] and "click(x, y)" in info["instructions"]
    button = env.unwrapped._session.evaluate(
        "() => { const r = document.getElementById('subbtn').getBoundingClientRect(); "
        "return [Math.round(r.left + r.width / 2), Math.round(r.top + r.height / 2)]; }")
    # A click beside the button does nothing; the page's own handler scores the click on it.
    obs, reward, terminated, _, info = env.step("click(2, 2)")
    assert not terminated and reward == 0.0 and info["turn"]["kind"] == "tool_call"
    obs, reward, terminated, _, info = env.step(f"click({button[0]}, {button[1]})")
    assert terminated and reward == 1.0 and info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}
    assert "reward 1.00" in obs["text"]


@needs_browser
def test_wrong_answers_get_the_pages_negative_reward(env):
    env.reset(options={"task": make_task("enter-text", 11)})
    solver = env.unwrapped.reference_solver()
    click_field, _typed, click_submit = solver(None), solver(None), solver(None)
    env.step(click_field)
    env.step('type("not the word")')
    _, reward, terminated, _, info = env.step(click_submit)
    assert terminated and reward == -1.0 and info["outcome"]["end_reason"] == "failed"


@needs_browser
def test_garbage_actions_become_error_observations(env):
    env.reset(options={"task": make_task("click-button", 3)})
    for action in ("click(-5, 10)", "click(10, 99999)", 'click("a", "b")', 'key("NoSuchKey")', "key()",
                   "type(" + repr("x" * 5000) + ")", "scroll(10, 10, 1e9)", "drag(0, 0, 500, 500)", "click()",
                   '<tool_call>{"name": "click", "arguments": {"x": 1e308, "y": 3}}</tool_call>'):
        obs, _, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs), action
        assert info["turn"]["kind"] == "invalid" and "Error" in obs["text"] and not terminated, action
        if truncated:
            env.reset(options={"task": make_task("click-button", 3)})


@needs_browser
def test_every_kind_of_task_page_starts(env):
    big = gym.make("agentgym/MiniWoB-v0", screen=(375, 667), accessibility=True)
    try:
        for name in ("flight.AA", "book-flight", "use-autocomplete", "drag-box", "simple-algebra", "tic-tac-toe"):
            obs, _ = big.reset(options={"task": make_task(name, 1)})
            assert obs["image"].shape == (667, 375, 3) and obs["text"].startswith("Task: ")
            assert len(obs["text"].splitlines()[0]) > len("Task: ") and "Page:" in obs["text"]
            obs, *_ = big.step("scroll(80, 100, 50)")
            assert big.observation_space.contains(obs)
    finally:
        big.close()


@needs_browser
def test_screenshots_look_right(env, tmp_path):
    from PIL import Image

    obs, _ = env.reset(options={"task": make_task("login-user", 4)})
    path = tmp_path / "miniwob.png"
    Image.fromarray(obs["image"]).save(path)
    saved = np.asarray(Image.open(path).convert("RGB"))
    assert saved.shape == (210, 160, 3)
    assert saved.std() > 10 and len(np.unique(saved.reshape(-1, 3), axis=0)) > 10  # not blank
    top = saved[5:40, :, :].reshape(-1, 3)
    assert ((top[:, 0] > 200) & (top[:, 1] > 200) & (top[:, 2] < 80)).mean() > 0.5  # the yellow task banner
    again, _ = env.reset(options={"task": make_task("login-user", 4)})
    assert np.array_equal(again["image"], obs["image"])  # same seed, same pixels
    assert env.unwrapped.render_mode is None
