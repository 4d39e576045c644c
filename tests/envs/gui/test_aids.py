"""MiniWoB-v0 agent aids: set-of-marks, screenshots of any size, accessibility text, and the fast look.

Every env here uses the process-wide browser pool, so the whole file starts one Chromium.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from agentgym.envs.gui.tasks import make_task

from agentgym.errors import ConfigError
from agentgym.testing import check_agent_env
from tests.helpers.browsers import HAVE_BROWSER, needs_browser

if "agentgym/MiniWoB-v0" not in gym.registry:
    gym.register(id="agentgym/MiniWoB-v0", entry_point="agentgym.envs.gui.env:MiniWoBEnv")

pytestmark = needs_browser

#: Records every mousedown's page coordinates (test instrumentation only; the env never adds listeners).
RECORD_CLICKS_JS = ("() => { window.__downs = []; document.addEventListener('mousedown', "
                    "(e) => window.__downs.push([e.clientX, e.clientY]), true); }")
BUTTON_CENTER_JS = ("() => { const r = document.getElementById('subbtn').getBoundingClientRect(); "
                    "return [r.left + r.width / 2, r.top + r.height / 2]; }")


@pytest.fixture(scope="module")
def envs():
    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    made: dict[str, gym.Env] = {}

    def get(name: str, **kwargs: object) -> gym.Env:
        if name not in made:
            made[name] = gym.make("agentgym/MiniWoB-v0", **kwargs)
        return made[name]

    yield get
    for env in made.values():
        env.close()


def _marks(text: str) -> dict[int, str]:
    return {int(n): rest for n, rest in re.findall(r"^\[(\d+)\] (.*)$", text, re.MULTILINE)}


def test_set_of_marks_are_listed_drawn_and_clickable_by_id(envs):
    plain, marked = envs("plain"), envs("marks", set_of_marks=True)
    task = make_task("click-checkboxes", 7)
    plain_obs, plain_info = plain.reset(options={"task": task})
    obs, info = marked.reset(options={"task": task})
    assert "click_mark" in [t["function"]["name"] for t in info["tools"]]
    assert "click_mark" not in [t["function"]["name"] for t in plain_info["tools"]]
    assert "click_mark(n)" in info["instructions"] and "Marks" not in plain_obs["text"]
    marks = _marks(obs["text"])
    boxes = {n: re.match(r'checkbox "(.*)" \(not checked\)', d) for n, d in marks.items()}
    labels = {m.group(1): n for n, m in boxes.items() if m}
    submit = next(n for n, d in marks.items() if d == 'button "Submit"')
    assert len(labels) >= 2 and sorted(marks) == list(range(1, len(marks) + 1))
    # The boxes are drawn on the pixels, not in the page: only the image differs, and only near the marks.
    changed = np.any(obs["image"] != plain_obs["image"], axis=2)
    assert changed.mean() > 0.01
    inside = np.zeros_like(changed)
    for mark in marked.unwrapped._marks.values():
        x, y, w, h = (int(v) for v in mark.box)
        inside[max(0, y - 12):y + h + 2, max(0, x - 2):x + w + 14] = True
    assert not (changed & ~inside).any()
    page_html = "() => Array.from(document.querySelectorAll('*'), (e) => e.tagName + '#' + e.id + '.' + e.className)"
    assert marked.unwrapped._session.evaluate(page_html) == plain.unwrapped._session.evaluate(page_html)

    wanted = re.match(r"Select (.*) and click Submit\.", obs["text"].split("Task: ")[1].splitlines()[0]).group(1)
    wanted = [] if wanted == "nothing" else wanted.split(", ")
    for name in wanted:  # the function-call format...
        obs, reward, terminated, _, step_info = marked.step(f"click_mark({labels[name]})")
        assert step_info["turn"]["kind"] == "tool_call" and not terminated
        assert f'[{labels[name]}] checkbox "{name}" (checked)' in obs["text"]
    # ...and the Hermes format; the page's own reward logic scores it.
    action = f'<tool_call>{{"name": "click_mark", "arguments": {{"mark": {submit}}}}}</tool_call>'
    _, reward, terminated, _, step_info = marked.step(action)
    assert terminated and reward == 1.0 and step_info["outcome"]["success"]


def test_bad_mark_ids_are_invalid_turns_not_crashes(envs):
    marked = envs("marks", set_of_marks=True)
    obs, _ = marked.reset(options={"task": make_task("click-test", 2)})
    count = len(_marks(obs["text"]))
    assert count >= 1
    for action in (f"click_mark({count + 1})", "click_mark(0)", "click_mark(-3)", 'click_mark("one")', "click_mark()",
                   "click_mark(1, 2)", "click_mark(1e309)", "click_mark(True)",
                   '<tool_call>{"name": "click_mark", "arguments": {"mark": 99999999999999999999}}</tool_call>'):
        obs, reward, terminated, truncated, info = marked.step(action)
        assert marked.observation_space.contains(obs), action
        assert info["turn"]["kind"] == "invalid" and "Error" in obs["text"] and not terminated, action
        if truncated:
            marked.reset(options={"task": make_task("click-test", 2)})
    obs, _, _, _, _ = marked.step(f"click_mark({count + 5})")
    assert f"the marks are 1 to {count}" in obs["text"]
    plain = envs("plain")
    plain.reset(options={"task": make_task("click-test", 2)})
    _, _, _, _, info = plain.step("click_mark(1)")  # not a tool without set_of_marks
    assert info["turn"]["kind"] in ("void", "invalid")


@pytest.mark.parametrize("size", [(80, 105), (320, 420), (500, 300), (97, 233), (1000, 1000)])
def test_screenshot_size_maps_clicks_back_to_the_page_exactly(envs, size):
    env = envs(f"size{size}", screenshot_size=size)
    unwrapped = env.unwrapped
    obs, info = env.reset(options={"task": make_task("click-test", 4)})
    assert obs["image"].shape == (size[1], size[0], 3) and env.observation_space.contains(obs)
    assert f"({size[0]}x{size[1]} pixels)" in info["instructions"] and f"Screen: {size[0]}x{size[1]}" in obs["text"]
    sw, sh = unwrapped.screen
    for px in range(sw):  # the mapping round-trips every whole page pixel exactly
        assert unwrapped.to_page(*unwrapped.to_image(px, px * sh // sw)) == (px, px * sh // sw)
    unwrapped._session.evaluate(RECORD_CLICKS_JS)
    bx, by = unwrapped._session.evaluate(BUTTON_CENTER_JS)
    points = [(px, py) for px, py in [(3, 60), (17, 99), (80, 150), (159, 209), (101, 77), (0, 0), (44, 180)]
              if abs(px - bx) > 40 or abs(py - by) > 20]  # anywhere but on the button
    assert len(points) >= 4
    for px, py in points:
        x, y = unwrapped.to_image(px, py)
        obs, _, terminated, _, step_info = env.step(f"click({x!r}, {y!r})")
        assert step_info["turn"]["kind"] == "tool_call" and not terminated
    assert unwrapped._session.evaluate("() => window.__downs") == [list(p) for p in points]
    # A whole-pixel click on the button's centre in image space scores the task.
    bx, by = unwrapped.to_image(bx, by)
    _, reward, terminated, _, _ = env.step(f"click({round(bx)}, {round(by)})")
    assert terminated and reward == 1.0


def test_scaled_screens_refuse_points_outside_the_image(envs):
    env = envs("size(80, 105)", screenshot_size=(80, 105))
    env.reset(options={"task": make_task("click-test", 4)})
    for action in ("click(80, 10)", "click(10, 105)", "click(-0.5, 3)", "drag(1, 1, 200, 5)", "scroll(100, 5, 10)",
                   "click(159, 209)"):  # the last is inside the page, but not inside the 80x105 image
        obs, _, terminated, _, info = env.step(action)
        assert info["turn"]["kind"] == "invalid" and "80x105" in obs["text"] and not terminated, action
    obs, _, _, _, info = env.step("click(79.99, 104.99)")
    assert info["turn"]["kind"] == "tool_call"
    with pytest.raises(ConfigError, match="screenshot_size"):
        gym.make("agentgym/MiniWoB-v0", screenshot_size=(8, 100))
    with pytest.raises(ConfigError, match="screenshot_size"):
        gym.make("agentgym/MiniWoB-v0", screenshot_size=(100.5, 100))


def test_reference_solver_acts_in_screenshot_pixels(envs):
    env = envs("size(97, 233)", screenshot_size=(97, 233))
    for task in ("login-user", "click-checkboxes"):
        obs, _ = env.reset(options={"task": make_task(task, 12)})
        solve = env.unwrapped.reference_solver()
        for _ in range(env.unwrapped.max_turns):
            obs, reward, terminated, truncated, info = env.step(solve(obs))
            if terminated or truncated:
                break
        assert info["outcome"]["success"], (task, info)


def test_accessibility_text_is_off_by_default_and_beside_the_pixels_when_on(envs):
    plain, tree = envs("plain"), envs("aria", accessibility=True)
    task = make_task("login-user", 3)
    plain_obs, _ = plain.reset(options={"task": task})
    obs, info = tree.reset(options={"task": task})
    assert "Page:" not in plain_obs["text"] and "accessibility tree" not in plain.unwrapped.instructions()
    assert "accessibility tree" in info["instructions"]
    page = obs["text"].split("Page:\n", 1)[1]
    assert '- button "Login"' in page and "textbox" in page
    assert np.array_equal(obs["image"], plain_obs["image"])  # the text is beside the pixels, not on them


def test_fast_look_gives_the_same_pixels_as_playwright_screenshots(envs):
    env = envs("plain")
    env.reset(options={"task": make_task("enter-text", 5)})
    session = env.unwrapped._session
    env.step(env.unwrapped.reference_solver()(None))  # focus the field: a caret would blink here
    env.step('type("abc")')
    view = session.observe("() => 41 + 1")
    assert view.value == 42 and view.aria is None
    assert np.array_equal(view.image, session.screenshot())
    assert np.array_equal(session.observe().image, view.image)


def test_a_page_other_than_the_tasks_ends_the_episode_as_a_failure(envs):
    env = envs("marks", set_of_marks=True)
    env.reset(options={"task": make_task("click-test", 2)})
    env.unwrapped._session.goto("/core/core.css")  # no MiniWoB globals here (the agent cannot get here itself)
    obs, reward, terminated, _, info = env.step("click(5, 5)")
    assert info["turn"]["kind"] == "tool_call" and terminated and reward == 0.0
    assert info["outcome"] == {"success": False, "score": 0.0, "end_reason": "failed"}
    assert "left the task's page" in obs["text"] and "(no interactive elements marked)" in obs["text"]


@pytest.mark.slow  # check_agent_env steps ~200 times through a real browser: ~30 s idle, minutes under load
def test_contract_with_every_aid_on():
    check_agent_env("agentgym/MiniWoB-v0", fuzz_examples=3,
                    env_kwargs={"set_of_marks": True, "screenshot_size": (120, 300), "accessibility": True})


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [{"set_of_marks": True}, {"screenshot_size": (240, 315)},
                                    {"accessibility": True}])
def test_contract_with_each_aid_on(kwargs):
    check_agent_env("agentgym/MiniWoB-v0", fuzz_examples=6, env_kwargs=kwargs)
