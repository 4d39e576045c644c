"""No lost data: any string an env or model produces is stored and read back exactly, and one trajectory that
cannot be stored never costs the others."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentgym.policies import ScriptedPolicy
from agentgym.cli.report import write_html_report
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.storage import TrajectoryWriter, errors_path, read_trajectories, to_hf_dataset
from agentgym.trajectory import Trajectory, Turn

# Every code point, lone surrogates included (Hypothesis leaves category Cs out unless told).
ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60)


def _trajectory(text: str, i: int = 0) -> Trajectory:
    return Trajectory(
        env_id="agentgym-test/Echo-v0", task_id=f"t{i}-{text}", seed=i,
        turns=(Turn(observation=text, action=text + "!", reward=1.0, info={"kind": "tool_call", text: [text]},
                    prompt_token_ids=(1, 2), action_token_ids=(3,), action_logprobs=(-0.5,), finish_reason="stop"),),
        outcome={"success": True, "score": 1.0, "end_reason": "answered"}, end_reason="answered", policy="p",
        traj_id=f"id{i}", metadata={"final_observation": text},
    )


@settings(max_examples=150, deadline=None)
@given(text=ANY_TEXT)
@example(text="\ud800")  # print('\ud800') in model code
@example(text="\ud83d\ude00")  # a high then a low surrogate: two code points, not one emoji
@example(text="\\ud800 \\\ud800 \\\\ud800")  # the literal text of an escape next to a real surrogate
@example(text="\udcff\x00\n\"")
def test_any_string_round_trips_exactly(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    with TrajectoryWriter(path, fsync=False) as writer:
        assert writer.write(_trajectory(text))
    raw = path.read_bytes()
    raw.decode("utf-8")  # the file stays valid UTF-8 (jq, pyarrow and datasets can read it)
    json.loads(raw)
    (back,) = read_trajectories(path)
    assert back == _trajectory(text)
    assert back.turns[0].observation == text and len(back.turns[0].observation) == len(text)


def test_surrogate_pair_written_as_two_code_points_is_not_joined(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(_trajectory("\ud83d\ude00"))
        writer.write(_trajectory("\U0001f600"))
    a, b = read_trajectories(path)
    assert a.turns[0].observation == "\ud83d\ude00" and b.turns[0].observation == "\U0001f600"


def test_non_finite_logprobs_round_trip(tmp_path: Path) -> None:
    base = _trajectory("x")
    turn = Turn(**{**base.turns[0].__dict__, "action_logprobs": (-math.inf,), "reward": math.nan})
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        assert writer.write(Trajectory(**{**base.__dict__, "turns": (turn,)}))
    (back,) = read_trajectories(path)
    assert back.turns[0].action_logprobs == (-math.inf,) and math.isnan(back.turns[0].reward)
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text(), "strict JSON only"


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_trajectory_that_cannot_be_serialised_is_kept_aside_and_costs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    bad = Trajectory(**{**_trajectory("bad", 1).__dict__, "metadata": {"thing": _Unprintable()}})
    with TrajectoryWriter(path) as writer:
        assert writer.write(_trajectory("a", 0))
        assert not writer.write(bad)
        assert writer.write(_trajectory("b", 2))
    assert (writer.count, writer.failed) == (2, 1)
    assert [t.traj_id for t in read_trajectories(path)] == ["id0", "id2"]
    (side,) = [json.loads(line) for line in errors_path(path).read_text().splitlines()]
    assert side["traj_id"] == "id1" and "no repr" in side["error"]


def test_writer_cuts_a_torn_tail_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(_trajectory("a", 0))
    with path.open("ab") as fh:  # a crash in the middle of a line
        fh.write(json.dumps(_trajectory("torn", 1).to_dict()).encode()[:50])
    with TrajectoryWriter(path) as writer:
        writer.write(_trajectory("b", 2))
    assert [t.traj_id for t in read_trajectories(path)] == ["id0", "id2"]


SURROGATE_ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "\\ud800 and \\udfff"}}</tool_call>'
STOP = '<tool_call>{"name": "stop", "arguments": {}}</tool_call>'


def test_surrogates_in_actions_survive_the_engine_writer_export_report_and_view(tmp_path: Path) -> None:
    # The model's reply itself is "<tool_call>...\ud800...</tool_call>\udcff": a lone surrogate in the action
    # and (echoed back) in the observation.
    policy = ScriptedPolicy([SURROGATE_ECHO + "\udcff", STOP])
    path = tmp_path / "t.jsonl"
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i) for i in range(6)]
    with TrajectoryWriter(path) as writer:
        engine = RolloutEngine(policy, RolloutConfig(max_in_flight=6))
        trajectories = engine.run(specs, writer=writer)
    assert len(trajectories) == 6 and all(t.success for t in trajectories)
    assert engine.stats["write_failures"] == 0 and writer.count == 6
    assert trajectories[0].turns[0].action.endswith("\udcff")
    assert "echo: \ud800 and \udfff" in trajectories[0].turns[1].observation
    assert sorted(read_trajectories(path), key=lambda t: t.seed or 0) == trajectories  # file: completion order
    pytest.importorskip("datasets")
    dataset = to_hf_dataset(trajectories)
    assert dataset[0]["turns"][0]["action"].endswith("\\udcff")
    report = write_html_report(tmp_path / "report.html", summarize(trajectories), trajectories, "surrogates")
    assert "\\ud800" in report.read_text(encoding="utf-8")
    shown = subprocess.run([sys.executable, "-m", "agentgym.cli", "view", str(path), "--limit", "1"],
                           capture_output=True, timeout=120, env={"PYTHONIOENCODING": "utf-8", "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0, shown.stderr.decode(errors="replace")
    assert b"\\ud800" in shown.stdout


def test_parquet_export_of_surrogate_text(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    dataset = to_hf_dataset([_trajectory("\ud800"), _trajectory("plain", 1)])
    dataset.to_parquet(str(tmp_path / "t.parquet"))
    import datasets

    back = datasets.Dataset.from_parquet(str(tmp_path / "t.parquet"))
    assert back[0]["turns"][0]["observation"] == "\\ud800" and back[1]["turns"][0]["observation"] == "plain"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the Python sandbox needs bubblewrap (make system-deps)")
def test_print_lone_surrogate_in_a_real_sandbox_episode(tmp_path: Path) -> None:
    # The reproduction: model code print('\ud800') in the real CodeInterpreter sandbox used to make the
    # writer raise and the whole batch vanish (0 lines on disk). One step only: Gymnasium's TimeLimit
    # (max_episode_steps=1) then truncates, which must read as max_turns, not error.
    code = json.dumps({"name": "python", "arguments": {"code": "print('\\ud800 x')"}})
    policy = ScriptedPolicy([f"<tool_call>{code}</tool_call>"])
    specs = [EpisodeSpec("agentgym/CodeInterpreter-v1", seed=i, env_kwargs={"max_episode_steps": 1}) for i in range(2)]
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        # One episode at a time: building CodeInterpreter tasks in two threads at once trips CPython 3.11.7's
        # "AST constructor recursion depth mismatch" (ast.parse is not thread-safe there); not this test's subject.
        trajectories = RolloutEngine(policy, RolloutConfig(max_in_flight=1, step_timeout_s=120)).run(specs, writer=writer)
    assert [t.end_reason for t in trajectories] == ["max_turns", "max_turns"], [t.error for t in trajectories]
    assert all("\ud800 x" in (t.final_observation or "") for t in trajectories)
    assert sorted(read_trajectories(path), key=lambda t: t.seed or 0) == trajectories


def test_surrogates_in_observations_are_no_error_for_a_token_level_policy(tmp_path: Path) -> None:
    # HF tokenizers reject lone surrogates; an observation holding one must not end the episode with "error"
    # (trainers drop those): the model sees the text "\udXXX", the trajectory keeps the exact string.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.suite import Task

    config = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)
    policy = HFPolicy.from_pretrained(build_tiny_model(tmp_path / "model", config=config))
    task = Task(id="s", prompt="Say \ud800 then \udfff.")
    specs = [EpisodeSpec("agentgym-test/Echo-v0", task=task, seed=0, env_kwargs={"max_turns": 2})]
    rollout = RolloutConfig(sampling=SamplingParams(max_tokens=8, temperature=1.0, seed=0))
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        (trajectory,) = RolloutEngine(policy, rollout).run(specs, writer=writer)
    assert trajectory.error is None and trajectory.end_reason == "max_turns"
    assert trajectory.turns[0].observation == "Say \ud800 then \udfff." and trajectory.has_tokens
    assert list(read_trajectories(tmp_path / "t.jsonl")) == [trajectory]
