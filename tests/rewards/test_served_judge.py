"""A judge served by ``agentgym serve`` (the tiny model) scores a batch through the OpenAI-compatible route; with
``verdict_format="json"`` the verdict is decoded under its schema, so even the untrained model scores every episode
(served: ``response_format`` json_schema; in process: ``SamplingParams.constraint``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.policies import SamplingParams, make_policy  # noqa: E402
from agentgym.rewards import JudgeCriterion, Rubric  # noqa: E402
from agentgym.rollout.judging import PolicyJudge, judge_trajectories  # noqa: E402
from tests.rewards.helpers import answered  # noqa: E402

RUBRIC = Rubric("r", (JudgeCriterion("complete", "Does the report name [Paris]?"),))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)
    return Path(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config))


@pytest.fixture(scope="module")
def server(tiny_dir: Path) -> Any:
    from agentgym.policies.hf import HFPolicy
    from agentgym.serving.openai_server import ServerThread

    with ServerThread(HFPolicy.from_pretrained(tiny_dir), model_name="tiny", max_batch_size=16,
                      batch_window_s=0.05) as srv:
        yield srv


def _served_judge(server: Any, cache: Path, verdict_format: str, max_tokens: int) -> PolicyJudge:
    policy = make_policy(f"openai:{server.base_url}#tiny")
    return PolicyJudge(policy, cache_dir=cache, timeout_s=60, retries=0, name="tiny-served",
                       sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0), verdict_format=verdict_format)


def test_served_judge_scores_a_batch(server: Any, tmp_path: Path) -> None:
    episodes = [answered(f"Answer {i}: Paris.", traj_id=f"t{i}") for i in range(4)]
    first = _served_judge(server, tmp_path, "line", 24)
    out, stats = judge_trajectories(episodes, RUBRIC, first)
    assert stats["judge_calls"] == 4 and stats["judged"] == 4
    for t in out:  # an untrained model rarely writes a verdict line: then the error is recorded, never a 0 or 1
        rubric_result = t.outcome["rubric"]
        assert (rubric_result["score"] is not None and 0 <= t.score <= 1) or t.error.startswith("judge_error")
    again, _ = judge_trajectories(episodes, RUBRIC, second := _served_judge(server, tmp_path, "line", 24))
    assert second.calls == 0 and [t.score for t in again] == [t.score for t in out]


@pytest.mark.parametrize("mode", ["independent", "group"])
def test_served_json_judge_scores_every_episode(server: Any, tmp_path: Path, mode: str) -> None:
    episodes = [answered(f"Answer {i}: Paris.", traj_id=f"t{i}", group=f"g{i % 2}") for i in range(6)]
    first = _served_judge(server, tmp_path, "json", 48)
    out, stats = judge_trajectories(episodes, RUBRIC, first, mode=mode)
    assert stats["judged"] == 6 and stats["judge_errors"] == 0, [t.error for t in out]
    assert stats["judge_calls"] == (6 if mode == "independent" else 2)
    for t in out:
        assert t.error is None and 0.0 <= t.score <= 1.0 and t.outcome["rubric"]["score"] == t.score
    cache = [json.loads(line) for line in (tmp_path / "judge_cache.jsonl").read_text().splitlines()]
    assert all(isinstance(json.loads(r["text"]), dict) for r in cache)  # every reply is one JSON object
    again, again_stats = judge_trajectories(episodes, RUBRIC, second := _served_judge(server, tmp_path, "json", 48),
                                            mode=mode)
    assert second.calls == 0 and again_stats["judge_errors"] == 0
    assert [t.score for t in again] == [t.score for t in out]


def test_in_process_hf_json_judge_scores_every_episode(tiny_dir: Path) -> None:
    from agentgym.policies.hf import HFPolicy

    episodes = [answered(f"Answer {i}: Paris.", traj_id=f"t{i}") for i in range(4)]
    judge = PolicyJudge(HFPolicy.from_pretrained(tiny_dir), sampling=SamplingParams(max_tokens=40, temperature=1.0),
                        verdict_format="json")
    out, stats = judge_trajectories(episodes, RUBRIC, judge)
    assert stats["judge_errors"] == 0 and stats["judge_calls"] == 4, [t.error for t in out]
    assert all(t.error is None and 0.0 <= t.score <= 1.0 for t in out)
    assert 0 < stats["judge_tokens_out"] <= 4 * 40
