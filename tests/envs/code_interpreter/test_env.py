"""CodeInterpreter-v1: SimpleTIR turn semantics, persistent sandboxed state, suites solvable end to end."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym  # noqa: F401 - registers ids
from agentgym.envs.code_interpreter.env import CodeInterpreterEnv, TirParser, format_feedback
from agentgym.errors import ConfigError
from agentgym.suite import Task
from agentgym.registration.suites import load_suite
from agentgym.tools.sandbox import SandboxUnavailable

TASK = Task(id="t", prompt="What is 6 * 7?", answer="42",
            metadata={"source": "champ", "answers": ["42"], "reference_code": "print(6 * 7)"})


@pytest.fixture
def env():
    e = CodeInterpreterEnv(tasks=[TASK], max_turns=4)
    yield e
    e.close()


def step(env, text):
    return env.step(text)


def test_code_runs_state_persists_and_boxed_answer_scores(env):
    env.reset(seed=0)
    obs, reward, term, trunc, info = step(env, "First a variable.\n```python\nx = 6\nprint(x)\n```")
    assert obs == "Code execution result: 6\n" and info["turn"]["kind"] == "tool_call" and not term
    obs, *_ , info = step(env, "```python\ny = x * 7\ny\n```")
    assert obs == "Code execution result: 42\n"
    obs, reward, term, trunc, info = step(env, "So the answer is \\boxed{42}.")
    assert term and reward == 1.0 and info["turn"]["kind"] == "answer"
    assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "answered"}


def test_state_is_private_to_the_episode(env):
    env.reset(seed=0)
    step(env, "```python\nsecret = 1\n```")
    env.reset(seed=1)
    obs, *_ = step(env, "```python\nprint('secret' in globals())\n```")
    assert obs == "Code execution result: False\n"


def test_code_errors_are_feedback_not_void(env):
    env.reset(seed=0)
    obs, _, term, _, info = step(env, "```python\n1 / 0\n```")
    assert obs == "Code execution result: ZeroDivisionError: division by zero"
    assert info["turn"]["kind"] == "tool_call" and not term


def test_void_turn_ends_the_episode_by_default_and_can_continue():
    with CodeInterpreterEnv(tasks=[TASK]) as env:
        env.reset(seed=0)
        _, reward, term, _, info = env.step("I think about it without code.")
        assert term and reward == 0.0 and info["turn"]["kind"] == "void"
        assert info["outcome"]["end_reason"] == "failed"
    with CodeInterpreterEnv(tasks=[TASK], end_on_void=False) as env:
        env.reset(seed=0)
        _, _, term, _, info = env.step("Hmm.")
        assert info["turn"]["kind"] == "void" and not term
    # An unclosed fence (cut off by the token limit) is not code: void.
    with CodeInterpreterEnv(tasks=[TASK]) as env:
        env.reset(seed=0)
        assert env.step("```python\nx = 1")[4]["turn"]["kind"] == "void"


def test_answer_forms(env):
    for text in ("<answer>42</answer>", "The result: \\boxed{42}",
                 '<tool_call>{"name": "answer", "arguments": {"answer": "42"}}</tool_call>',
                 "```python\nfinal_answer(6 * 7)\n```"):
        env.reset(seed=0)
        _, reward, term, _, info = env.step(text)
        assert term and reward == 1.0 and info["outcome"]["success"], text


def test_only_the_first_code_block_runs_and_text_after_it_is_cut(env):
    env.reset(seed=0)
    obs, _, term, _, info = step(env, "```python\nprint(1)\n```\nand\n```python\nprint(2)\n```\n\\boxed{42}")
    assert obs == "Code execution result: 1\n" and not term  # the box after the block is discarded (SimpleTIR)
    assert [c["name"] for c in info["turn"]["calls"]] == ["python"]


def test_code_and_answer_before_it_both_count(env):
    env.reset(seed=0)
    _, reward, term, _, info = step(env, "\\boxed{42}\n```python\nprint('checked')\n```")
    assert term and reward == 1.0 and info["turn"]["calls"][0]["name"] == "python"


def test_turn_limit_truncates(env):
    env.reset(seed=0)
    for i in range(4):
        _, _, term, trunc, info = step(env, f"```python\nprint({i})\n```")
    assert trunc and not term and info["outcome"]["end_reason"] == "max_turns"


def test_timeouts_and_crashes_are_reported_and_the_episode_continues():
    with CodeInterpreterEnv(tasks=[TASK], sandbox={"wall_timeout_s": 1, "cpu_timeout_s": 1}) as env:
        env.reset(seed=0)
        step(env, "```python\nkeep = 1\n```")
        obs, *_ = step(env, "```python\nimport time\ntime.sleep(60)\n```")
        assert "restarted" in obs and "TimeoutError" in obs
        obs, *_ = step(env, "```python\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n```")
        assert "crashed" in obs or "died" in obs
        obs, *_, info = step(env, "```python\nprint(6 * 7)\n```")
        assert obs.endswith("Code execution result: 42\n")


def test_wrong_answer_scores_zero(env):
    env.reset(seed=0)
    _, reward, term, _, info = step(env, "\\boxed{41}")
    assert term and reward == 0.0 and not info["outcome"]["success"]


def test_feedback_styles():
    assert format_feedback("x" * 2000, "", max_chars=100).count("elided") == 1
    assert format_feedback("out", "Traceback...\nValueError: bad") == "Code execution result: ValueError: bad"
    full = format_feedback("out\n", "Traceback...\nValueError: bad", style="full")
    assert "out" in full and "Traceback" in full


def test_parser_never_raises_on_garbage():
    parser = TirParser()
    for text in ("", "```", "```python\n```", "\\boxed{", "\\boxed{1}}}", "<answer>", "\x00" * 100):
        parser.parse(text)


def test_bad_settings_say_how_to_fix():
    with pytest.raises(ConfigError, match="feedback"):
        CodeInterpreterEnv(feedback="verbose")
    with pytest.raises(ConfigError, match="Unknown sandbox option"):
        CodeInterpreterEnv(sandbox={"timeout": 3})


def test_no_isolation_refuses(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxUnavailable, match="dockerd|Docker"):
        gym.make("agentgym/CodeInterpreter-v1", sandbox={"backend": "docker"})


def test_sandbox_infrastructure_failure_ends_with_error():
    env = CodeInterpreterEnv(tasks=[TASK], sandbox={"max_workers": 3})
    env.reset(seed=0)
    env._pool.close()  # the sandbox machinery goes away mid-episode
    _, _, term, _, info = env.step("```python\nprint(1)\n```")
    assert term and info["outcome"]["end_reason"] == "error"
    env.close()


@pytest.mark.parametrize(("suite", "split"), [("code-smoke", None), ("code-test", None), ("champ", None)])
def test_reference_solver_validates_suites(suite, split):
    report = load_suite(suite).validate(split)
    assert report.ok, str(report)
