"""VLLMPolicy: the same outputs as HFPolicy from a vLLM engine, and weight sync from a trainer's model.

The engine tests need a CUDA GPU and vLLM (marked ``gpu``; skipped elsewhere). The CPU tests check what
runs without either: the missing-dependency error, the ``vllm:`` spec, and the pure conversion of vLLM
outputs into Generations (entropy bound, end-token handling, seeds), on stand-in output objects.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from agentgym.errors import AgentGymError, ConfigError, DependencyNotInstalled
from agentgym.policies import make_policy
from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.vllm import (
    completion_to_generation,
    entropy_from_top_logprobs,
    row_seeds,
)

PROMPTS = [
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    ("<|im_start|>system\nUse the calculator.<|im_end|>\n<|im_start|>user\nWhat is 27*42?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "x",
    "guess(50)",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
EOS, EOT = 2, 0  # <|im_end|> and <|endoftext|> in the tiny tokenizer


# ---- CPU: dependency error and spec routing ---------------------------------------------------------
def test_missing_vllm_raises_dependency_error_and_spec_routes_to_it(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here; this checks the error raised without it")
    from agentgym.policies import VLLMPolicy  # the lazy export resolves without vllm

    with pytest.raises(DependencyNotInstalled) as info:
        VLLMPolicy(tmp_path)
    assert info.value.extra == "vllm"
    assert "agentgym[vllm]" in str(info.value)
    with pytest.raises(DependencyNotInstalled) as info:
        make_policy(f"vllm:{tmp_path}")
    assert info.value.extra == "vllm"
    with pytest.raises(ConfigError, match="vllm:"):
        make_policy("vllm:")
    with pytest.raises(ConfigError, match="entropy_top_k"):
        VLLMPolicy(tmp_path, entropy_top_k=0)


# ---- CPU: converting vLLM outputs ------------------------------------------------------------------
@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeCompletion:
    """The fields of vllm.outputs.CompletionOutput that VLLMPolicy reads."""

    text: str
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


def _entry(**lps: float) -> dict[int, FakeLogprob]:
    return {int(k[1:]): FakeLogprob(v) for k, v in lps.items()}


def test_entropy_estimate_is_a_lower_bound_exact_on_full_support():
    probs = [0.5, 0.2, 0.15, 0.1, 0.05]
    exact = -sum(p * math.log(p) for p in probs)
    assert entropy_from_top_logprobs([math.log(p) for p in probs]) == pytest.approx(exact)
    previous = 0.0
    for k in range(1, len(probs) + 1):
        estimate = entropy_from_top_logprobs([math.log(p) for p in probs[:k]])
        assert previous - 1e-12 <= estimate <= exact + 1e-12  # more known outcomes: tighter, never above
        previous = estimate
    # Tokens cut by top-p come back as -inf and count for nothing; a certain token has entropy 0.
    assert entropy_from_top_logprobs([0.0, -math.inf]) == 0.0


def test_completion_keeps_end_token_and_aligns_logprobs():
    done = completion_to_generation(
        FakeCompletion("ab", [5, 6, EOS], [_entry(t5=-0.1, t7=-2.5), _entry(t6=-0.2), _entry(t2=-0.3, t6=-1.5)],
                       "stop", None),
        stop_ids=[EOT, EOS],
    )
    assert done.token_ids == (5, 6, EOS) and done.finish_reason == "stop"
    assert done.logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert done.entropies[1] == pytest.approx(-math.exp(-0.2) * -0.2 - (1 - math.exp(-0.2)) * math.log(1 - math.exp(-0.2)))
    # vLLM checks the length limit first: an end token as the last allowed token is still a stop.
    last = completion_to_generation(FakeCompletion("a", [5, EOS], [_entry(t5=-0.1), _entry(t2=-0.4)], "length"),
                                    stop_ids=[EOT, EOS])
    assert last.finish_reason == "stop"
    cut = completion_to_generation(FakeCompletion("a", [5, 6], [_entry(t5=-0.1), _entry(t6=-0.4)], "length"),
                                   stop_ids=[EOT, EOS])
    assert cut.finish_reason == "length" and cut.token_ids == (5, 6)
    # A stop string: the last token stays whole and the turn is a stop.
    string = completion_to_generation(FakeCompletion("a)", [5, 9], [_entry(t5=-0.1), _entry(t9=-0.4)], "stop", ")"),
                                      stop_ids=[EOT, EOS])
    assert string.finish_reason == "stop" and string.token_ids == (5, 9) and string.text == "a)"


def test_completion_top_logprobs_keep_the_k_best_and_the_sampled_token():
    entries = [_entry(t5=-0.1, t6=-2.5, t7=-3.0), _entry(t5=-0.2, t6=-1.9, t9=-4.0)]
    gen = completion_to_generation(FakeCompletion("ab", [5, 9], entries, "length"), stop_ids=[EOS], top_logprobs=2)
    assert gen.top_logprobs == ((-0.1, -2.5), (-0.2, -1.9, -4.0))  # the sampled 9 is outside the top 2
    assert gen.top_token_ids == ((5, 6), (5, 6, 9))
    assert completion_to_generation(FakeCompletion("ab", [5, 9], entries, "length"), stop_ids=[EOS]).top_logprobs is None


def test_completion_restores_an_end_token_left_out_of_token_ids():
    # Were a vLLM version to drop the end token from token_ids but keep its log-prob entry.
    restored = completion_to_generation(
        FakeCompletion("a", [5], [_entry(t5=-0.1), _entry(t0=-0.05, t7=-4.0)], "stop", None), stop_ids=[EOT, EOS]
    )
    assert restored.token_ids == (5, EOT) and restored.logprobs == pytest.approx((-0.1, -0.05))
    with pytest.raises(AgentGymError, match="end token"):
        completion_to_generation(FakeCompletion("a", [5], [_entry(t5=-0.1)], "stop", None), stop_ids=[EOT, EOS])
    with pytest.raises(AgentGymError, match="log-prob"):
        completion_to_generation(FakeCompletion("a", [5], None, "length"), stop_ids=[EOS])


def test_row_seeds_reproducible_and_distinct_within_a_group():
    seeds = row_seeds([7, 7, 7, None])
    assert seeds == row_seeds([7, 7, 7, None])
    assert len(set(seeds[:3])) == 3 and seeds[3] is None
    assert row_seeds([None, None]) == [None, None]
    assert row_seeds([8, 8, 8, None]) != seeds
    # A row's stream depends on its own seed only, never on the other requests that share its batch.
    assert row_seeds([5, 7])[1] == row_seeds([7])[0] == row_seeds([7, 3, 9])[0]


# ---- GPU: the engine against HFPolicy ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from agentgym.models import TinyModelConfig

    config = TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                             max_position_embeddings=512, vocab_size=400, tie_word_embeddings=False)
    from tests.helpers.tiny_models import build_context_sensitive_tiny_model

    return build_context_sensitive_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny", config)


@pytest.fixture(scope="module")
def hf(tiny_dir):
    from agentgym.policies.hf import HFPolicy

    return HFPolicy.from_pretrained(tiny_dir, device="cpu")


@pytest.fixture(scope="module")
def engine(tiny_dir):
    pytest.importorskip("vllm")
    import transformers

    from agentgym.policies.vllm import VLLMPolicy

    vocab = len(transformers.AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True))
    # float32 to compare token for token with the float32 HF model; top-K over the whole vocabulary,
    # so the entropies are exact and comparable too.
    policy = VLLMPolicy(tiny_dir, dtype="float32", gpu_memory_utilization=0.3, entropy_top_k=vocab, seed=0)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def prompts(hf):
    return [hf.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


def _reference(model, prompt, tokens, temperature):
    """Log-probs and entropies of ``tokens`` under a plain full forward pass at ``temperature``."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0].float()
    logits = logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)] / (temperature or 1.0)
    logp = torch.log_softmax(logits, -1)
    picked = logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked.tolist(), entropy.tolist()


