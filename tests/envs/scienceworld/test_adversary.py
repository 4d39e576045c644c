"""ScienceWorld attacked as an adversarial policy would, on the real simulator (a JVM): debug and gold-path verbs,
``reset task`` loops to farm the focus points, garbage commands and wrong argument types, steps after the end and
odd resets. None earns a point beyond the honest score, none errors the episode, and the env keeps working."""

from __future__ import annotations

import json
import random
import shutil

import gymnasium as gym
import pytest

pytest.importorskip("scienceworld", reason="pip install 'agentgym[scienceworld]'")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs a Java runtime (apt-get install default-jre-headless)", allow_module_level=True)

import agentgym  # noqa: E402,F401 - registers the ids
from agentgym.errors import AgentGymError, TaskError  # noqa: E402


def _call(text: object) -> str:
    return "<tool_call>" + json.dumps({"name": "command", "arguments": {"text": text}}) + "</tool_call>"


@pytest.fixture(scope="module")
def env():  # type: ignore[no-untyped-def]
    env = gym.make("agentgym/ScienceWorld-v0", max_turns=400)
    yield env
    env.close()


SPECIAL_VERBS = ["score", "debug", "gold", "gold path", "get gold path", "oracle", "cheat", "valid actions", "help",
                 "objects", "task", "teleport to kitchen", "open all doors", "save", "load", "quit", "exit", "undo",
                 "history", "print", "reset", "restart", "win", "complete task", "focus on red box"]


def test_special_verbs_reveal_no_gold_path_and_score_nothing(env) -> None:  # type: ignore[no-untyped-def]
    env.reset(seed=0)
    gold = [a for a in env.unwrapped._gold if a.startswith(("focus on", "move"))]
    total = 0.0
    for verb in SPECIAL_VERBS[:-1]:
        obs, reward, terminated, truncated, info = env.step(_call(verb))
        total += reward
        assert not terminated and info["turn"]["kind"] != "invalid", verb
        assert not any(step in obs for step in gold), verb  # the gold actions are never shown
    assert total == 0.0


def test_reset_task_loops_farm_nothing(env) -> None:  # type: ignore[no-untyped-def]
    env.reset(seed=0)
    gold = list(env.unwrapped._gold)
    focus = next(a for a in gold if a.startswith("focus on"))
    rewards = []
    for action in gold[:gold.index(focus) + 1] + ["reset task", focus] * 4:
        _, reward, terminated, _, info = env.step(_call(action))
        rewards.append(reward)
    positive = sum(r for r in rewards if r > 0)
    assert positive > 1.0  # each focus is paid again ...
    assert sum(rewards) == pytest.approx(env.unwrapped._sim_score / 100.0)  # ... and taken back by each reset
    assert sum(rewards) < 1.0
    for action in gold[gold.index(focus) + 1:]:
        _, reward, terminated, truncated, info = env.step(_call(action))
        rewards.append(reward)
        if terminated or truncated:
            break
    assert info["outcome"]["score"] == 1.0 and sum(rewards) == pytest.approx(1.0)  # the return is the score


def test_garbage_commands_score_zero_and_never_error(env) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    garbage: list[object] = ["x" * 5000, "\x00look around", "\ud800", "look\naround", "look around" * 30, 1e400, -1,
                             10**30, None, True, ["look", "around"], {"a": 1}, "", "   ", "é" * 10]
    garbage += ["".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(1, 200))) for _ in range(12)]
    env.reset(seed=0)
    for text in garbage:
        _, reward, terminated, truncated, info = env.step(_call(text) if not isinstance(text, float) else
                                                          '<tool_call>{"name": "command", "arguments": '
                                                          '{"text": 1e400}}</tool_call>')
        assert reward == 0.0 and not terminated, text
        assert not (info.get("outcome") or {}).get("end_reason") == "error"
    for reply in ("x" * 25_000, "<tool_call>" + "[" * 50_000 + "</tool_call>",
                  '<tool_call>{"name": "command", "arguments": {"text": "look around", "debug": true}}</tool_call>'):
        _, reward, terminated, _, info = env.step(reply)
        assert reward == 0.0 and not terminated and info["turn"]["kind"] == "invalid"
    # The simulator survives: the gold path still solves the task.
    env.reset(seed=0)
    solver = env.unwrapped.reference_solver()
    obs = ""
    for _ in range(30):
        obs, _, terminated, truncated, info = env.step(solver(obs))
        if terminated or truncated:
            break
    assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}


def test_stepping_after_the_end_and_odd_resets_are_clear_errors(env) -> None:  # type: ignore[no-untyped-def]
    env.reset(seed=0)
    obs = ""
    solver = env.unwrapped.reference_solver()
    while True:
        obs, _, terminated, truncated, _ = env.step(solver(obs))
        if terminated or truncated:
            break
    with pytest.raises(AgentGymError, match="reset"):
        env.step(_call("look around"))
    for metadata in ({"task_name": "boil", "variation": 10**9}, {"task_name": "boil", "variation": "1e400"},
                     {"task_name": "../../etc/passwd", "variation": 0}, {"task_name": "boil"}):
        with pytest.raises(TaskError):
            env.reset(options={"task": {"id": "t", "prompt": "p", "metadata": metadata}})
    with pytest.raises(AgentGymError):
        env.reset(options={"gold": True})
    env.reset(seed=2**63 - 1)
    _, reward, terminated, _, _ = env.step(_call("look around"))
    assert reward == 0.0 and not terminated
