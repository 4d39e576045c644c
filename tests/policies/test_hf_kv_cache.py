"""HFPolicy reuses each episode's KV cache across turns: same results as recomputing, bounded, freed at episode end."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests.helpers.tiny_models import build_context_sensitive_tiny_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError
from agentgym.models import TinyModelConfig
from agentgym.policies.base import SamplingParams
from agentgym.policies.hf import HFPolicy
from agentgym.policies.kv_batch import plain_dynamic_layers
from agentgym.policies.kv_cache import (
    CachedPrefix,
    EpisodeKVCache,
    common_prefix_length,
)

CONFIG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                         max_position_embeddings=1024, vocab_size=400, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_context_sensitive_tiny_model(tmp_path_factory.mktemp("kv") / "tiny", CONFIG)


@pytest.fixture(scope="module")
def reuse(model_dir):
    return HFPolicy.from_pretrained(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def recompute(reuse):
    return HFPolicy(reuse.model, reuse.tokenizer, max_batch_size=8, kv_cache_episodes=0)


@pytest.fixture(autouse=True)
def fresh_cache(request):
    """Each test starts from an empty cache, even after a failing one left entries behind."""
    yield
    if "reuse" in request.fixturenames:
        request.getfixturevalue("reuse").kv_cache.clear()


def encode(policy, text):
    return policy.tokenizer.encode(text, add_special_tokens=False)


def opening(policy, i):
    """Episode i's first prompt; lengths differ per episode so cached and suffix parts are padded differently."""
    return encode(policy, f"<|im_start|>system\nAgent {i}. " + "Use tools well. " * (i + 1)
                  + "<|im_end|>\n<|im_start|>user\nTask " + str(i) + "<|im_end|>\n<|im_start|>assistant\n")


def glue(policy, episode, turn):
    return encode(policy, f"\n<|im_start|>user\nobs {episode}.{turn} " + "ab" * (episode + turn)
                  + "<|im_end|>\n<|im_start|>assistant\n")


def assert_same(cached, plain, tol=1e-5):
    for a, b in zip(cached, plain, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=tol)
        assert a.entropies == pytest.approx(b.entropies, abs=tol)


def play(reuse, recompute, sampling_for, turns=4, episodes=5, late=()):
    """Run episodes turn by turn through both policies, checking every turn; ``late`` episodes join at turn 1."""
    prompts = {e: opening(reuse, e) for e in range(episodes)}
    for turn in range(turns):
        live = [e for e in range(episodes) if turn > 0 or e not in late]
        rows = [prompts[e] for e in live]
        params = [sampling_for(e, turn) for e in live]
        ids = [f"ep{e}" for e in live]
        with_cache = reuse.generate(rows, params, episode_ids=ids)
        assert_same(with_cache, recompute.generate(rows, params))
        for e, gen in zip(live, with_cache):
            prompts[e] = prompts[e] + list(gen.token_ids) + glue(reuse, e, turn)
    return prompts


def test_greedy_multi_turn_equals_recompute_and_reuses_the_prefix(reuse, recompute):
    before = dict(reuse.kv_cache.stats)
    # Different max_tokens per row: rows finish at different steps, so caches are also kept from rows dropped
    # mid-batch; episode 4 joins late, so cached and uncached rows share a batch.
    play(reuse, recompute, lambda e, t: SamplingParams(max_tokens=2 + 3 * e, temperature=0), late=(4,))
    stats = reuse.kv_cache.stats
    reused = stats["reused_tokens"] - before.get("reused_tokens", 0)
    prompt = stats["prompt_tokens"] - before.get("prompt_tokens", 0)
    assert stats["hits"] - before.get("hits", 0) == 3 * 5 - 1  # every turn after an episode's first one
    # Most of every later prompt came from the cache; the late joiner's whole prompt sets the suffix width at turn 1,
    # so that turn the others reuse only as much as keeps the batch no wider than recomputing.
    assert reused > 0.5 * prompt
    for e in range(5):
        reuse.end_episode(f"ep{e}")
    assert len(reuse.kv_cache) == 0 and reuse.kv_cache.tokens == 0


def test_sampled_multi_turn_logprobs_equal_recompute(reuse, recompute):
    play(reuse, recompute, lambda e, t: SamplingParams(max_tokens=6 + e, temperature=0.8, top_p=0.95, seed=t,
                                                       top_logprobs=3 if e == 1 else 0), turns=3)
    for e in range(5):
        reuse.end_episode(f"ep{e}")


