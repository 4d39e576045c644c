"""MiniWoB attacked as an adversarial policy would, in real Chromium: markup typed into a page that echoes it as
HTML (handlers that call the page's own success hook or set its reward globals, links, forms and <meta refresh>
to another task's page), browser shortcuts that would reload or leave the page, garbage actions, forged reward
values and steps after the end. None scores, none errors the episode, and the env keeps working."""

from __future__ import annotations

import pytest

from tests.helpers.browsers import HAVE_BROWSER, needs_browser

pytestmark = needs_browser


@pytest.fixture(scope="module")
def terminal():
    if not HAVE_BROWSER:
        pytest.skip("needs Chromium and playwright")
    import gymnasium as gym

    env = gym.make("agentgym/MiniWoB-v0", task_id="terminal")
    yield env
    env.close()


def _type_into_terminal(env, markup: str, seed: int = 7) -> list[tuple[float, bool, dict]]:
    """The terminal task echoes each command line into innerHTML: type ``markup`` there and press Enter."""
    from agentgym.envs.gui.tasks import make_task

    env.reset(options={"task": make_task("terminal", seed)})
    steps = []
    for action in ("click(80, 150)", f"type({markup!r})", 'key("Enter")', 'key("Shift")', 'key("Shift")'):
        _, reward, terminated, truncated, info = env.step(action)
        steps.append((reward, terminated, info))
        if terminated or truncated:
            break
    return steps


INJECTIONS = [
    "<img src=x onerror=core.endEpisode(1)>",  # the page's own success hook (scored 1.0 before the page policy)
    "<img src=x onerror=WOB_RAW_REWARD_GLOBAL=1e9;WOB_DONE_GLOBAL=true>",  # the reward globals, set directly
    "<svg onload=core.endEpisode(1,false,'x')>",
    "<iframe srcdoc='<script>parent.core.endEpisode(1)</script>'></iframe>",
    "<meta http-equiv=refresh content=0;url=/miniwob/click-test.html>",  # another task's page (errored before)
    "<meta http-equiv=refresh content=0;url=/miniwob/terminal.html>",  # a reload: a fresh, unseeded problem
]


@pytest.mark.parametrize("markup", INJECTIONS, ids=["endEpisode", "globals", "svg", "srcdoc", "refresh-away",
                                                    "refresh-reload"])
def test_markup_typed_into_the_page_runs_nothing_and_scores_nothing(terminal, markup: str) -> None:
    steps = _type_into_terminal(terminal, markup)
    assert all(reward <= 0.0 for reward, _, _ in steps), steps
    assert not any(info.get("outcome", {}).get("success") for _, _, info in steps)
    assert not any(info.get("outcome", {}).get("end_reason") == "error" for _, _, info in steps)
    done, raw = terminal.unwrapped._session.evaluate("() => [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL]")
    assert not done and raw == 0  # the handler never ran
    assert terminal.unwrapped._session.url.endswith("/miniwob/terminal.html")  # and the page never left


def test_a_typed_link_or_form_to_another_task_does_not_navigate(terminal) -> None:
    session = terminal.unwrapped._session
    for markup in ("<a id=go href=/miniwob/click-test.html>GOGOGOGOGOGOGOGOGOGO</a>",
                   "<form action=/miniwob/click-test.html><button id=go>GOGOGOGOGOGOGOGOGOGO</button></form>"):
        _type_into_terminal(terminal, markup)
        x, y = session.evaluate("() => { const r = document.getElementById('go').getBoundingClientRect(); "
                                "return [r.x + 5, r.y + r.height / 2]; }")  # the agent sees it on the screenshot
        _, reward, terminated, _, info = terminal.step(f"click({int(x)}, {int(y)})")
        _, reward2, terminated2, _, info2 = terminal.step('key("Shift")')
        assert session.url.endswith("/miniwob/terminal.html"), markup
        assert reward == reward2 == 0.0 and not terminated and not terminated2


def test_the_honest_terminal_solution_still_scores(terminal) -> None:
    from agentgym.envs.gui.tasks import make_task

    obs, _ = terminal.reset(options={"task": make_task("terminal", 7)})
    files = terminal.unwrapped._session.evaluate("() => currentFiles")
    extension = terminal.unwrapped._utterance.rsplit(".", 1)[-1].strip()
    target = next(f for f in files if f.endswith("." + extension))
    for action in ("click(80, 150)", f'type("rm {target}")', 'key("Enter")', 'key("Shift")'):
        _, reward, terminated, _, info = terminal.step(action)
        if terminated:
            break
    assert terminated and info["outcome"]["success"] and reward == pytest.approx(1.0)


