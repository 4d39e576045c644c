"""HFPolicy's continuous-batching sampler: the reference loop's ids, full-forward log-probs, rows joining mid-decode.

Log-probs are compared to 1e-5 absolute or relative, whichever is looser: rows batched with others run through matrix
products of other shapes, whose float32 sums round differently (measured up to 2.4e-6 relative on a log-prob of -4.7).
"""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

from tests.helpers.scripts import REPO
from tests.helpers.tiny_models import build_context_sensitive_tiny_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError
from agentgym.models import TinyModelConfig
from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.hf import HFPolicy

CONFIG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                         max_position_embeddings=512, vocab_size=400, tie_word_embeddings=False)
TEXTS = ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
         "<|im_start|>system\nUse the calculator.<|im_end|>\n<|im_start|>user\nWhat is 27*42?<|im_end|>\n"
         "<|im_start|>assistant\n", "x", "guess(50)", "move north, then east, then north again"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_context_sensitive_tiny_model(tmp_path_factory.mktemp("cont") / "tiny", CONFIG)


@pytest.fixture(scope="module")
def fast(model_dir):
    return HFPolicy.from_pretrained(model_dir, max_batch_size=8)


@pytest.fixture(scope="module")
def ref(fast):
    return HFPolicy(fast.model, fast.tokenizer, max_batch_size=8, sampler="reference")


def requests(policy, sampling, episodes=None):
    ids = [policy.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    samplings = sampling if isinstance(sampling, list) else [sampling] * len(ids)
    return [GenerationRequest(({"role": "user", "content": "-"},), tuple(p), s,
                              episode_id=episodes[i] if episodes else None)
            for i, (p, s) in enumerate(zip(ids, samplings))]


def act(policy, reqs):
    return asyncio.run(policy.act(reqs))


def full_forward_logprobs(model, prompt, tokens, temperature):
    """Log-probs of ``tokens`` after ``prompt`` from one plain forward pass of the whole sequence (no cache)."""
    ids = list(prompt) + list(tokens)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def test_the_default_is_continuous_and_the_old_loop_stays_selectable(fast, ref):
    assert fast.sampler == "continuous" and fast.max_concurrency > 1
    assert ref.sampler == "reference" and ref.max_concurrency == 1
    with pytest.raises(ConfigError, match="sampler must be one of"):
        HFPolicy(fast.model, fast.tokenizer, sampler="fastest")


def test_greedy_is_identical_to_the_reference_sampler(fast, ref):
    sampling = [SamplingParams(max_tokens=n, temperature=0) for n in (12, 3, 20, 7, 1)]
    got, want = act(fast, requests(fast, sampling)), act(ref, requests(ref, sampling))
    assert fast._continuous is not None  # the fast path ran
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason and g.text == w.text
        assert g.logprobs == pytest.approx(w.logprobs, rel=1e-5, abs=1e-5)
        assert g.entropies == pytest.approx(w.entropies, abs=1e-5)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_seeded_sampling_draws_the_reference_ids_with_full_forward_logprobs(fast, ref, temperature, top_p):
    sampling = [SamplingParams(max_tokens=16, temperature=temperature, top_p=top_p, seed=100 + i) for i in range(5)]
    got, want = act(fast, requests(fast, sampling)), act(ref, requests(ref, sampling))
    prompts = [r.prompt_token_ids for r in requests(fast, sampling)]
    for g, w, prompt in zip(got, want, prompts):
        assert g.token_ids == w.token_ids
        fresh = full_forward_logprobs(fast.model, prompt, g.token_ids, temperature)
        assert g.logprobs == pytest.approx(fresh, abs=1e-5)


def test_rows_joining_a_running_batch_get_what_they_get_alone(fast):
    """Requests sent while others decode join the running batch; each one's result is what it gets alone."""
    reqs = requests(fast, [SamplingParams(max_tokens=24, temperature=1.0, seed=5 + i) for i in range(5)])
    alone = [act(fast, [r])[0] for r in reqs]

    async def staggered():
        tasks = []
        for r in reqs:
            tasks.append(asyncio.ensure_future(fast.act([r])))
            await asyncio.sleep(0.003)  # later requests arrive while earlier ones decode
        return [(await t)[0] for t in tasks]

    together = asyncio.run(staggered())
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, rel=1e-5, abs=1e-5)


