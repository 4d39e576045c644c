"""A judge served by ``agentgym serve`` (the tiny model) scores a batch through the OpenAI-compatible route."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy
    from agentgym.serving.openai_server import ServerThread

    config = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64)
    policy = HFPolicy.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config))
    with ServerThread(policy, model_name="tiny", max_batch_size=16, batch_window_s=0.05) as srv:
        yield srv


def test_served_judge_scores_a_batch(server: Any, tmp_path: Path) -> None:
    rubric = Rubric("r", (JudgeCriterion("complete", "Does the report name [Paris]?"),))
    episodes = [answered(f"Answer {i}: Paris.", traj_id=f"t{i}") for i in range(4)]

    def judge() -> PolicyJudge:
        policy = make_policy(f"openai:{server.base_url}#tiny")
        return PolicyJudge(policy, cache_dir=tmp_path, timeout_s=60, retries=0, name="tiny-served",
                            sampling=SamplingParams(max_tokens=24, temperature=0.0))

    first = judge()
    out, stats = judge_trajectories(episodes, rubric, first)
    assert stats["judge_calls"] == 4 and stats["judged"] == 4
    for t in out:  # an untrained model rarely writes a verdict line: then the error is recorded, never a 0 or 1
        rubric_result = t.outcome["rubric"]
        assert (rubric_result["score"] is not None and 0 <= t.score <= 1) or t.error.startswith("judge_error")
    again, _ = judge_trajectories(episodes, rubric, second := judge())
    assert second.calls == 0 and [t.score for t in again] == [t.score for t in out]
