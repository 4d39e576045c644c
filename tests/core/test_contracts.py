"""Core contracts: light import, text space, env turn kinds, storage round-trip and crash safety."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.spaces import UnicodeText
from agentgym.storage import TrajectoryWriter, read_trajectories, to_hf_dataset
from agentgym.trajectory import Trajectory, Turn

REPO = Path(__file__).resolve().parents[2]


def test_import_agentgym_is_light() -> None:
    code = (
        "import sys, agentgym, agentgym.rollout, agentgym.policies, agentgym.cli, agentgym.testing\n"
        "heavy = [m for m in ('torch', 'vllm', 'playwright', 'docker', 'ray', 'transformers') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import agentgym pulled in heavy modules: {out.stdout}"


@given(st.text(max_size=200))
def test_unicode_text_contains_any_string(s: str) -> None:
    assert UnicodeText().contains(s)


def test_unicode_text_sample_is_honest() -> None:
    space = UnicodeText(max_length=50, seed=3)
    samples = [space.sample() for _ in range(200)]
    assert all(space.contains(s) for s in samples)
    assert any(ord(c) > 127 for s in samples for c in s), "samples should cover non-ASCII text"
    assert not space.contains(b"bytes") and not space.contains(None) and not space.contains("x" * 51)


def test_env_turn_kinds_and_outcome() -> None:
    env = gym.make("agentgym-test/Echo-v0")
    obs, info = env.reset(seed=1)
    assert {"task_id", "instructions", "tools"} <= set(info)
    _, _, term, trunc, info = env.step("no tool call here")
    assert info["turn"]["kind"] == "void" and not term and not trunc
    _, _, _, _, info = env.step('<tool_call>{"name": "echo", "arguments": {"text": 5}}</tool_call>')
    assert info["turn"]["kind"] == "invalid" and "text" in info["turn"]["tool_errors"][0]
    obs, reward, term, trunc, info = env.step('<tool_call>{"name": "stop", "arguments": {}}</tool_call>')
    assert info["turn"]["kind"] == "answer" and term and not trunc
    assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "answered"}
    with pytest.raises(Exception, match="reset"):
        env.step("again")
    env.close()
    env.close()


def test_env_truncates_at_max_turns() -> None:
    env = gym.make("agentgym-test/Echo-v0", max_turns=2)
    env.reset(seed=0)
    env.step('<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>')
    _, _, term, trunc, info = env.step("x")
    assert trunc and not term and info["outcome"]["end_reason"] == "max_turns"


def test_env_crash_ends_episode_with_error() -> None:
    env = gym.make("agentgym-test/Flaky-v0")
    env.reset(seed=0)
    # EnvCrashed raised inside a tool is reported as end_reason=error (the Flaky env raises in step itself,
    # which the engine handles; here a tool raising EnvCrashed is checked).
    from agentgym.errors import EnvCrashed

    def boom(text: str) -> str:
        raise EnvCrashed("sandbox died")

    from agentgym.toolset import Tool, ToolSet

    env.unwrapped.toolset = ToolSet([Tool.from_function(boom, name="echo")])
    _, _, term, _, info = env.step('<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>')
    assert term and info["outcome"]["end_reason"] == "error"


def _trajectory(i: int, obs: str = "obs", action: str = "act") -> Trajectory:
    return Trajectory(
        env_id="agentgym/Echo-v0", task_id=f"t{i}", seed=i,
        turns=(Turn(observation=obs, action=action, reward=0.5, info={"kind": "tool_call", "calls": []},
                    prompt_token_ids=(1, 2, 3), action_token_ids=(4, 5), action_logprobs=(-0.1, -2.5),
                    action_entropies=(0.3, 1.0), finish_reason="stop"),),
        outcome={"success": True, "score": 1.0, "end_reason": "answered"}, end_reason="answered",
        policy="p", timing={"wall_s": 0.25}, traj_id=f"id{i}", group_id="g",
    )


@settings(max_examples=40, deadline=None)
@given(obs=st.text(), action=st.text(), lp=st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_jsonl_round_trip_is_lossless(tmp_path_factory: pytest.TempPathFactory, obs: str, action: str, lp: float) -> None:
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    traj = _trajectory(0, obs, action)
    traj = Trajectory(**{**traj.__dict__, "turns": (Turn(**{**traj.turns[0].__dict__, "action_logprobs": (lp, -0.0)}),)})
    with TrajectoryWriter(path) as writer:
        writer.write(traj)
    (back,) = list(read_trajectories(path))
    assert back == traj
    assert math.copysign(1, back.turns[0].action_logprobs[1]) == -1


def test_token_view_mask() -> None:
    view = _trajectory(0).token_view()
    assert view.input_ids == (1, 2, 3, 4, 5)
    assert view.loss_mask == (0, 0, 0, 1, 1)
    assert view.logprobs == (0.0, 0.0, 0.0, -0.1, -2.5)


def test_reader_skips_torn_final_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(_trajectory(0))
        writer.write(_trajectory(1))
    with path.open("ab") as fh:
        fh.write(json.dumps(_trajectory(2).to_dict()).encode()[:40])
    assert [t.task_id for t in read_trajectories(path)] == ["t0", "t1"]


def test_reader_rejects_other_schema_versions(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record = _trajectory(0).to_dict()
    record["schema_version"] = 99
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="schema_version"):
        list(read_trajectories(path))


def test_export_to_hf_dataset() -> None:
    pytest.importorskip("datasets")
    ds = to_hf_dataset([_trajectory(0), _trajectory(1)])
    assert ds.num_rows == 2 and ds[1]["task_id"] == "t1" and ds[0]["success"] is True


def test_sigkill_midway_leaves_finished_trajectories_readable(tmp_path: Path) -> None:
    path = tmp_path / "traj.jsonl"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import tests.conftest
        from agentgym.policies import ScriptedPolicy
        from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
        from agentgym.storage import TrajectoryWriter
        policy = ScriptedPolicy(['<tool_call>{{"name": "echo", "arguments": {{"text": "x"}}}}</tool_call>',
                                 '<tool_call>{{"name": "stop", "arguments": {{}}}}</tool_call>'], delay_s=0.05)
        specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i) for i in range(100000)]
        with TrajectoryWriter({str(path)!r}) as w:
            RolloutEngine(policy, RolloutConfig(max_in_flight=8)).run(specs, writer=w)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    deadline = time.time() + 60
    while time.time() < deadline:
        if path.exists() and path.stat().st_size > 20_000:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    trajectories = list(read_trajectories(path))
    assert len(trajectories) >= 10
    assert all(t.success for t in trajectories)


def test_jsonable_copies_any_nesting_to_plain_json_without_aliasing_the_input() -> None:
    """Every turn's info goes through ``jsonable``: the result must survive a JSON round trip unchanged and share no
    container with what the env returned (an env that edits its info later must not rewrite a trajectory)."""
    import numpy as np

    from agentgym.trajectory import jsonable

    leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False)
    values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=4) | st.integers(), inner, max_size=4) | st.tuples(inner, inner), max_leaves=25)

    def containers(value, out):  # type: ignore[no-untyped-def]
        if isinstance(value, (dict, list)):
            out.add(id(value))
            for item in (value.values() if isinstance(value, dict) else value):
                containers(item, out)
        return out

    @settings(max_examples=300, deadline=None)
    @given(values)
    def check(value) -> None:  # type: ignore[no-untyped-def]
        out = jsonable(value)
        assert json.loads(json.dumps(out, allow_nan=False)) == out
        assert not containers(out, set()) & containers(value, set())

    check()
    info = {"calls": [{"arguments": {"x": (1, np.int64(2))}}], "errors": [], "score": float("inf"), 3: np.float32(0.5)}
    assert jsonable(info) == {"calls": [{"arguments": {"x": [1, 2]}}], "errors": [], "score": "inf", "3": 0.5}