def test_more_requests_than_slots_all_finish(model_dir, ref):
    small = HFPolicy(ref.model, ref.tokenizer, max_batch_size=2)
    sampling = [SamplingParams(max_tokens=6 + i, temperature=0) for i in range(5)]
    got, want = act(small, requests(small, sampling)), act(ref, requests(ref, sampling))
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_multi_turn_episodes_reuse_their_slots_and_match_a_full_forward(fast, ref):
    agents = {p: [ChatAgent(fast.tokenizer) for _ in range(3)] for p in (fast, ref)}
    for group in agents.values():
        for i, agent in enumerate(group):
            agent.start("Use the calculator.", f"What is {i + 3}*{i + 7}?")
    before = fast.kv_cache.stats["reused_tokens"]
    for turn in range(4):
        sampling = [SamplingParams(max_tokens=8, temperature=0.9, seed=10 * turn + i) for i in range(3)]
        outs = {p: act(p, [a.request(s, episode_id=f"ep{i}") for i, (a, s) in enumerate(zip(group, sampling))])
                for p, group in agents.items()}
        for i in range(3):
            g, w = outs[fast][i], outs[ref][i]
            assert g.token_ids == w.token_ids
            prompt = agents[fast][i].token_ids
            assert g.logprobs == pytest.approx(full_forward_logprobs(fast.model, prompt, g.token_ids, 0.9), rel=1e-5,
                                               abs=1e-5)
        for p, group in agents.items():
            for agent, gen in zip(group, outs[p]):
                agent.record_action(gen)
                agent.add_observation(f"Result {turn}")
    assert fast.kv_cache.stats["reused_tokens"] > before  # later turns ran only their new tokens
    for i in range(3):
        fast.end_episode(f"ep{i}")
        ref.end_episode(f"ep{i}")
    assert not fast._continuous._of_episode  # every slot freed


def test_a_weight_update_is_never_served_from_old_keys(model_dir):
    policy = HFPolicy.from_pretrained(model_dir)  # its own weights, changed below
    agent = ChatAgent(policy.tokenizer)
    agent.start("Use the calculator.", "What is 2+2?")
    sampling = SamplingParams(max_tokens=6, temperature=0)
    (gen,) = act(policy, [agent.request(sampling, episode_id="w")])
    agent.record_action(gen)
    agent.add_observation("Result 4")
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.5)  # in place, like an optimizer step
    before = policy.kv_cache.stats["reused_tokens"]
    (gen,) = act(policy, [agent.request(sampling, episode_id="w")])
    assert policy.kv_cache.stats["reused_tokens"] == before
    fresh = full_forward_logprobs(policy.model, agent.token_ids, gen.token_ids, 0)
    assert gen.logprobs == pytest.approx(fresh, abs=1e-5)
    policy.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_choices_and_stop_strings_match_the_reference(fast, ref, temperature):
    choices = ('move("up")', 'move("down")', "guess(50)", "guess(51)")
    constrained = [SamplingParams(max_tokens=12, temperature=temperature, seed=i, choices=choices) for i in range(3)]
    stopping = [SamplingParams(max_tokens=30, temperature=1.0, seed=40 + i, stop=("e", "o")) for i in range(2)]
    sampling = constrained + stopping
    got, want = act(fast, requests(fast, sampling)), act(ref, requests(ref, sampling))
    for g, w in zip(got, want):
        assert (g.token_ids, g.text, g.finish_reason, g.forced) == (w.token_ids, w.text, w.finish_reason, w.forced)
        assert g.logprobs == pytest.approx(w.logprobs, rel=1e-5, abs=1e-5)
        assert g.entropies == pytest.approx(w.entropies, abs=1e-5)
    assert all(g.text in choices for g in got[:3])
    assert any(g.finish_reason == "stop" and g.text[-1] in "eo" for g in got[3:])


