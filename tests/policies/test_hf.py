"""HFPolicy: batched KV-cache sampling checked against plain full forward passes, plus the policy API."""

from __future__ import annotations

import asyncio
import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests.helpers.tiny_models import build_context_sensitive_tiny_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError
from agentgym.models import TinyModelConfig
from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.hf import HFPolicy

CONFIG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                         max_position_embeddings=512, vocab_size=400, tie_word_embeddings=False)
PROMPTS = [
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    ("<|im_start|>system\nUse the calculator.<|im_end|>\n<|im_start|>user\nWhat is 27*42?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "x",
    "guess(50)",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_context_sensitive_tiny_model(tmp_path_factory.mktemp("hf") / "tiny", CONFIG)


@pytest.fixture(scope="module")
def policy(model_dir):
    return HFPolicy.from_pretrained(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def prompts(policy):
    return [policy.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


def full_forward_logits(model, ids):
    """Last-position logits from a plain forward pass over the whole sequence: no cache, no padding."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


def reference_greedy(model, prompt, steps):
    ids, tokens, logprobs, entropies = list(prompt), [], [], []
    for _ in range(steps):
        logits = full_forward_logits(model, ids)
        logp = torch.log_softmax(logits, -1)
        token = int(logits.argmax())
        tokens.append(token)
        logprobs.append(float(logp[token]))
        entropies.append(float(-(logp.exp() * logp).sum()))
        ids.append(token)
    return tokens, logprobs, entropies


@contextlib.contextmanager
def forced_eos(policy, after: int):
    """Make the model end its turn with <|im_end|> at step ``after`` (0-based) of each generate call.

    Also bans the other special tokens so that the action text is exactly the decoded non-special ids.
    """
    tokenizer = policy.tokenizer
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    banned = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>")]
    calls = {"n": 0}

    def hook(module, inputs, output):
        bias = torch.zeros(output.shape[-1])
        bias[banned] = -1e4
        if calls["n"] < after:
            bias[eos] = -1e4
        else:
            bias[eos] = 1e4
        calls["n"] += 1
        return output + bias

    handle = policy.model.lm_head.register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


# ---- correctness against full forward passes -----------------------------------------------------------


def test_greedy_batch_with_left_padding_matches_full_forward(policy, prompts):
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths -> real left padding
    gens = policy.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
    for prompt, gen in zip(prompts, gens):
        tokens, logprobs, entropies = reference_greedy(policy.model, prompt, 12)
        assert list(gen.token_ids) == tokens
        assert gen.logprobs == pytest.approx(logprobs, abs=1e-4)
        assert gen.entropies == pytest.approx(entropies, abs=1e-4)
        assert all(e >= 0 for e in gen.entropies)
        assert gen.finish_reason == "length"
        assert gen.text == policy.tokenizer.decode(list(gen.token_ids), skip_special_tokens=True)


def test_greedy_is_deterministic_and_independent_of_batching(policy, prompts):
    sampling = SamplingParams(max_tokens=8, temperature=0)
    first = policy.generate(prompts, sampling)
    assert policy.generate(prompts, sampling) == first
    one_by_one = [policy.generate([p], sampling)[0] for p in prompts]
    assert [g.token_ids for g in one_by_one] == [g.token_ids for g in first]
    small_batches = HFPolicy(policy.model, policy.tokenizer, max_batch_size=1).generate(prompts, sampling)
    assert [g.token_ids for g in small_batches] == [g.token_ids for g in first]


def test_sampled_logprobs_match_temperature_scaled_full_forward(policy, prompts):
    temperature = 0.7
    sampling = SamplingParams(max_tokens=10, temperature=temperature, seed=3)
    gens = policy.generate(prompts, sampling)
    for prompt, gen in zip(prompts, gens):
        ids = list(prompt)
        for token, logprob, entropy in zip(gen.token_ids, gen.logprobs, gen.entropies):
            logp = torch.log_softmax(full_forward_logits(policy.model, ids) / temperature, -1)
            assert logprob == pytest.approx(float(logp[token]), abs=1e-4)
            assert entropy == pytest.approx(float(-(logp.exp() * logp).sum()), abs=1e-4)
            assert entropy >= 0
            ids.append(token)


def test_top_logprobs_are_the_k_best_plus_the_sampled_token_and_do_not_change_sampling(policy, prompts):
    temperature = 0.7
    plain = policy.generate(prompts[:3], SamplingParams(max_tokens=8, temperature=temperature, seed=5))
    params = [SamplingParams(max_tokens=8, temperature=temperature, seed=5, top_logprobs=k) for k in (3, 0, 5)]
    gens = policy.generate(prompts[:3], params)
    assert [g.token_ids for g in gens] == [g.token_ids for g in plain[:3]]
    assert gens[1].top_logprobs is None and gens[1].top_token_ids is None
    for prompt, gen, k in ((prompts[0], gens[0], 3), (prompts[2], gens[2], 5)):
        ids = list(prompt)
        assert len(gen.top_logprobs) == len(gen.token_ids)
        assert len(gen.top_token_ids) == len(gen.token_ids)
        for token, logprob, cands, cand_ids in zip(gen.token_ids, gen.logprobs, gen.top_logprobs, gen.top_token_ids):
            logp = torch.log_softmax(full_forward_logits(policy.model, ids) / temperature, -1)
            best = logp.topk(k).values.tolist()
            assert list(cands[:k]) == pytest.approx(best, abs=1e-4)
            assert len(cand_ids) == len(cands) and len(set(cand_ids)) == len(cand_ids)
            assert [float(logp[t]) for t in cand_ids] == pytest.approx(list(cands), abs=1e-4)  # ids name the values
            in_top = float(logp[token]) >= best[-1] - 1e-6
            assert len(cands) == (k if in_top else k + 1)
            if not in_top:
                assert cands[-1] == pytest.approx(logprob, abs=1e-6) and cand_ids[-1] == token
            ids.append(token)


def test_seeded_sampling_is_reproducible(policy, prompts):
    sampling = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
    first = policy.generate(prompts, sampling)
    assert policy.generate(prompts, sampling) == first
    other = policy.generate(prompts, SamplingParams(max_tokens=10, temperature=1.0, seed=12))
    assert [g.token_ids for g in other] != [g.token_ids for g in first]
    # Identical requests in one batch (a GRPO group) still get independent samples.
    group = policy.generate([prompts[0]] * 4, sampling)
    assert len({g.token_ids for g in group}) > 1


def test_tiny_top_p_is_greedy_and_mixed_rows_keep_their_own_params(policy, prompts):
    greedy = policy.generate(prompts, SamplingParams(max_tokens=6, temperature=0))
    nucleus = policy.generate(prompts, SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-6, seed=0))
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]
    mixed = policy.generate(
        prompts,
        [SamplingParams(max_tokens=6, temperature=0), SamplingParams(max_tokens=3, temperature=1.5, seed=1),
         SamplingParams(max_tokens=6, temperature=0), SamplingParams(max_tokens=1, temperature=0.5, seed=1)],
    )
    assert mixed[0].token_ids == greedy[0].token_ids and mixed[2].token_ids == greedy[2].token_ids
    assert [len(g.token_ids) for g in mixed] == [6, 3, 6, 1]


def test_max_tokens_is_respected(policy, prompts):
    params = [SamplingParams(max_tokens=n, temperature=1.0, seed=5) for n in (1, 4, 9, 2)]
    gens = policy.generate(prompts, params)
    for param, gen in zip(params, gens):
        assert len(gen.token_ids) == len(gen.logprobs) == len(gen.entropies) == param.max_tokens
        assert gen.finish_reason == "length"


@pytest.mark.parametrize("where", [0.3, 0.9])
def test_stop_string_ends_generation(policy, prompts, where):
    free = policy.generate([prompts[1]], SamplingParams(max_tokens=40, temperature=0))[0]
    text = free.text.replace("\ufffd", "")
    at = int(len(text) * where)
    stop = text[at: at + 2]
    assert len(stop) == 2
    stopped = SamplingParams(max_tokens=40, temperature=0, stop=(stop, "\u2603never"))
    cut, other = policy.generate([prompts[1], prompts[0]], [stopped, SamplingParams(max_tokens=40, temperature=0)])
    # A row without stop strings in the same batch is unaffected.
    alone = policy.generate([prompts[0]], SamplingParams(max_tokens=40, temperature=0))[0]
    assert (other.token_ids, other.text, other.finish_reason) == (alone.token_ids, alone.text, alone.finish_reason)
    text = free.text
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop) + len(stop)]
    assert len(cut.token_ids) < len(free.token_ids)
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    # The stop string was completed by the last sampled token, not earlier.
    before = policy.tokenizer.decode(list(cut.token_ids[:-1]), skip_special_tokens=True)
    assert stop not in before


def test_eos_is_kept_and_rows_stop_growing(policy, prompts):
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    with forced_eos(policy, after=3):
        gens = policy.generate(prompts, [SamplingParams(max_tokens=n, temperature=1.0, seed=2) for n in (10, 2, 10, 4)])
    for gen, expected_len in zip(gens, (4, 2, 4, 4)):
        assert len(gen.token_ids) == expected_len
    for gen in (gens[0], gens[2], gens[3]):
        assert gen.token_ids[-1] == eos and gen.finish_reason == "stop"
        assert eos not in gen.token_ids[:-1]
        assert gen.logprobs[-1] == pytest.approx(0.0, abs=1e-3)
        assert "<|im_end|>" not in gen.text
    assert gens[1].finish_reason == "length" and eos not in gens[1].token_ids


def test_rows_finishing_early_do_not_disturb_the_others(policy, prompts):
    """Finished rows are dropped from the batch and its KV cache; the rest must be unaffected."""
    many = prompts * 3
    params = [SamplingParams(max_tokens=1 + (i % 5) * 3, temperature=0) for i in range(len(many))]
    gens = policy.generate(many, params)
    for prompt, param, gen in zip(many, params, gens):
        assert list(gen.token_ids) == reference_greedy(policy.model, prompt, param.max_tokens)[0]


# ---- policy API --------------------------------------------------------------------------------------


def test_act_runs_in_a_thread_and_renders_messages_when_no_ids(policy):
    messages = ({"role": "user", "content": "What is 27*42?"},)
    rendered = policy.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    ids = tuple(policy.tokenizer.encode(rendered, add_special_tokens=False))
    sampling = SamplingParams(max_tokens=5, temperature=0)
    gens = asyncio.run(policy.act([GenerationRequest(messages, None, sampling), GenerationRequest(messages, ids, sampling)]))
    assert len(gens) == 2
    assert gens[0].token_ids == gens[1].token_ids and gens[0].text == gens[1].text
    assert gens[0].logprobs == pytest.approx(gens[1].logprobs, abs=1e-5)
    assert asyncio.run(policy.act([])) == []
    assert policy.tokenizer is not None and policy.name == "tiny"
    # Continuous batching (the default) takes every waiting request at once; the reference loop one batch at a time.
    assert policy.max_concurrency > 1
    assert HFPolicy(policy.model, policy.tokenizer, sampler="reference").max_concurrency == 1


def test_chat_agent_sequence_splits_into_actions_and_template(policy):
    tokenizer = policy.tokenizer
    agent = ChatAgent(tokenizer)
    agent.start("Use the calculator.", "What is 27*42?")
    segments: list[tuple[int, list[int]]] = [(0, list(agent.token_ids))]
    sampling = SamplingParams(max_tokens=12, temperature=0.8, seed=0)
    texts = []
    with forced_eos(policy, after=5) as calls:
        for turn, observation in enumerate(("Result: 1134", "Correct.")):
            calls["n"] = 0
            (gen,) = asyncio.run(policy.act([agent.request(sampling, episode_id="e0")]))
            assert gen.finish_reason == "stop"
            texts.append(gen.text)
            action = agent.record_action(gen)
            segments.append((1, list(action)))
            before = len(agent.token_ids)
            agent.add_observation(observation)
            segments.append((0, agent.token_ids[before:]))
    assert [i for _, ids in segments for i in ids] == agent.token_ids
    actions = [ids for mask, ids in segments if mask == 1]
    for text, ids in zip(texts, actions):
        assert tokenizer.decode(ids, skip_special_tokens=False) == text + "<|im_end|>"
    rendered = tokenizer.apply_chat_template(agent.messages, tokenize=False, add_generation_prompt=True)
    assert "".join(tokenizer.decode(ids, skip_special_tokens=False) for _, ids in segments) == rendered
    # Template parts are exactly the ChatML glue around the observations.
    assert tokenizer.decode(segments[2][1], skip_special_tokens=False) == (
        "\n<|im_start|>user\nResult: 1134<|im_end|>\n<|im_start|>assistant\n"
    )


# ---- errors -------------------------------------------------------------------------------------------


def test_from_pretrained_errors_say_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        HFPolicy.from_pretrained(tmp_path / "missing")
    with pytest.raises(ConfigError, match="no config.json"):
        HFPolicy.from_pretrained(tmp_path)


def test_bad_arguments_raise_config_errors(policy, prompts):
    with pytest.raises(ConfigError, match="one per prompt"):
        policy.generate(prompts, [SamplingParams()])
    with pytest.raises(ConfigError, match="empty"):
        policy.generate([[]], SamplingParams())
    with pytest.raises(ConfigError, match="max_batch_size"):
        HFPolicy(policy.model, policy.tokenizer, max_batch_size=0)
    with pytest.raises(ConfigError, match="dtype"):
        HFPolicy(policy.model, policy.tokenizer, dtype="float33")
    assert policy.generate([], SamplingParams()) == []


def test_from_pretrained_brings_the_trained_system_prompt_to_rollouts(model_dir, tmp_path):
    """A plain RolloutEngine over a from_pretrained policy (no system prompt given) rolls out with the prompt the model
    was trained with."""
    import shutil

    from agentgym.policies.rollout_defaults import save_rollout_defaults
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    trained = shutil.copytree(model_dir, tmp_path / "trained")
    save_rollout_defaults(trained, system_prompt="Answer with calc(...).", max_tokens=8, suite="games-calc")
    policy = HFPolicy.from_pretrained(trained)
    assert policy.default_system_prompt == "Answer with calc(...)."
    assert HFPolicy.from_pretrained(model_dir).default_system_prompt is None
    config = RolloutConfig(sampling=SamplingParams(max_tokens=4, temperature=0.0), progress=False)

    def first_prompt(config: RolloutConfig) -> str:
        (trajectory,) = RolloutEngine(policy, config).run([EpisodeSpec("agentgym/Calculator-v0", seed=0)])
        return policy.tokenizer.decode(trajectory.token_view().input_ids)

    assert "Answer with calc(...)." in first_prompt(config)
    explicit = RolloutConfig(sampling=config.sampling, progress=False, system_prompt="Explicit wins.")
    assert "Explicit wins." in first_prompt(explicit) and "Answer with calc" not in first_prompt(explicit)


def test_cancelled_rows_stop_and_leave_the_others_untouched(policy, prompts):
    import threading

    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    alone = policy.generate(prompts[:2], greedy)
    gone = threading.Event()
    gone.set()
    out = policy.generate(prompts[:2], greedy, cancelled=[gone, None])
    assert out[0].finish_reason == "abort" and len(out[0].token_ids) == 1
    assert out[1].token_ids == alone[1].token_ids and out[1].finish_reason == alone[1].finish_reason
    with pytest.raises(ConfigError, match="one per prompt"):
        policy.generate(prompts[:2], greedy, cancelled=[None])


def test_a_seeded_request_samples_the_same_tokens_in_any_batch(policy, prompts):
    """Concurrent rollouts batch requests by timing; a request's samples must depend on its own seed only."""
    mine = SamplingParams(max_tokens=10, temperature=1.0, seed=21)
    (alone,) = policy.generate([prompts[1]], mine)
    others = [SamplingParams(max_tokens=10, temperature=1.0, seed=s) for s in (1, 2)]
    batched = policy.generate([prompts[0], prompts[1], prompts[3]], [others[0], mine, others[1]])
    assert batched[1].token_ids == alone.token_ids
    assert batched[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    twins = policy.generate([prompts[1], prompts[1]], mine)  # one seed twice (a GRPO group): independent draws
    assert twins[0].token_ids == alone.token_ids and twins[1].token_ids != twins[0].token_ids


def test_rows_sharing_a_seed_differ_across_batch_chunks(model_dir):
    """A group larger than max_batch_size runs in several chunks; its rows must still be independent samples."""
    small = HFPolicy.from_pretrained(model_dir, max_batch_size=2)
    prompt = small.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    gens = small.generate([prompt] * 6, SamplingParams(max_tokens=10, temperature=1.0, seed=4))
    assert len({g.token_ids for g in gens}) == 6
    assert [g.token_ids for g in gens] == [g.token_ids for g in small.generate([prompt] * 6,
                                                                                SamplingParams(max_tokens=10,
                                                                                               temperature=1.0,
                                                                                               seed=4))]


# ---- constrained decoding (SamplingParams.choices) -------------------------------------------------------
CHOICES = ("forward()", "turn_left()", "turn_right()", "done()")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_choices_give_exactly_one_allowed_reply_with_model_logprobs_and_forced_marks(policy, prompts, temperature):
    from agentgym.policies.choices import ChoiceTree

    eos = policy.tokenizer.eos_token_id
    tree = ChoiceTree.for_tokenizer(CHOICES, policy.tokenizer, [eos] if eos in policy._stop_ids else policy._stop_ids)
    sampling = SamplingParams(max_tokens=16, temperature=temperature, seed=11, choices=CHOICES)
    seen = set()
    for _ in range(4):
        for prompt, gen in zip(prompts * 4, policy.generate(prompts * 4, sampling)):
            assert gen.text in CHOICES and gen.finish_reason == "stop"
            seen.add(gen.text)
            assert gen.token_ids[-1] in policy._stop_ids
            assert len(gen.forced) == len(gen.token_ids)
            ids, node = list(prompt), tree.root
            for token, logprob, entropy, forced in zip(gen.token_ids, gen.logprobs, gen.entropies, gen.forced):
                allowed = tree.allowed(node)
                assert token in allowed and forced == (len(allowed) == 1)
                logp = torch.log_softmax(full_forward_logits(policy.model, ids) / (temperature or 1.0), -1)
                assert logprob == pytest.approx(float(logp[token]), abs=1e-4)  # the model's own, as trainers score it
                constrained = torch.log_softmax(logp[list(allowed)], -1)
                assert entropy == pytest.approx(float(-(constrained.exp() * constrained).sum()), abs=1e-4)
                assert (entropy == pytest.approx(0.0, abs=1e-6)) == forced
                ids.append(token)
                node = tree.advance(node, token)
            if temperature == 0:
                break
    if temperature:
        assert len(seen) >= 2  # sampling, not a fixed reply


def test_free_rows_beside_constrained_rows_are_unchanged(policy, prompts):
    free = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    alone = policy.generate(prompts, free)
    mixed = policy.generate(prompts + prompts, [free] * len(prompts)
                            + [SamplingParams(max_tokens=16, temperature=1.0, seed=5, choices=CHOICES)] * len(prompts))
    for a, b in zip(alone, mixed[:len(prompts)]):
        assert a.token_ids == b.token_ids and a.forced is None and b.forced is None
    assert all(g.text in CHOICES for g in mixed[len(prompts):])


def test_choices_are_checked(policy, prompts):
    with pytest.raises(ConfigError, match="non-empty strings"):
        SamplingParams(choices=("forward()", ""))
    with pytest.raises(ConfigError, match="non-empty strings"):
        SamplingParams(choices="forward()")
    with pytest.raises(ConfigError, match="duplicates"):
        SamplingParams(choices=("done()", "done()"))
    with pytest.raises(ConfigError, match="raise max_tokens"):
        policy.generate(prompts[:1], SamplingParams(max_tokens=2, choices=CHOICES))


def test_the_reference_loop_passes_the_cache_under_the_name_the_model_takes(model_dir, prompts):
    """transformers 5 renamed the forward's ``past_key_values`` to ``cache``: the old name raises a FutureWarning
    on every forward (it is to be removed) and logs a deprecation once a process through transformers' own logger.
    Neither may come from our sampling."""
    import logging
    import warnings

    reference = HFPolicy.from_pretrained(model_dir, max_batch_size=8, sampler="reference")
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(handler)
    logging.Logger.warning_once.cache_clear()  # transformers' "once" must not hide a message an earlier test logged
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reference.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0.0))
    finally:
        transformers_logger.removeHandler(handler)
    messages = [str(w.message) for w in caught] + logged
    assert not [m for m in messages if "past_key_values" in m], messages
