"""OpenAIPolicy chat mode reports the server's prompt ids, and ids sampled from another prompt are never recorded.

Runs against the real ``agentgym serve`` app on the tiny model. The mismatch is made for real: the agent
renders with a chat-template variant (an extra line in every system turn) that the server does not use.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.agent import ChatAgent
from agentgym.policies.base import SamplingParams
from agentgym.policies.openai import OpenAIPolicy

MODEL = "tiny-prompt-ids"
SAMPLING = SamplingParams(max_tokens=8, temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return HFPolicy.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config))


@pytest.fixture(scope="module")
def base_url(hf_policy: Any) -> Any:
    from agentgym.serving.openai_server import serve_in_background

    with serve_in_background(hf_policy, model_name=MODEL) as url:
        yield url


def _variant(tokenizer: Any) -> Any:
    """The same tokenizer with a chat template that renders one more line than the server's."""
    other = copy.deepcopy(tokenizer)
    other.chat_template = "{{ 'Variant template.\\n' }}" + tokenizer.chat_template
    return other


def _one_turn(policy: OpenAIPolicy, agent: ChatAgent) -> tuple[Any, Any]:
    agent.start("Answer briefly.", "What is 2 + 2?")
    request = agent.request(SAMPLING)
    [generation] = asyncio.run(policy.act([request]))
    return request, generation


def test_matching_template_ids_are_checked_and_kept(base_url: str, hf_policy: Any) -> None:
    policy = OpenAIPolicy(base_url, MODEL, tokenizer=hf_policy.tokenizer)
    agent = ChatAgent(hf_policy.tokenizer)
    request, generation = _one_turn(policy, agent)
    assert generation.prompt_token_ids == request.prompt_token_ids  # the server conditioned on our prompt
    assert generation.token_ids
    assert policy.stats == {"prompt_checked": 1, "prompt_mismatches": 0, "prompt_unverified": 0}
    assert agent.record_action(generation) == generation.token_ids
    assert agent.prompt_mismatches == 0


def test_other_template_is_counted_and_its_ids_never_recorded(base_url: str, hf_policy: Any,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    policy = OpenAIPolicy(base_url, MODEL, tokenizer=hf_policy.tokenizer)
    agent = ChatAgent(_variant(hf_policy.tokenizer))
    with caplog.at_level(logging.WARNING, logger="agentgym.policies.openai"):
        request, generation = _one_turn(policy, agent)
        before = list(agent.token_ids)
        recorded = agent.record_action(generation)
        _, second = _one_turn(policy, ChatAgent(_variant(hf_policy.tokenizer)))
    # The server rendered its own template: its prompt ids are reported, and they are not the agent's.
    assert generation.prompt_token_ids is not None and generation.prompt_token_ids != request.prompt_token_ids
    assert tuple(hf_policy.tokenizer.encode("Variant template.\n", add_special_tokens=False)) == tuple(
        request.prompt_token_ids[: len(request.prompt_token_ids) - len(generation.prompt_token_ids)])
    assert policy.stats == {"prompt_checked": 2, "prompt_mismatches": 2, "prompt_unverified": 0}
    assert second.prompt_token_ids is not None
    # The agent keeps the text but records no sampled ids: its sequence continues with the text's own encoding.
    assert recorded is None and agent.prompt_mismatches == 1
    assert agent.messages[-1] == {"role": "assistant", "content": generation.text}
    assert agent.token_ids[len(before):] == agent._encode(generation.text)
    warnings = [r.getMessage() for r in caplog.records if "rendered the conversation differently" in r.getMessage()]
    assert len(warnings) == 1 and "mode='completions'" in warnings[0]  # once, with the knob that fixes it


def test_policy_renders_messages_itself_when_the_agent_sent_no_ids(base_url: str, hf_policy: Any) -> None:
    """An agent without a tokenizer sends messages only; the policy checks the server against its own render."""
    policy = OpenAIPolicy(base_url, MODEL, tokenizer=hf_policy.tokenizer)
    request, generation = _one_turn(policy, ChatAgent())
    assert request.prompt_token_ids is None
    assert generation.prompt_token_ids is not None and generation.token_ids
    assert policy.stats["prompt_checked"] == 1 and policy.stats["prompt_mismatches"] == 0


def test_chat_without_tokenizer_sends_no_token_id_fields(base_url: str) -> None:
    """Hosted APIs reject unknown fields; without a tokenizer the request is plain OpenAI and nothing is claimed."""
    policy = OpenAIPolicy(base_url, MODEL)
    _, generation = _one_turn(policy, ChatAgent())
    assert generation.text is not None
    assert generation.token_ids is None and generation.prompt_token_ids is None
    assert policy.stats == {"prompt_checked": 0, "prompt_mismatches": 0, "prompt_unverified": 0}