def test_cache_covers_prompt_and_sampled_tokens_exactly(reuse):
    prompt = opening(reuse, 0)
    (gen,) = reuse.generate([prompt], SamplingParams(max_tokens=7, temperature=0), episode_ids=["exact"])
    entry = reuse.kv_cache._entries["exact"]
    # The last sampled token was never fed to the model, so it has no keys or values yet.
    assert entry.ids == tuple(prompt) + gen.token_ids[:-1]
    keys, values = entry.layers[0]
    assert keys.shape[1] == values.shape[1] == len(entry.ids)
    # They are the keys of an unpadded forward pass over the same ids.
    with torch.inference_mode():
        plain = reuse.model(torch.tensor([list(entry.ids)]), use_cache=True).past_key_values
    for (k, v), layer in zip(entry.layers, plain.layers):
        assert torch.allclose(k, layer.keys[0], atol=1e-5) and torch.allclose(v, layer.values[0], atol=1e-5)
    reuse.end_episode("exact")


def test_only_the_verified_prefix_is_reused(reuse, recompute):
    sampling = SamplingParams(max_tokens=5, temperature=0)
    prompt = opening(reuse, 2)
    (gen,) = reuse.generate([prompt], sampling, episode_ids=["v"])
    cached = tuple(prompt) + gen.token_ids[:-1]
    edited = list(prompt) + list(gen.token_ids) + glue(reuse, 2, 0)
    edited[10] = (edited[10] + 1) % 300  # history rewritten at token 10 (a template that re-renders the past)
    stats = reuse.kv_cache.stats
    for new_prompt, expect in ((edited, 10), (list(prompt), len(prompt) - 1), (list(prompt[:4]), 3)):
        before = stats["reused_tokens"]
        cached_gen = reuse.generate([new_prompt], sampling, episode_ids=["v"])
        assert_same(cached_gen, recompute.generate([new_prompt], sampling))
        assert stats["reused_tokens"] - before == min(expect, common_prefix_length(cached, new_prompt))
        (gen,) = reuse.generate([prompt], sampling, episode_ids=["v"])  # back to the original cache
        cached = tuple(prompt) + gen.token_ids[:-1]
    reuse.end_episode("v")


def test_a_new_episode_beside_cached_ones_never_widens_the_batch(reuse, recompute):
    sampling = SamplingParams(max_tokens=4, temperature=0)
    short = opening(reuse, 0)
    (gen,) = reuse.generate([short], sampling, episode_ids=["old"])
    old_next = short + list(gen.token_ids) + glue(reuse, 0, 0)
    new = (opening(reuse, 9) * 2)[: len(old_next) - 20]  # longer than the old episode's suffix, shorter than its prompt
    assert len(old_next) - len(short) < len(new) < len(old_next)
    widths = []
    handle = reuse.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["attention_mask"].shape[1]), with_kwargs=True)
    try:
        before = reuse.kv_cache.stats["reused_tokens"]
        out = reuse.generate([old_next, new], sampling, episode_ids=["old", "new"])
    finally:
        handle.remove()
    assert_same(out, recompute.generate([old_next, new], sampling))
    assert widths[0] == len(old_next)  # cached part + suffix padded to the longest suffix: no wider than recomputing
    assert reuse.kv_cache.stats["reused_tokens"] - before == len(old_next) - len(new)
    reuse.end_episode("old")
    reuse.end_episode("new")


def test_cancelled_rows_keep_a_valid_cache(reuse, recompute):
    import threading

    sampling = SamplingParams(max_tokens=8, temperature=0)
    gone = threading.Event()
    gone.set()
    prompts = [opening(reuse, 0), opening(reuse, 3)]
    first = reuse.generate(prompts, sampling, cancelled=[gone, None], episode_ids=["c0", "c1"])
    assert first[0].finish_reason == "abort" and first[1].finish_reason == "length"
    assert reuse.kv_cache._entries["c0"].ids == tuple(prompts[0])  # its one sampled token was never fed
    nexts = [p + list(g.token_ids) + glue(reuse, i, 0) for i, (p, g) in enumerate(zip(prompts, first))]
    assert_same(reuse.generate(nexts, sampling, episode_ids=["c0", "c1"]), recompute.generate(nexts, sampling))
    reuse.end_episode("c0")
    reuse.end_episode("c1")