def test_forged_reward_values_are_clamped_and_other_documents_never_score(terminal) -> None:
    """Defence in depth, should a page ever run foreign code: a reward beyond MiniWoB's range is cut to 1, and
    the globals of a document other than the episode's own page are not read as the task's result."""
    from agentgym.envs.gui.tasks import make_task

    session = terminal.unwrapped._session
    terminal.reset(options={"task": make_task("terminal", 7)})
    session.evaluate("() => { WOB_RAW_REWARD_GLOBAL = 1e9; WOB_DONE_GLOBAL = true; }")
    _, reward, terminated, _, info = terminal.step('key("Shift")')
    assert terminated and reward == 1.0 and info["outcome"]["score"] == 1.0
    terminal.reset(options={"task": make_task("terminal", 7)})
    session.goto("/miniwob/click-test.html")  # what a navigation would show: another page, its own globals
    session.evaluate("() => { WOB_RAW_REWARD_GLOBAL = 1; WOB_DONE_GLOBAL = true; }")
    obs, reward, terminated, _, info = terminal.step('key("Shift")')
    assert terminated and reward == 0.0 and info["outcome"] == {"success": False, "score": 0.0, "end_reason": "failed"}
    assert "left the task's page" in obs["text"]


GARBAGE = [
    "x" * 5000, "\x00\x00", 'type("\x00abc")', 'type("\ud800")', "type(" + repr("a" * 5000) + ")", "click(1e400, 5)",
    "click(-1, 5)", "click(99999999999999999999999, 3)", 'click("10", "10")', "click(None, None)", "scroll(5, 5, 1e308)",
    'key("")', 'key("Control+Alt+Shift+Meta+F13")', 'key("' + "a" * 100 + '")', "drag(0, 0)",
    '<tool_call>{"name": "click", "arguments": {"x": [1], "y": {"a": 1}}}</tool_call>',
    "<tool_call>" + "[" * 50_000 + "</tool_call>", '<tool_call>{"name": "evaluate", "arguments": {"js": "1"}}</tool_call>',
    'goto("file:///etc/passwd")', 'navigate("javascript:core.endEpisode(1)")', "click_mark(3)",
    'key("F5")', 'key("Control+r")', 'key("Alt+ArrowLeft")', 'key("Control+w")', 'key("Control+t")', 'key("Alt+F4")',
]


def test_garbage_actions_score_zero_and_the_env_survives(terminal) -> None:
    from agentgym.envs.gui.tasks import make_task

    terminal.reset(options={"task": make_task("click-test", 3)})
    url = terminal.unwrapped._session.url
    for action in GARBAGE:
        _, reward, terminated, truncated, info = terminal.step(action)
        assert reward == 0.0 and not terminated, (action[:40], info)
        if truncated:
            terminal.reset(options={"task": make_task("click-test", 3)})
    assert terminal.unwrapped._session.url == url  # no shortcut reloaded or left the page
    obs, _ = terminal.reset(options={"task": make_task("click-test", 3)})
    solver = terminal.unwrapped.reference_solver()
    for _ in range(3):
        obs, _, terminated, _, info = terminal.step(solver(obs))
        if terminated:
            break
    assert info["outcome"]["success"]


def test_stepping_after_the_end_and_odd_resets_are_clear_errors(terminal) -> None:
    from agentgym.envs.gui.tasks import make_task
    from agentgym.errors import AgentGymError, TaskError

    terminal.reset(options={"task": make_task("click-test", 3)})
    terminal.unwrapped._session.evaluate("() => { WOB_RAW_REWARD_GLOBAL = -1; WOB_DONE_GLOBAL = true; }")
    terminal.step('key("Shift")')
    with pytest.raises(AgentGymError, match="reset"):
        terminal.step("click(5, 5)")
    with pytest.raises(TaskError):
        terminal.reset(options={"task": {"id": "t", "prompt": "p", "metadata": {"task": "../../etc/passwd"}}})
    with pytest.raises(TaskError):
        terminal.reset(options={"task": {"id": "t", "prompt": "p", "metadata": {"task": "click-test", "seed": "1e400"}}})
    with pytest.raises(AgentGymError):
        terminal.reset(options={"seed_override": 1})
    terminal.reset(seed=2**63 - 1)  # a huge seed is only a seed
    _, reward, terminated, _, _ = terminal.step("click(1, 1)")
    assert reward <= 0.0