def test_top_logprobs_equal_the_reference(fast, ref):
    """ARPO's branching reads each position's k best alternatives; a row that asks for fewer keeps a prefix."""
    sampling = [SamplingParams(max_tokens=10, temperature=1.0, seed=i, top_logprobs=k) for i, k in
                enumerate((3, 0, 5, 1, 2))]
    got, want = act(fast, requests(fast, sampling)), act(ref, requests(ref, sampling))
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.top_token_ids == w.top_token_ids
        assert (g.top_logprobs is None) == (w.top_logprobs is None)
        for a, b in zip(g.top_logprobs or (), w.top_logprobs or ()):
            assert a == pytest.approx(b, abs=1e-5)


def test_requests_it_cannot_serve_take_the_reference_loop(fast, ref):
    # So many slots that the slot cache's memory bound leaves each fewer tokens than these prompts need.
    crowded = HFPolicy(fast.model, fast.tokenizer, max_batch_size=65536 // 8)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    got, want = act(crowded, requests(crowded, greedy)), act(ref, requests(ref, greedy))
    assert crowded._continuous is None and [g.token_ids for g in got] == [w.token_ids for w in want]


def test_rollout_engine_gets_identical_trajectories(model_dir, fast, ref):
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    config = RolloutConfig(sampling=SamplingParams(max_tokens=6, temperature=1.0, seed=3), progress=False)
    specs = [EpisodeSpec("agentgym/GuessNumber-v0", seed=s, sampling_seed=s) for s in range(4)]
    got = RolloutEngine(fast, config).run(specs)
    want = RolloutEngine(ref, config).run(specs)
    def ids(trajectories):
        return [[t.action_token_ids for t in tr.turns] for tr in trajectories]

    assert ids(got) == ids(want)
    assert sum(len(tr.turns) for tr in got) > len(specs)
    assert not fast._continuous._of_episode  # the engine's end_episode freed every slot


def test_forced_tokens_of_a_choice_run_in_one_forward_with_the_reference_numbers(model_dir, ref):
    """``move("up")``'s tokens after the choice have one continuation each: one forward feeds them all, and every
    recorded id, log-prob, entropy and forced flag is still what the reference gets token by token."""
    policy = HFPolicy.from_pretrained(model_dir, max_batch_size=8)
    choices = ('move("up")', 'move("down")', 'move("left")')
    sampling = [SamplingParams(max_tokens=12, temperature=1.0, seed=i, choices=choices) for i in range(5)]
    forwards = []
    act(policy, requests(policy, sampling[:1]))  # starts the decode thread and its slot model
    net = policy._continuous.net
    for name in ("prefill", "decode"):
        original = getattr(net, name)
        setattr(net, name, lambda *a, _o=original, **k: forwards.append(1) or _o(*a, **k))
    got = act(policy, requests(policy, sampling))
    want = act(ref, requests(ref, sampling))
    for g, w in zip(got, want):
        assert (g.token_ids, g.text, g.finish_reason, g.forced) == (w.token_ids, w.text, w.finish_reason, w.forced)
        assert g.logprobs == pytest.approx(w.logprobs, rel=1e-5, abs=1e-5)
        assert g.entropies == pytest.approx(w.entropies, abs=1e-5)
    steps = max(len(g.token_ids) for g in got)
    assert sum(g.forced.count(True) for g in got) > 0
    # One prefill, then one forward per free choice and the runs of forced tokens between (not one per token).
    assert len(forwards) < steps, (len(forwards), steps)
    policy.close()


def test_a_policy_dropped_without_close_ends_its_decode_thread_and_frees_its_cache(model_dir):
    import gc
    import threading
    import weakref

    policy = HFPolicy.from_pretrained(model_dir, max_batch_size=4)
    act(policy, requests(policy, SamplingParams(max_tokens=3, temperature=1.0, seed=1))[:2])
    # this policy's own thread (other tests' threads may be ending at the same time, so no global count)
    thread = policy._continuous._thread
    assert thread is not None and thread.is_alive() and thread.name == "agentgym-continuous-sampler"
    sampler = weakref.ref(policy._continuous)
    del policy  # no close(): a training loop or a notebook that simply lets it go
    gc.collect()
    for _ in range(100):  # the finalizer asks the thread to stop; it ends within one wake-up
        if not thread.is_alive() and sampler() is None:
            break
        threading.Event().wait(0.05)
        gc.collect()
    assert not thread.is_alive() and sampler() is None  # the thread, and with it the slot cache, are gone


EXIT_SCRIPT = """
import asyncio, sys, threading
from agentgym.policies import GenerationRequest, HFPolicy, SamplingParams
from agentgym.policies import continuous

policy = HFPolicy.from_pretrained(sys.argv[1], max_batch_size=4)
ids = tuple(policy.tokenizer.encode("guess(50)", add_special_tokens=False))
request = GenerationRequest(({"role": "user", "content": "-"},), ids, SamplingParams(max_tokens=3, temperature=1.0, seed=1))
asyncio.run(policy.act([request, request]))
if sys.argv[2] == "dropped":
    del policy  # a script that lets its policy go just before it ends: its thread is ending as the script does
continuous._end_decode_threads()  # what the interpreter's exit hooks run before it finalizes
alive = [t for t in threading.enumerate() if t.name == "agentgym-continuous-sampler" and t.is_alive()]
print("decode threads alive at finalization:", len(alive), flush=True)
"""


@pytest.mark.parametrize("policy_at_exit", ["dropped", "kept"])
def test_no_decode_thread_runs_while_the_interpreter_finalizes(model_dir, tmp_path, policy_at_exit):
    """A decode thread still ending (freeing its slot cache tensor by tensor) when the interpreter finalizes is
    unwound through torch's C++ frames and aborts the process (exit status 134, seen after TextWorld and BabyAI
    rollouts with a 256-slot cache) once the script's work is done. The exit hook closes every sampler and waits
    for each decode thread, whether its policy is still held or was just dropped."""
    import subprocess
    import sys

    script = tmp_path / "ends.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(model_dir), policy_at_exit], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "decode threads alive at finalization: 0" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_on_a_gpu_the_continuous_sampler_draws_the_reference_ids_with_full_forward_logprobs(model_dir, temperature):
    """The same equalities on CUDA, where other kernels (and other float32 sums) compute every forward."""
    fast = HFPolicy.from_pretrained(model_dir, max_batch_size=8, device="cuda")
    ref = HFPolicy(fast.model, fast.tokenizer, max_batch_size=8, sampler="reference", device="cuda")
    try:
        sampling = [SamplingParams(max_tokens=16, temperature=temperature, seed=200 + i) for i in range(5)]
        got, want = act(fast, requests(fast, sampling)), act(ref, requests(ref, sampling))
        assert fast._continuous is not None  # the fast path ran, on the GPU
        assert next(fast.model.parameters()).device.type == "cuda"
        for g, w, r in zip(got, want, requests(fast, sampling)):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            ids = list(r.prompt_token_ids) + list(g.token_ids)
            with torch.inference_mode():
                logits = fast.model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
            logp = torch.log_softmax(logits / (temperature or 1.0), -1)
            fresh = [float(logp[len(r.prompt_token_ids) - 1 + i, t]) for i, t in enumerate(g.token_ids)]
            assert g.logprobs == pytest.approx(fresh, rel=1e-4, abs=1e-4)
    finally:
        fast.close()
        ref.close()