def test_lru_limits_on_episodes_and_tokens(reuse):
    prompts = [opening(reuse, i) for i in range(4)]
    sampling = SamplingParams(max_tokens=3, temperature=0)
    few = HFPolicy(reuse.model, reuse.tokenizer, kv_cache_episodes=2)
    for i, p in enumerate(prompts):
        few.generate([p], sampling, episode_ids=[f"e{i}"])
    assert list(few.kv_cache._entries) == ["e2", "e3"]
    few.generate([prompts[2] + [5]], sampling, episode_ids=["e2"])  # a hit makes e2 the most recent
    few.generate([prompts[0]], sampling, episode_ids=["e0"])
    assert list(few.kv_cache._entries) == ["e2", "e0"]

    budget = len(prompts[3]) + 3
    small = HFPolicy(reuse.model, reuse.tokenizer, kv_cache_tokens=budget)
    small.generate(prompts, sampling, episode_ids=[f"e{i}" for i in range(4)])
    assert 0 < small.kv_cache.tokens <= budget and len(small.kv_cache) == 1
    small.generate([prompts[3] * 2], sampling, episode_ids=["long"])  # longer than the whole budget: not kept
    assert "long" not in small.kv_cache._entries and small.kv_cache.tokens <= budget


def test_episode_hooks_free_and_no_ids_cache_nothing(reuse):
    prompt = opening(reuse, 1)
    sampling = SamplingParams(max_tokens=3, temperature=0)
    reuse.generate([prompt, prompt], sampling)
    reuse.generate([prompt], sampling, episode_ids=[""])
    assert len(reuse.kv_cache) == 0
    reuse.generate([prompt], sampling, episode_ids=["hooked"])
    assert len(reuse.kv_cache) == 1
    reuse.begin_episode("hooked", None)  # a reused id starts empty
    assert len(reuse.kv_cache) == 0
    reuse.generate([prompt], sampling, episode_ids=["hooked"])
    reuse.end_episode("hooked")
    assert len(reuse.kv_cache) == 0 and reuse.kv_cache.tokens == 0
    with pytest.raises(ConfigError, match="one per prompt"):
        reuse.generate([prompt], sampling, episode_ids=["a", "b"])


def test_act_passes_episode_ids_and_matches_recompute(reuse, recompute):
    # The reference loop's episode cache (the default continuous sampler keeps episodes in slots instead:
    # tests/policies/test_continuous.py).
    reuse = HFPolicy(reuse.model, reuse.tokenizer, max_batch_size=8, sampler="reference")
    agents = {policy: ChatAgent(reuse.tokenizer) for policy in (reuse, recompute)}
    for agent in agents.values():
        agent.start("Use the calculator.", "What is 27*42?")
    sampling = SamplingParams(max_tokens=6, temperature=0.7, seed=1)
    for turn in range(3):
        gens = {p: asyncio.run(p.act([a.request(sampling, episode_id="chat")]))[0] for p, a in agents.items()}
        assert_same([gens[reuse]], [gens[recompute]])
        for policy, agent in agents.items():
            agent.record_action(gens[policy])
            agent.add_observation(f"Result {turn}")
    assert reuse.kv_cache.stats["hits"] >= 2 and "chat" in reuse.kv_cache._entries
    reuse.end_episode("chat")


def test_rollout_engine_reuses_and_frees(model_dir):
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    policy = HFPolicy.from_pretrained(model_dir)
    plain = HFPolicy(policy.model, policy.tokenizer, kv_cache_episodes=0)
    config = RolloutConfig(sampling=SamplingParams(max_tokens=6, temperature=0.0), progress=False)
    specs = [EpisodeSpec("agentgym/GuessNumber-v0", seed=s) for s in range(3)]
    with_cache = RolloutEngine(policy, config).run(specs)
    without = RolloutEngine(plain, config).run(specs)
    assert [[t.action_token_ids for t in tr.turns] for tr in with_cache] == [
        [t.action_token_ids for t in tr.turns] for tr in without]
    assert sum(len(tr.turns) for tr in with_cache) > len(specs)  # multi-turn, so later turns could hit
    assert policy.kv_cache.stats["hits"] > 0
    assert len(policy.kv_cache) == 0 and policy.kv_cache.tokens == 0  # end_episode freed every entry