@pytest.mark.gpu
def test_generations_meet_the_contract(engine, hf, prompts):
    stop_ids = set(engine._stop_ids)
    assert {EOS, EOT} <= stop_ids and engine.tokenizer is not None
    temperatures = [[0.0] * 4, [0.7] * 4, [0.0, 0.7, 1.0, 1.3]]  # the last mixes greedy and sampled rows
    for temps in temperatures:
        params = [SamplingParams(temperature=t, max_tokens=24, seed=3) for t in temps]
        for prompt, temperature, gen in zip(prompts, temps, engine.generate(prompts, params)):
            n = len(gen.token_ids)
            assert 1 <= n <= 24 and len(gen.logprobs) == n and len(gen.entropies) == n
            if gen.finish_reason == "stop":
                assert gen.token_ids[-1] in stop_ids  # the end token is kept, as the contract says
            else:
                assert gen.finish_reason == "length" and n == 24
                assert not stop_ids & set(gen.token_ids)
            assert gen.text == engine.tokenizer.decode(list(gen.token_ids), skip_special_tokens=True) or (
                "\ufffd" in gen.text  # bytes of a character cut at the end decode differently
            )
            # Log-probs under the temperature-scaled distribution (top_p = 1), entropies exact (K = vocab).
            logprobs, entropies = _reference(hf.model, prompt, gen.token_ids, temperature)
            assert gen.logprobs == pytest.approx(logprobs, abs=2e-3)
            assert gen.entropies == pytest.approx(entropies, abs=2e-3)
    # Seeds: the same batch samples the same turns; identical seeded requests of a group still differ.
    group = [prompts[0]] * 4
    sampled = SamplingParams(temperature=1.0, max_tokens=12, seed=11)
    first = engine.generate(group, sampled)
    assert [g.token_ids for g in first] == [g.token_ids for g in engine.generate(group, sampled)]
    assert len({g.token_ids for g in first}) > 1
    # The async API with prompt ids from the agent.
    requests = [GenerationRequest(messages=(), prompt_token_ids=tuple(p), sampling=GREEDY) for p in prompts]
    via_act = asyncio.run(engine.act(requests))
    assert [g.token_ids for g in via_act] == [g.token_ids for g in engine.generate(prompts, GREEDY)]


