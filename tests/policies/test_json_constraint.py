"""SamplingParams.constraint in both HFPolicy samplers: an untrained tiny model writes only documents valid under
the schema, within max_tokens, and greedy decoding under the constraint is the same in the continuous sampler and
the reference loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.policy import GenerationRequest, SamplingParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "number"},
                                           "kind": {"enum": ["x", "y"]},
                                           "xs": {"type": "array", "items": {"type": "integer"}}},
          "required": ["name", "n", "kind", "xs"], "additionalProperties": False}


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return HFPolicy.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config))


def _requests(constraint: Any, temperature: float) -> list[GenerationRequest]:
    budgets = [constraint.min_tokens, constraint.min_tokens + 10, 80]
    return [GenerationRequest(messages=({"role": "user", "content": f"item {i}"},),
                              sampling=SamplingParams(max_tokens=m, temperature=temperature, seed=i,
                                                      constraint=constraint))
            for i, m in enumerate(budgets)]


def test_both_samplers_write_only_valid_documents(policy: Any) -> None:
    from agentgym.policies.json_constraint import JsonConstraint, TokenVocabulary

    constraint = JsonConstraint(SCHEMA, TokenVocabulary(policy.tokenizer))
    free = GenerationRequest(messages=({"role": "user", "content": "free"},),
                             sampling=SamplingParams(max_tokens=12, seed=0))
    requests = _requests(constraint, 1.0)
    continuous = asyncio.run(policy.act([*requests, free]))  # the engine's path (continuous batching)
    assert policy._continuous is not None
    reference = policy.generate([policy.prompt_ids(r) for r in requests], [r.sampling for r in requests])
    for gen, request in zip(continuous[:3] + reference, requests + requests):
        jsonschema.validate(json.loads(gen.text), SCHEMA)
        assert gen.finish_reason == "stop" and len(gen.token_ids) <= request.sampling.max_tokens
    assert continuous[3].finish_reason == "length" and not continuous[3].text.startswith("{")  # left free
    greedy = _requests(constraint, 0.0)
    assert [g.text for g in asyncio.run(policy.act(greedy))] == [
        g.text for g in policy.generate([policy.prompt_ids(r) for r in greedy], [r.sampling for r in greedy])]


def test_too_small_a_budget_and_mixed_constraints_are_refused(policy: Any) -> None:
    from agentgym.policies.json_constraint import JsonConstraint, TokenVocabulary

    constraint = JsonConstraint(SCHEMA, TokenVocabulary(policy.tokenizer))
    with pytest.raises(ConfigError, match="raise max_tokens"):
        asyncio.run(policy.act([GenerationRequest(messages=({"role": "user", "content": "x"},),
                                                  sampling=SamplingParams(max_tokens=5, constraint=constraint))]))
    with pytest.raises(ConfigError, match="not both"):
        SamplingParams(choices=("a",), constraint=constraint)
    with pytest.raises(ConfigError, match="TokenConstraint"):
        SamplingParams(constraint="json")  # type: ignore[arg-type]
