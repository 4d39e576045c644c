"""Training rollouts are pipelined (env steps overlap generation) and still reproducible: every episode samples
from its own seed (``EpisodeSpec.sampling_seed``) and turn, so its trajectory does not depend on how many episodes
run at once, how the batcher groups requests, the order episodes are listed in, or which rank runs it."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from agentgym.models.tiny import TinyModelConfig  # noqa: E402
from agentgym.policies import SamplingParams  # noqa: E402
from agentgym.policies.hf import HFPolicy  # noqa: E402
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.trainers.seeding import mix_seed  # noqa: E402
from tests.helpers.tiny_models import build_context_sensitive_tiny_model  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_context_sensitive_tiny_model(tmp_path_factory.mktemp("tiny") / "model", SMALL)


def _specs() -> list[EpisodeSpec]:
    suite = load_suite("games-guess")  # multi-turn: later turns depend on the sampled earlier ones
    return [EpisodeSpec(suite.env_id, task=task, seed=mix_seed(0, 3, k, g) % 2**31, group_id=f"3/{k}",
                        env_kwargs=dict(suite.env_kwargs), sampling_seed=mix_seed(0, 3, k, g, 1))
            for k, task in enumerate(suite.split("train")[:6]) for g in range(4)]


def _run(model_dir: Path, specs: list[EpisodeSpec], *, in_flight: int, batch: int, deterministic: bool) -> dict[str, tuple]:
    policy = HFPolicy.from_pretrained(model_dir, max_batch_size=batch)
    config = RolloutConfig(max_in_flight=in_flight, env_workers=3, deterministic=deterministic, system_prompt="",
                           sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=123), max_context_tokens=512)
    trajectories = RolloutEngine(policy, config).run(specs)
    assert all(t.error is None and t.has_tokens for t in trajectories)
    return {f"{s.group_id}#{s.sampling_seed}": tuple(turn.action_token_ids for turn in t.turns)
            for s, t in zip(specs, trajectories)}


def test_trajectories_do_not_depend_on_concurrency_batching_order_or_sharding(model_dir: Path) -> None:
    specs = _specs()
    reference = _run(model_dir, specs, in_flight=1, batch=1, deterministic=True)  # one at a time, in order
    assert len({v for v in reference.values()}) > len(specs) // 2, "sampling must differ between episodes"
    assert any(len(v) > 1 for v in reference.values()), "multi-turn episodes"
    pipelined = _run(model_dir, specs, in_flight=24, batch=5, deterministic=False)
    assert pipelined == reference
    reordered = _run(model_dir, list(reversed(specs)), in_flight=7, batch=24, deterministic=False)
    assert reordered == reference
    halves = {**_run(model_dir, specs[::2], in_flight=12, batch=8, deterministic=False),   # "rank 0"
              **_run(model_dir, specs[1::2], in_flight=12, batch=8, deterministic=False)}  # "rank 1"
    assert halves == reference