def test_a_weight_update_invalidates_the_cache(model_dir):
    policy = HFPolicy.from_pretrained(model_dir)  # its own copy of the weights, changed below
    plain = HFPolicy(policy.model, policy.tokenizer, kv_cache_episodes=0)
    sampling = SamplingParams(max_tokens=6, temperature=0)
    prompt = opening(policy, 1)
    (gen,) = policy.generate([prompt], sampling, episode_ids=["w"])
    following = prompt + list(gen.token_ids) + glue(policy, 1, 0)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.5)
    policy.model(torch.tensor([following])).logits.float().logsumexp(-1).mean().backward()
    optimizer.step()  # in place, like a trainer's update of the policy it rolls out with
    before = policy.kv_cache.stats["reused_tokens"]
    assert_same(policy.generate([following], sampling, episode_ids=["w"]), plain.generate([following], sampling))
    assert policy.kv_cache.stats["reused_tokens"] == before  # nothing computed by the old weights was used
    assert "w" in policy.kv_cache._entries  # and the new turn is cached again


def test_limits_are_validated(reuse):
    for bad in (-1, 1.5, True, "8", None):
        with pytest.raises(ConfigError, match="kv_cache_episodes"):
            HFPolicy(reuse.model, reuse.tokenizer, kv_cache_episodes=bad)
        with pytest.raises(ConfigError, match="kv_cache_tokens"):
            HFPolicy(reuse.model, reuse.tokenizer, kv_cache_tokens=bad)
    off = HFPolicy(reuse.model, reuse.tokenizer, kv_cache_tokens=0)
    off.generate([opening(reuse, 0)], SamplingParams(max_tokens=2, temperature=0), episode_ids=["x"])
    assert not off.kv_cache.enabled and len(off.kv_cache) == 0


def test_live_episodes_are_never_evicted_for_the_episode_limit_and_keep_a_stable_subset_under_the_token_limit():
    entry = CachedPrefix((1, 2, 3), ())
    store = EpisodeKVCache(2, 100)
    for name in "abcd":
        store.begin(name)
        store.store(name, entry)
    assert list(store._entries) == ["a", "b", "c", "d"]  # four live episodes, although the limit says two
    store.store("old", entry)  # not live: the first to go once over a limit
    assert "old" not in store._entries and len(store) == 4
    store.drop("a")
    store.drop("b")  # ended, and freed
    store.begin("e")
    store.store("e", entry)
    assert list(store._entries) == ["c", "d", "e"]
    for name in "cde":
        store.drop(name)
    for name in "fgh":  # no episode live: the plain least-recently-used limit of two
        store.store(name, entry)
    assert list(store._entries) == ["g", "h"]

    tight = EpisodeKVCache(64, 7)
    tight.store("ended", CachedPrefix((9,), ()))  # never begun: evicted before any live one
    for name in "xyz":
        tight.begin(name)
        tight.store(name, entry)
    # x and y fill the budget; z, stored last, is the one not kept (round-robin turns would otherwise evict the
    # entry needed next, every turn), and a live episode's longer entry replaces its own
    assert list(tight._entries) == ["x", "y"] and tight.tokens == 6
    tight.store("x", CachedPrefix((1, 2, 3, 4), ()))
    assert list(tight._entries) == ["y", "x"] and tight.tokens == 7
    tight.store("y", CachedPrefix((1, 2, 3, 4), ()))  # no room for it beside x: y's old entry is gone, y not kept
    assert list(tight._entries) == ["x"] and tight.tokens == 4


def test_results_of_an_episode_ended_mid_generation_are_not_kept():
    store = EpisodeKVCache(4, 100)
    entry = CachedPrefix((1, 2, 3), ())
    store.begin_generation(["a", "b"])
    store.drop("a")  # the engine ended episode a while its turn was being generated
    store.store("a", entry)
    store.store("b", entry)
    assert list(store._entries) == ["b"]
    store.end_generation(["a", "b"])
    store.store("a", entry)  # a new generation for a (a reused id) is kept again
    assert list(store._entries) == ["b", "a"] and store.tokens == 6


def test_sliding_window_caches_are_not_reused():
    from transformers.cache_utils import (
        DynamicCache,
        DynamicLayer,
        DynamicSlidingWindowLayer,
    )

    kv = torch.zeros(1, 2, 3, 4)
    plain = DynamicCache(ddp_cache_data=[(kv, kv), (kv, kv)])
    assert plain_dynamic_layers(plain) is not None and all(type(x) is DynamicLayer for x in plain.layers)
    mixed = DynamicCache(ddp_cache_data=[(kv, kv), (kv, kv, torch.tensor(2))])
    assert isinstance(mixed.layers[1], DynamicSlidingWindowLayer)
    assert plain_dynamic_layers(mixed) is None
    assert plain_dynamic_layers(None) is None and plain_dynamic_layers(((kv, kv),)) is None
