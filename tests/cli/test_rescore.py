"""``agentgym rescore``: stored episodes scored again with a rubric, as documented, without re-running envs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.cli.main import main
from agentgym.policies.scripted import ReferencePolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.storage import read_trajectories, write_trajectories

RUBRIC = '''
from agentgym.rewards import Check, JudgeCriterion, Rubric

def build():
    return Rubric("calc", (
        Check("correct", lambda s: float(s.outcome.get("success", False))),
        JudgeCriterion("shows_work", "Did the agent call the [calc] tool?", fields=("answer", "transcript")),
    ))
'''


@pytest.fixture()
def stored(tmp_path: Path) -> Path:
    policy = ReferencePolicy(shortcut_fraction=0.5, seed=1)  # some solved with calc, some guessed without it
    specs = [EpisodeSpec(env_id="agentgym/Calculator-v0", seed=s) for s in range(8)]
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, RolloutEngine(policy, RolloutConfig(progress=False)).run(specs))
    return path


def test_rescore_round_trip(stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rubric = tmp_path / "rubric.py"
    rubric.write_text(RUBRIC)
    out = tmp_path / "new" / "rescored.jsonl"
    argv = ["rescore", str(stored), "--rubric", f"{rubric}:build", "--out", str(out), "--judge", "scripted-naive"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    old, new = list(read_trajectories(stored)), list(read_trajectories(out))
    assert [t.traj_id for t in new] == [t.traj_id for t in old]
    assert summary["judge_calls"] == 8 and summary["judge_errors"] == 0 and summary["compared"] == 8
    for o, n in zip(old, new):
        expected = (float(o.success) + float(any("calc" == c["name"] for t in o.turns for c in t.info["calls"]))) / 2
        assert n.score == pytest.approx(expected) and n.outcome["checker_score"] == o.score
        assert sum(t.reward for t in n.turns) == pytest.approx(n.score)
    assert summary["judge_accuracy_vs_checker"] == 1.0  # both criteria follow the checker's verdict here
    assert summary["pearson"] == pytest.approx(1.0)
    assert main(argv) == 0  # cached: the second run asks the judge nothing
    assert json.loads(capsys.readouterr().out)["judge_calls"] == 0


@pytest.mark.parametrize("extra, message", [
    (["--rubric", "nope"], "module:name"),
    (["--rubric", "agentgym.rewards:Check"], "not a Rubric"),
])
def test_rescore_bad_input_is_a_clear_error(stored: Path, tmp_path: Path, extra: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rescore", str(stored), "--out", str(tmp_path / "x.jsonl"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_rescore_needs_a_judge_for_judge_criteria(stored: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rubric = tmp_path / "rubric.py"
    rubric.write_text(RUBRIC)
    assert main(["rescore", str(stored), "--rubric", f"{rubric}:build", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--judge" in capsys.readouterr().err


def test_rescore_with_a_json_judge_gets_a_verdict_from_an_untrained_model(
        stored: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--verdict-format json`` decodes the judge's reply under the verdict's schema: even an untrained tiny model
    (which never writes a closing VERDICT line) scores every episode."""
    pytest.importorskip("torch")
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(tmp_path / "judge", config=TinyModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64))
    rubric = tmp_path / "rubric.py"
    rubric.write_text(RUBRIC)
    out = tmp_path / "rescored.jsonl"
    assert main(["rescore", str(stored), "--rubric", f"{rubric}:build", "--out", str(out), "--judge", f"hf:{model}",
                 "--verdict-format", "json", "--limit", "3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["judge_calls"] == 3 and summary["judge_errors"] == 0, summary