@pytest.mark.gpu
def test_greedy_matches_hf_token_for_token(engine, hf, prompts):
    expected = hf.generate(prompts, GREEDY)
    got = engine.generate(prompts, GREEDY)
    assert {g.finish_reason for g in expected} == {"stop", "length"}, "fixture should exercise both ends"
    for want, have in zip(expected, got):
        assert have.token_ids == want.token_ids
        assert have.finish_reason == want.finish_reason
        assert have.logprobs == pytest.approx(want.logprobs, abs=2e-3)
        if "\ufffd" not in want.text:
            assert have.text == want.text
    # Stop strings: pick a printable token from a long HF turn and stop on it; both cut after it.
    row = next(i for i, g in enumerate(expected) if g.finish_reason == "length")
    ids = expected[row].token_ids
    pos, stop = next(
        (i, s) for i in range(2, len(ids))
        if (s := hf.tokenizer.decode([ids[i]])).isascii() and s.strip() and s.isprintable()
        and s not in hf.tokenizer.decode(list(ids[:i]))
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,))
    want = hf.generate([prompts[row]], params)[0]
    have = engine.generate([prompts[row]], params)[0]
    assert want.token_ids == ids[: pos + 1] and want.finish_reason == "stop" and want.text.endswith(stop)
    assert have.token_ids == want.token_ids and have.finish_reason == "stop" and have.text.endswith(stop)


@pytest.mark.gpu
def test_load_weights_syncs_the_engine_with_the_trainer(engine, hf, prompts, tiny_dir):
    import torch

    from agentgym.models import load_tiny_model
    from agentgym.policies.hf import HFPolicy

    before = engine.generate(prompts, GREEDY)
    original = {k: v.clone() for k, v in hf.model.state_dict().items()}
    trainer_model, tokenizer = load_tiny_model(tiny_dir)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in trainer_model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    updated_hf = HFPolicy(trainer_model, tokenizer)
    expected = updated_hf.generate(prompts, GREEDY)

    engine.load_weights(trainer_model)  # a torch module, as a trainer holds it
    after = engine.generate(prompts, GREEDY)  # same prompts: a stale prefix cache would show here
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert [g.token_ids for g in after] == [g.token_ids for g in expected]

    engine.load_weights(original)  # a state dict; restores the module fixture for other tests
    assert [g.token_ids for g in engine.generate(prompts, GREEDY)] == [g.token_ids for g in before]
