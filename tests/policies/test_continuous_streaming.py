"""HFPolicy.continuous_submit, what a server builds on: per-step token callbacks, cancellation within a step, and
prefix reuse across requests without episodes (bounded by the slots, least recently used evicted first)."""

from __future__ import annotations

import os
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests.helpers.tiny_models import build_context_sensitive_tiny_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.models import TinyModelConfig
from agentgym.policies.base import SamplingParams
from agentgym.policies.hf import HFPolicy

CONFIG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                         max_position_embeddings=512, vocab_size=400, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    p = HFPolicy.from_pretrained(build_context_sensitive_tiny_model(tmp_path_factory.mktemp("cs") / "m", CONFIG),
                                 max_batch_size=2)
    yield p
    p.close()


def ids(policy, text):
    return policy.tokenizer.encode(text, add_special_tokens=False)


def test_callbacks_carry_each_token_as_sampled(policy):
    seen = []
    params = SamplingParams(max_tokens=12, min_tokens=12, temperature=1.0, seed=2, top_logprobs=3)
    gen = policy.continuous_submit(ids(policy, "hello"), params,
                                   on_token=lambda t, lp, top: seen.append((t, lp, top))).result(60)
    assert [t for t, _, _ in seen] == list(gen.token_ids)
    assert [lp for _, lp, _ in seen] == pytest.approx(list(gen.logprobs), abs=1e-6)
    assert [list(top[0]) for _, _, top in seen] == [pytest.approx(list(v), abs=1e-6) for v in gen.top_logprobs]


def test_a_cancelled_row_leaves_at_the_next_step(policy):
    cancel = threading.Event()
    count = [0]

    def on_token(token, logprob, top):
        count[0] += 1
        if count[0] == 5:
            cancel.set()

    before = policy._continuous_sampler().tokens_sampled
    gen = policy.continuous_submit(ids(policy, "go on"), SamplingParams(max_tokens=300, min_tokens=300),
                                   on_token=on_token, cancel=cancel).result(60)
    assert gen.finish_reason == "abort" and len(gen.token_ids) == 5 == count[0]
    assert policy._continuous_sampler().tokens_sampled - before == 5


def test_prefix_cache_is_bounded_by_the_slots_and_evicts_the_oldest(policy):
    sampler = policy._continuous_sampler()
    params = SamplingParams(max_tokens=4, temperature=0)
    a, b, c = (ids(policy, f"conversation {x}: a long opening line to keep") for x in "abc")
    for prompt in (a, b):
        policy.continuous_submit(prompt, params).result(60)
    before = sampler.prefix_tokens_reused
    policy.continuous_submit(a + ids(policy, " more"), params).result(60)  # a's slot: reused, now most recent
    assert sampler.prefix_tokens_reused - before >= len(a)
    policy.continuous_submit(c, params).result(60)  # two slots: c evicts b (least recently used), not a
    before = sampler.prefix_tokens_reused
    policy.continuous_submit(b + ids(policy, " more"), params).result(60)
    assert sampler.prefix_tokens_reused - before < len(b) // 2  # only what b shares with another cached prompt


def test_a_lone_row_among_cached_slots_decodes_alone_with_equal_results(tmp_path):
    """Live rows scattered among idle slots that keep prefixes are decoded gathered (not every slot up to the
    highest live one); the results equal the packed decode."""
    policy = HFPolicy.from_pretrained(build_context_sensitive_tiny_model(tmp_path / "m", CONFIG), max_batch_size=4)
    try:
        params = SamplingParams(max_tokens=6, temperature=1.0, seed=5, min_tokens=6)
        prompts = [ids(policy, f"episode {i} opens here") for i in range(4)]
        for f in [policy.continuous_submit(p, params) for p in prompts]:
            f.result(60)
        sampler = policy._continuous_sampler()
        last = max(range(4), key=lambda s: sampler._ids[s][:len(prompts[3])] == prompts[3])
        assert last > 1  # the row below runs in a high slot with idle ones beneath it
        longer = prompts[3] + ids(policy, " and goes on")
        calls = []
        real = sampler.net.decode
        sampler.net.decode = lambda *a, **k: calls.append(k.get("slots") is not None) or real(*a, **k)
        gathered = policy.continuous_submit(longer, params).result(60)
        sampler.net.decode = real
        assert calls and all(calls)
        packed = HFPolicy(policy.model, policy.tokenizer, max_batch_size=1).continuous_submit(longer, params).result(60)
        assert gathered.token_ids == packed.token_ids
        assert gathered.logprobs == pytest.approx(packed.logprobs, abs=1e-5)
    finally:
        policy.close()
