"""vLLM's sampling fields (top_k, min_p, penalties, min_tokens, stop_token_ids, logit_bias) in HFPolicy's samplers,
checked against a plain per-row numpy implementation on the same logits."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.helpers.tiny_models import build_context_sensitive_tiny_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.errors import ConfigError
from agentgym.models import TinyModelConfig
from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.hf import HFPolicy
from agentgym.policies.sampling_rules import SamplingRules
from agentgym.policies.seeding import row_seeds, row_uniforms

CONFIG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                         max_position_embeddings=512, vocab_size=400, tie_word_embeddings=False)
TEXTS = ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", "guess(50)",
         "move north, then east, then north again"]


# ---- the reference: one row at a time, in numpy, written from vLLM's sampler description -------------------------
def reference_process(logits: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int],
                      end_ids: list[int]) -> np.ndarray:
    x = logits.astype(np.float64).copy()
    if len(output) < p.min_tokens:
        for t in list(end_ids) + list(p.stop_token_ids):
            x[t] = -np.inf
    for t, b in p.logit_bias:
        x[t] += b
    if p.repetition_penalty != 1:
        for t in set(prompt) | set(output):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def reference_truncate(scaled: np.ndarray, p: SamplingParams) -> np.ndarray:
    x = scaled.copy()
    if p.min_p > 0:
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        x[probs < p.min_p * probs.max()] = -np.inf
    if p.top_k > 0:
        kth = np.sort(x)[::-1][min(p.top_k, len(x)) - 1]
        x[x < kth] = -np.inf
    return x


def reference_probs(logits: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int],
                    end_ids: list[int]) -> np.ndarray:
    scale = p.temperature or 1.0
    x = reference_truncate(reference_process(logits, p, prompt, output, end_ids) / scale, p)
    e = np.exp(x - x.max())
    return e / e.sum()


CASES = [
    SamplingParams(top_k=3),
    SamplingParams(min_p=0.2, temperature=0.8),
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6, presence_penalty=0.5),
    SamplingParams(frequency_penalty=1.2, presence_penalty=-0.4),
    SamplingParams(min_tokens=5, stop_token_ids=(7, 9)),
    SamplingParams(logit_bias={4: 3.0, 11: -100.0}),
    SamplingParams(top_k=5, min_p=0.05, repetition_penalty=1.3, frequency_penalty=0.3, logit_bias={2: 1.0},
                   min_tokens=2, temperature=0.5),
    SamplingParams(),
]


def test_batched_rules_equal_the_per_row_reference_on_random_logits():
    rng = np.random.default_rng(0)
    vocab, end_ids = 40, [1, 7]
    rules = SamplingRules(len(CASES), vocab, end_ids, "cpu")
    prompts = [list(rng.integers(0, vocab, 6)) for _ in CASES]
    rules.set_rows(range(len(CASES)), CASES, prompts)
    outputs: list[list[int]] = [[] for _ in CASES]
    rows = torch.arange(len(CASES))
    for step in range(7):
        logits = rng.normal(0, 3, (len(CASES), vocab)).astype(np.float32)
        got = rules.process(rows, torch.from_numpy(logits), torch.full((len(CASES),), step))
        scale = torch.tensor([p.temperature or 1.0 for p in CASES])[:, None]
        got_probs = torch.softmax(rules.truncate(rows, got / scale), -1).numpy()
        for i, p in enumerate(CASES):
            want = reference_process(logits[i], p, prompts[i], outputs[i], end_ids)
            np.testing.assert_allclose(got[i].numpy(), want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got_probs[i], reference_probs(logits[i], p, prompts[i], outputs[i], end_ids),
                                       atol=1e-5)
        token = torch.from_numpy(rng.integers(0, vocab, len(CASES)))
        rules.record(rows, token)
        for i, t in enumerate(token.tolist()):
            outputs[i].append(t)


def test_fields_are_validated_with_the_fix():
    for bad, match in [({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0}, "> 0"),
                       ({"presence_penalty": 3}, r"\[-2, 2\]"), ({"min_tokens": 9, "max_tokens": 4}, "<= max_tokens"),
                       ({"stop_token_ids": (-1,)}, "stop_token_ids")]:
        with pytest.raises(ConfigError, match=match):
            SamplingParams(**bad)
    assert SamplingParams(logit_bias={5: 1, 2: -1}).logit_bias == ((2, -1.0), (5, 1.0))


# ---- the two samplers of HFPolicy against the reference on the tiny model's real logits ------------------------
@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    return HFPolicy.from_pretrained(build_context_sensitive_tiny_model(tmp_path_factory.mktemp("rules") / "m", CONFIG),
                                    max_batch_size=8)


@pytest.fixture(scope="module")
def ref(fast):
    return HFPolicy(fast.model, fast.tokenizer, max_batch_size=8, sampler="reference")


def reference_generate(policy: HFPolicy, prompt: list[int], p: SamplingParams) -> tuple[list[int], list[float]]:
    """Plain loop: a full forward per step (no cache), the numpy rules, the seeded inverse-CDF draw of the row."""
    end_ids = list(policy._stop_ids)
    uniforms = row_uniforms(row_seeds([p.seed]), p.max_tokens, "cpu")[0].numpy()
    out: list[int] = []
    recorded: list[float] = []
    for step in range(p.max_tokens):
        with torch.inference_mode():
            raw = policy.model(torch.tensor([prompt + out])).logits[0, -1].float().numpy()
        processed = reference_process(raw, p, prompt, out, end_ids)
        if p.temperature == 0:
            token = int(np.argmax(processed))
        else:
            probs = reference_probs(raw, p, prompt, out, end_ids)
            if p.top_p < 1:
                order = np.argsort(-probs, kind="stable")
                before = np.cumsum(probs[order]) - probs[order]
                probs[order[before > p.top_p]] = 0
            cdf = np.cumsum(probs)
            token = min(int(np.searchsorted(cdf, uniforms[step] * cdf[-1], side="right")), len(cdf) - 1)
        scaled = raw.astype(np.float64) / (p.temperature or 1.0)
        recorded.append(float(scaled[token] - np.log(np.exp(scaled - scaled.max()).sum()) - scaled.max()))
        out.append(token)
        if token in end_ids + list(p.stop_token_ids) and step + 1 >= p.min_tokens:
            break
    return out, recorded


MODEL_CASES = [
    SamplingParams(max_tokens=10, temperature=0, repetition_penalty=1.8),
    SamplingParams(max_tokens=10, temperature=0, frequency_penalty=1.5, presence_penalty=0.5),
    SamplingParams(max_tokens=8, temperature=0, logit_bias={17: 8.0}),
    SamplingParams(max_tokens=12, temperature=0, min_tokens=6, stop_token_ids=(25,)),
    SamplingParams(max_tokens=10, temperature=1.0, top_k=4, seed=3),
    SamplingParams(max_tokens=10, temperature=0.8, min_p=0.1, seed=4),
    SamplingParams(max_tokens=10, temperature=1.2, top_k=20, top_p=0.9, repetition_penalty=1.3, seed=5),
]


@pytest.mark.parametrize("sampler", ["fast", "ref"])
def test_both_samplers_match_the_reference_loop_token_for_token(sampler, fast, ref):
    policy = fast if sampler == "fast" else ref
    prompts = [policy.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    # Distinct seeds: rows sharing one seed get further streams of it (row_seeds), the reference draws the first.
    reqs = [GenerationRequest(({"role": "user", "content": "-"},), tuple(prompt),
                              replace(p, seed=None if p.seed is None else p.seed * 100 + j))
            for p in MODEL_CASES for j, prompt in enumerate(prompts)]
    gens = asyncio.run(policy.act(reqs))
    if sampler == "fast":
        assert policy._continuous is not None
    for r, g in zip(reqs, gens):
        tokens, recorded = reference_generate(policy, list(r.prompt_token_ids), r.sampling)
        assert list(g.token_ids) == tokens, r.sampling
        # Recorded log-probs are the model's at the row's temperature, not the processed distribution's.
        assert g.logprobs == pytest.approx(recorded, abs=1e-4)


def test_each_field_changes_what_is_sampled(fast):
    prompt = tuple(fast.tokenizer.encode(TEXTS[0], add_special_tokens=False))

    def one(**kw):
        return asyncio.run(fast.act([GenerationRequest(({"role": "user", "content": "-"},), prompt,
                                                       SamplingParams(**kw))]))[0]

    base = one(max_tokens=12, temperature=0)
    assert one(max_tokens=12, temperature=0, logit_bias={33: 50.0}).token_ids == (33,) * 12
    assert set(one(max_tokens=12, temperature=1.0, top_k=1, seed=9).token_ids) <= set(range(400))
    assert one(max_tokens=12, temperature=1.0, top_k=1, seed=9).token_ids == base.token_ids  # top_k=1 is greedy
    stop_at = base.token_ids[2]
    cut = one(max_tokens=12, temperature=0, stop_token_ids=(stop_at,))
    assert cut.token_ids == base.token_ids[:base.token_ids.index(stop_at) + 1] and cut.finish_reason == "stop"
    late = one(max_tokens=12, temperature=0, stop_token_ids=(stop_at,), min_tokens=12)
    assert len(late.token_ids) == 12 and not set(late.token_ids) & set(fast._stop_ids)
    assert one(max_tokens=12, temperature=0, repetition_penalty=3.0).token_ids != base.token_ids
