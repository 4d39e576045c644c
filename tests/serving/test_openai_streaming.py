"""`agentgym serve` with the continuous sampler behind it, driven by the official `openai` client: tokens stream
live, new requests join the running batch, disconnects stop rows within a step, vLLM's sampling fields reach the
sampler, prompts that extend earlier ones reuse their keys and values, and /metrics reports latencies."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.policies.base import SamplingParams  # noqa: E402

MODEL = "tiny-stream"
MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return HFPolicy.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config),
                                    max_batch_size=8)


@pytest.fixture(scope="module")
def server(hf_policy: Any) -> Any:
    from agentgym.serving.openai_server import ServerThread

    with ServerThread(hf_policy, model_name=MODEL, max_batch_size=8, batch_window_s=0.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _timed_stream(client: Any, **kwargs: Any) -> tuple[list[float], list[Any], float]:
    start = time.perf_counter()
    times, chunks = [], []
    for chunk in client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **kwargs):
        times.append(time.perf_counter() - start)
        chunks.append(chunk)
    return times, chunks, time.perf_counter() - start


def test_tokens_leave_as_they_are_sampled(client: Any) -> None:
    # The server's first request also builds the sampler's slots: not part of what this measures.
    _timed_stream(client, max_tokens=2, temperature=0)
    # min_tokens = max_tokens: the reply runs its full length whatever the tiny model would end with.
    times, chunks, total = _timed_stream(client, max_tokens=200, temperature=0,
                                         extra_body={"min_tokens": 200, "return_token_ids": True})
    token_times = [t for t, c in zip(times, chunks) if c.choices and getattr(c.choices[0], "token_ids", None)]
    assert len(token_times) == 200  # one chunk per token
    # Spread over the generation: the first token long before the last (the old batcher sent all at the end).
    assert token_times[0] < 0.5 * token_times[-1], (token_times[0], token_times[-1])
    assert len({round(t, 3) for t in token_times}) > 20


def test_a_request_joins_the_running_batch(client: Any) -> None:
    """A short request sent while a long stream generates finishes before the long one does."""
    first_token = threading.Event()
    long_done: list[float] = []

    def long_stream() -> None:
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, max_tokens=400,
                                                temperature=0, extra_body={"min_tokens": 400})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content is not None:
                first_token.set()
        long_done.append(time.perf_counter())

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert first_token.wait(60)
    short = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0,
                                           extra_body={"min_tokens": 3})
    short_done = time.perf_counter()
    thread.join(120)
    assert short.usage.completion_tokens == 3
    assert long_done and short_done < long_done[0]


def test_disconnect_stops_generation_within_a_step(server: Any, hf_policy: Any) -> None:
    sampler = hf_policy._continuous_sampler()
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 1500, "min_tokens": 1500,
            "temperature": 0}
    with httpx.Client(timeout=60) as http, http.stream("POST", server.base_url + "/chat/completions",
                                                         json=body) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        at_close = sampler.tokens_sampled
    deadline = time.monotonic() + 30
    while hf_policy.continuous_load()[1] and time.monotonic() < deadline:
        time.sleep(0.01)
    after = sampler.tokens_sampled - at_close
    assert hf_policy.continuous_load() == (0, 0)
    # Tokens generated after the client closed: the HTTP layer notices, then the row leaves at the next step.
    assert after < 100, after


def test_sampling_fields_reach_the_sampler(client: Any, hf_policy: Any) -> None:
    from agentgym.policies.hf import HFPolicy

    ref = HFPolicy(hf_policy.model, hf_policy.tokenizer, sampler="reference")
    prompt = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1,
                                            extra_body={"return_token_ids": True}).prompt_token_ids
    fields = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.4, "presence_penalty": 0.3,
              "frequency_penalty": 0.2, "min_tokens": 4, "seed": 7}
    for stream in (False, True):
        kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0.9, "seed": 7,
                  "presence_penalty": 0.3, "frequency_penalty": 0.2, "logit_bias": {"40": 2.0},
                  "extra_body": {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.4, "min_tokens": 4,
                                 "return_token_ids": True}}
        if stream:
            ids = [t for c in client.chat.completions.create(stream=True, **kwargs) if c.choices
                   for t in (getattr(c.choices[0], "token_ids", None) or [])]
        else:
            ids = client.chat.completions.create(**kwargs).choices[0].token_ids
        want = ref.generate([prompt], SamplingParams(max_tokens=12, temperature=0.9, logit_bias={40: 2.0},
                                                     **fields))[0]
        assert ids == list(want.token_ids)
    forced = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0,
                                       logit_bias={"41": 100})
    assert forced.choices[0].text == hf_policy.tokenizer.decode([41] * 6)
    first = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0,
                                      extra_body={"return_token_ids": True}).choices[0].token_ids
    assert len(first) > 1 and first[1] not in hf_policy._stop_ids
    cut = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0,
                                    extra_body={"return_token_ids": True, "stop_token_ids": [first[1]]})
    assert cut.choices[0].token_ids == first[:first.index(first[1]) + 1] and cut.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, logit_bias={"999999": 1})
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, extra_body={"min_tokens": 5})


def test_a_prompt_extending_an_earlier_one_reuses_its_keys_with_equal_results(hf_policy: Any) -> None:
    sampler = hf_policy._continuous_sampler()
    tok = hf_policy.tokenizer
    first = tok.encode("<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3, min_tokens=10, top_logprobs=2)
    reply = hf_policy.continuous_submit(first, params).result(60)
    turn2 = first + list(reply.token_ids) + tok.encode("<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n",
                                                       add_special_tokens=False)
    before = sampler.prefix_tokens_reused
    reused = hf_policy.continuous_submit(turn2, params).result(60)
    assert sampler.prefix_tokens_reused - before >= len(first) + len(reply.token_ids) - 1
    fresh = hf_policy.continuous_submit(turn2, params, reuse_prefix=False).result(60)
    assert reused.token_ids == fresh.token_ids
    assert reused.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)
    assert reused.top_logprobs is not None and fresh.top_logprobs is not None
    for a, b in zip(reused.top_logprobs, fresh.top_logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def test_the_queue_is_bounded_with_503(hf_policy: Any) -> None:
    from agentgym.policies.hf import HFPolicy
    from agentgym.serving.openai_app import create_app
    from agentgym.serving.openai_server import ServerThread

    small = HFPolicy(hf_policy.model, hf_policy.tokenizer, max_batch_size=1)  # one slot: a second request waits
    app = create_app(small, model_name=MODEL, max_batch_size=1, max_queue_size=1)
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 300, "min_tokens": 300, "temperature": 0}

    async def run(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=120) as http:
            running = asyncio.create_task(http.post(url, json=body))
            while small.continuous_load()[1] == 0:
                await asyncio.sleep(0.01)
            waiting = asyncio.create_task(http.post(url, json=body))
            while small.continuous_load()[0] == 0:
                await asyncio.sleep(0.01)
            refused = await http.post(url, json=body)
            return [refused.status_code, (await running).status_code, (await waiting).status_code]

    try:
        with ServerThread(app) as srv:
            assert asyncio.run(run(srv.base_url + "/completions")) == [503, 200, 200]
    finally:
        small.close()


def test_metrics_report_latency_histograms_and_load(client: Any, server: Any) -> None:
    list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, max_tokens=8))
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        count = next(line for line in text.splitlines() if line.startswith(f"agentgym:{name}_count"))
        assert float(count.rsplit(" ", 1)[1]) > 0
        assert f'agentgym:{name}_bucket{{model_name="{MODEL}",le="+Inf"}}' in text
    for gauge in ("generation_tokens_per_second", "num_requests_waiting", "num_requests_running"):
        assert f"agentgym:{gauge}{{" in text


@pytest.mark.parametrize("skip_special", [True, False])
def test_stream_text_decodes_each_id_a_bounded_number_of_times(hf_policy: Any, skip_special: bool) -> None:
    """A streamed choice's text is extended from its new ids (plus a few of context), not decoded whole at every
    token: the ids handed to the tokenizer per token stay bounded however long the reply, and the text still equals
    the whole reply's decoding at every step (multi-byte characters split across ids, special tokens)."""
    import random

    from agentgym.serving.openai_generation import ServedModel
    from agentgym.serving.openai_protocol import Sampling
    from agentgym.serving.openai_streaming import ChoiceText

    tokenizer = hf_policy.tokenizer
    decoded = [0]

    class CountingTokenizer:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            decoded[0] += len(ids)
            return tokenizer.decode(ids, **kwargs)

    class Model:
        apply_stop = staticmethod(ServedModel.apply_stop)

    Model.tokenizer = CountingTokenizer()  # type: ignore[attr-defined]
    s = Sampling(max_tokens=None, temperature=0.0, top_p=1.0, stop=(), seed=None, include_stop=False,
                 return_token_ids=False, tokens_as_ids=False, skip_special_tokens=skip_special)
    rng = random.Random(0)
    ids = tokenizer.encode("naïve café: 12 + 30 = 42 ✓ — 東京 ok 🙂 " * 20, add_special_tokens=False)
    specials = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    ids = [t for i in ids for t in ([i, rng.choice(specials)] if rng.random() < 0.05 else [i])]
    ids += [rng.randrange(tokenizer.vocab_size) for _ in range(300)]  # arbitrary ids, bytes in any order
    text = ChoiceText(Model(), s, tools=False)
    streamed = ""
    for n, token in enumerate(ids):
        streamed += text.push(token)
        if n % 37 == 0:
            assert text._decoded(n) == tokenizer.decode(ids[:n], skip_special_tokens=skip_special)
    final = tokenizer.decode(ids, skip_special_tokens=skip_special)
    assert final.startswith(streamed) and streamed + text.rest(final) == final
    assert len(streamed) > len(final) // 2
    per_token = decoded[0] / len(ids)
    assert per_token < 40, f"{per_token:.0f} ids decoded per token: the whole reply is decoded again each token"
