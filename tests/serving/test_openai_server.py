"""The OpenAI-compatible server (agentgym.serving.openai_server) and the OpenAIPolicy client, end to end on the tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.agent import ChatAgent
from agentgym.errors import AgentGymError, ConfigError
from agentgym.policies import make_policy
from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.openai import OpenAIPolicy
from agentgym.policies.openai_http import OpenAIContextLengthError, OpenAIServerError

MODEL = "tiny-test"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
# The untrained tiny model's greedy output repeats one token; seeded sampling gives varied tokens, so equality
# with HFPolicy is a real check. A lone request is a batch of its own, so its seed reproduces the sample.
SAMPLED = SamplingParams(max_tokens=12, temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config)


@pytest.fixture(scope="module")
def hf_policy(model_dir: Any) -> Any:
    from agentgym.policies.hf import HFPolicy

    return HFPolicy.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def server(hf_policy: Any) -> Any:
    from agentgym.serving.openai_server import ServerThread

    with ServerThread(hf_policy, model_name=MODEL, max_batch_size=32, batch_window_s=0.02) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: Any) -> Any:
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        yield client


def _prompt_ids(tokenizer: Any, text: str = "What is 12 + 30?") -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- server -----------------------------------------------------------------------------------------


def test_models_and_health(http: Any) -> None:
    body = http.get("/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == 2048
    health = httpx.get(str(http.base_url).removesuffix("/v1/") + "/health").json()
    assert health["status"] == "ok" and "generate_calls" in health


def test_completions_token_ids_match_hf_policy(http: Any, hf_policy: Any) -> None:
    prompt = _prompt_ids(hf_policy.tokenizer)
    (expected,) = hf_policy.generate([prompt], GREEDY)
    resp = http.post("/completions", json={
        "model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1,
        "return_token_ids": True,
    })
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL and body["id"].startswith("cmpl-")
    assert isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["token_ids"] == list(expected.token_ids)
    assert choice["prompt_token_ids"] == prompt
    assert choice["text"] == expected.text
    assert choice["finish_reason"] == expected.finish_reason
    lp = choice["logprobs"]
    # logprobs: 1 lists the best token per position, which under greedy decoding is the sampled one
    assert all(len(alts) == 1 for alts in lp["top_logprobs"])
    assert [v for alts in lp["top_logprobs"] for v in alts.values()] == pytest.approx(lp["token_logprobs"])
    assert [list(alts) for alts in lp["top_logprobs"]] == [[t] for t in lp["tokens"]]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(expected.token_ids)
    assert lp["token_logprobs"] == pytest.approx(list(expected.logprobs), abs=1e-4)
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(expected.token_ids),
                             "total_tokens": len(prompt) + len(expected.token_ids)}


def test_completions_seeded_sampling_matches_hf_policy(http: Any, hf_policy: Any) -> None:
    prompt = _prompt_ids(hf_policy.tokenizer, "Say something.")
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    (expected,) = hf_policy.generate([prompt], params)
    body = http.post("/completions", json={
        "prompt": prompt, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 7, "logprobs": 0,
        "return_token_ids": True, "return_tokens_as_token_ids": True,
    }).json()
    choice = body["choices"][0]
    assert choice["token_ids"] == list(expected.token_ids)
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(list(expected.logprobs), abs=1e-4)


def test_completions_string_and_batched_prompts(http: Any, hf_policy: Any) -> None:
    tok = hf_policy.tokenizer
    body = http.post("/completions", json={"model": MODEL, "prompt": "Hello world", "max_tokens": 5,
                                           "temperature": 0, "return_token_ids": True}).json()
    (choice,) = body["choices"]
    assert choice["prompt_token_ids"] == list(tok.encode("Hello world", add_special_tokens=True))
    assert choice["logprobs"] is None  # not asked for
    assert 1 <= len(choice["token_ids"]) <= 5
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])

    body = http.post("/completions", json={"prompt": ["Hello", "Goodbye"], "max_tokens": 3,
                                           "temperature": 0}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert "token_ids" not in body["choices"][0]  # only on request (return_token_ids)

    ids = [tok.encode("one", add_special_tokens=False), tok.encode("two three", add_special_tokens=False)]
    body = http.post("/completions", json={"prompt": ids, "max_tokens": 3, "temperature": 0}).json()
    assert len(body["choices"]) == 2
    assert body["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1])


def test_stop_strings(http: Any, hf_policy: Any) -> None:
    # The tiny model's greedy continuation of this prompt repeats "2"; "22" is hit on the second token.
    prompt = list(hf_policy.tokenizer.encode("Hello world, compute 2+2", add_special_tokens=False))
    (full,) = hf_policy.generate([prompt], SamplingParams(max_tokens=8, temperature=0))
    assert full.text.startswith("22"), full.text
    base = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stop": ["22", "zz"], "return_token_ids": True}
    dropped = http.post("/completions", json=base).json()["choices"][0]
    kept = http.post("/completions", json={**base, "include_stop_str_in_output": True}).json()["choices"][0]
    assert dropped["text"] == "" and kept["text"] == "22"  # OpenAI drops the stop string; vLLM's flag keeps it
    assert dropped["finish_reason"] == kept["finish_reason"] == "stop"
    assert dropped["stop_reason"] == "22"
    assert dropped["token_ids"] == kept["token_ids"] and len(kept["token_ids"]) < len(full.token_ids)


def test_top_logprobs_name_the_k_best_tokens_on_both_endpoints(http: Any, hf_policy: Any) -> None:
    """The alternatives are HFPolicy's own top-k (values and tokens), best first: completions adds the sampled
    token when it is outside the k (vLLM's convention), chat lists exactly k, and a client can rebuild
    Generation.top_logprobs from either."""
    prompt = _prompt_ids(hf_policy.tokenizer)
    (expected,) = hf_policy.generate([prompt], SamplingParams(max_tokens=8, temperature=0, top_logprobs=3))
    body = http.post("/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3,
                                           "return_tokens_as_token_ids": True}).json()
    top = body["choices"][0]["logprobs"]["top_logprobs"]
    assert len(top) == len(expected.token_ids)
    for alts, values, ids in zip(top, expected.top_logprobs, expected.top_token_ids):
        assert list(alts) == [f"token_id:{t}" for t in ids]
        assert list(alts.values()) == pytest.approx(list(values), abs=1e-4)
        assert list(alts.values()) == sorted(alts.values(), reverse=True)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    chat = http.post("/chat/completions", json={"messages": messages, "max_tokens": 6, "temperature": 0.8, "seed": 3,
                                                "logprobs": True, "top_logprobs": 2}).json()
    for entry in chat["choices"][0]["logprobs"]["content"]:
        alts = entry["top_logprobs"]
        assert len(alts) == 2 and alts[0]["logprob"] >= alts[1]["logprob"]
        assert all(a["bytes"] == list(a["token"].encode("utf-8")) for a in alts)
        assert entry["logprob"] <= alts[0]["logprob"] + 1e-6  # nothing beats the best


def test_chat_completions(http: Any, hf_policy: Any) -> None:
    tok = hf_policy.tokenizer
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}]
    resp = http.post("/chat/completions", json={
        "model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0, "logprobs": True,
        "top_logprobs": 0, "return_token_ids": True,
    })
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    flat = [messages[0], {"role": "user", "content": "What is \n2+2?"}]  # text parts joined as vLLM joins them
    rendered = tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    assert body["prompt_token_ids"] == list(tok.encode(rendered, add_special_tokens=False))
    choice = body["choices"][0]
    (expected,) = hf_policy.generate([body["prompt_token_ids"]], SamplingParams(max_tokens=10, temperature=0))
    assert choice["message"] == {"role": "assistant", "content": expected.text}
    assert choice["token_ids"] == list(expected.token_ids)
    content = choice["logprobs"]["content"]
    assert len(content) == len(expected.token_ids)
    for entry, lp in zip(content, expected.logprobs):
        assert entry["logprob"] == pytest.approx(lp, abs=1e-4)
        assert entry["bytes"] == list(entry["token"].encode("utf-8")) and entry["top_logprobs"] == []
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])

    as_ids = http.post("/chat/completions", json={"messages": messages, "max_tokens": 3, "temperature": 0,
                                                  "logprobs": True, "return_tokens_as_token_ids": True}).json()
    assert all(e["token"].startswith("token_id:") for e in as_ids["choices"][0]["logprobs"]["content"])
    assert "prompt_token_ids" not in as_ids


@pytest.mark.parametrize(
    ("path", "body", "param", "status"),
    [
        ("/completions", {"prompt": [1, 2], "max_tokens": -1}, "max_tokens", 400),
        ("/completions", {"prompt": [1, 2], "max_tokens": 0}, "max_tokens", 400),
        ("/completions", {"prompt": [1, 2], "temperature": -0.5}, "temperature", 400),
        ("/completions", {"prompt": [1, 2], "top_p": 0}, "top_p", 400),
        ("/completions", {"prompt": ""}, "prompt", 400),
        ("/completions", {"prompt": []}, "prompt", 400),
        ("/completions", {"prompt": [1, 10**9]}, "prompt", 400),
        ("/completions", {"prompt": 5}, "prompt", 400),
        ("/completions", {"prompt": [1, 2], "n": 0}, "n", 400),
        ("/completions", {"prompt": [1, 2], "stream": "yes"}, "stream", 400),
        ("/completions", {"prompt": [1, 2], "stream_options": {"include_usage": True}}, "stream_options", 400),
        ("/completions", {"prompt": [1, 2], "top_k": -2}, "top_k", 400),
        ("/completions", {"prompt": [1, 2], "min_p": 1.5}, "min_p", 400),
        ("/completions", {"prompt": [1, 2], "repetition_penalty": 0}, "repetition_penalty", 400),
        ("/completions", {"prompt": [1, 2], "min_tokens": 3, "max_tokens": 2}, "min_tokens", 400),
        ("/completions", {"prompt": [1, 2], "presence_penalty": 2.5}, "presence_penalty", 400),
        ("/completions", {"prompt": [1, 2], "logit_bias": {"x": 1}}, "logit_bias", 400),
        ("/completions", {"prompt": [1, 2], "logit_bias": {"3": 101}}, "logit_bias", 400),
        ("/completions", {"prompt": [1, 2], "stop_token_ids": ["x"]}, "stop_token_ids", 400),
        ("/completions", {"prompt": [1, 2], "best_of": 3}, "best_of", 400),
        ("/completions", {"prompt": [1, 2], "max_token": 5}, "max_token", 400),
        ("/completions", {"prompt": [1, 2], "stop": [""]}, "stop", 400),
        ("/completions", {"prompt": [1, 2], "logprobs": 99}, "logprobs", 400),
        ("/completions", {"prompt": [1, 2], "max_tokens": 5000}, "max_tokens", 400),
        ("/completions", {"prompt": [1, 2], "model": "gpt-4"}, "model", 404),
        ("/chat/completions", {"messages": []}, "messages", 400),
        ("/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", 400),
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs", 400),
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature", 400),
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"},
         "tool_choice", 400),
        ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "store": "yes"}, "store", 400),
    ],
)
def test_validation_errors_use_openai_shape(http: Any, path: str, body: dict[str, Any], param: str, status: int) -> None:
    resp = http.post(path, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_error_messages_help(http: Any) -> None:
    error = http.post("/completions", json={"prompt": [1], "max_token": 5}).json()["error"]
    assert "Did you mean 'max_tokens'" in error["message"]
    error = http.post("/completions", json={"prompt": [1], "model": "tiny-tset"}).json()["error"]
    assert error["code"] == "model_not_found" and MODEL in error["message"]
    resp = http.post("/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    resp = http.get("/nowhere")
    assert resp.status_code == 404 and "error" in resp.json()


def test_run_server_and_serve_in_background_check_the_directory(tmp_path: Any, model_dir: Any) -> None:
    from agentgym.serving.openai_server import run_server, serve_in_background

    with pytest.raises(ConfigError, match="does not exist"):
        run_server(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="config.json"):
        run_server(str(tmp_path))
    with serve_in_background(model_dir, model_name="from-dir") as base_url:
        assert httpx.get(base_url + "/models").json()["data"][0]["id"] == "from-dir"


# ---- OpenAIPolicy against the server ------------------------------------------------------------------


def test_concurrent_requests_are_batched(server: Any, hf_policy: Any) -> None:
    policy = OpenAIPolicy(server.base_url, MODEL, mode="completions", tokenizer=hf_policy.tokenizer)
    requests = [
        GenerationRequest(messages=(), prompt_token_ids=tuple(_prompt_ids(hf_policy.tokenizer, f"Task {i}")),
                          sampling=SamplingParams(max_tokens=8, temperature=1.0, seed=i))
        for i in range(16)
    ]
    stats = server.app.state.stats
    calls_before, requests_before = stats.generate_calls, stats.requests

    async def main() -> list[Any]:
        # 16 separate act() calls at once, as 16 episodes of the rollout engine would make them.
        results = await asyncio.gather(*(policy.act([r]) for r in requests))
        await policy.aclose()
        return [g for (g,) in results]

    gens = asyncio.run(main())
    assert len(gens) == 16
    assert all(g.token_ids and len(g.logprobs) == len(g.token_ids) for g in gens)
    assert stats.requests - requests_before == 16
    assert stats.generate_calls - calls_before < 16
    assert stats.max_batch_seen > 1


def test_chat_agent_with_completions_mode(server: Any, model_dir: Any, hf_policy: Any) -> None:
    policy = OpenAIPolicy(server.base_url, mode="completions", tokenizer=str(model_dir))  # model discovered
    agent = ChatAgent(policy.tokenizer)
    agent.start("You are a calculator.", "What is 2+2?")
    request = agent.request(SAMPLED)
    (gen,) = asyncio.run(policy.act([request]))
    assert policy.model == MODEL and policy.name == f"openai:{MODEL}"
    (expected,) = hf_policy.generate([list(request.prompt_token_ids)], SAMPLED)
    assert len(set(expected.token_ids)) > 1
    assert gen.token_ids == expected.token_ids
    assert gen.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert gen.text == expected.text and gen.finish_reason == expected.finish_reason
    agent.record_action(gen)
    agent.add_observation("Observation: 4")
    # A second asyncio.run makes a new event loop: the policy must open a fresh client for it.
    (gen2,) = asyncio.run(policy.act([agent.request(GREEDY)]))
    assert gen2.token_ids and gen2.logprobs is not None and len(gen2.logprobs) == len(gen2.token_ids)
    policy.close()


def test_chat_mode(server: Any, hf_policy: Any) -> None:
    prompt = _prompt_ids(hf_policy.tokenizer, "Hi")
    (free,) = hf_policy.generate([prompt], SAMPLED)
    stop = free.text[len(free.text) // 3:][:3]
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=3, stop=(stop,))
    (expected,) = hf_policy.generate([prompt], sampling)
    assert expected.text.endswith(stop) and expected.finish_reason == "stop"
    request = GenerationRequest(messages=({"role": "user", "content": "Hi"},), sampling=sampling)
    text_only = OpenAIPolicy(server.base_url, MODEL)  # any server: text only
    token_level = OpenAIPolicy(server.base_url, MODEL, tokenizer=hf_policy.tokenizer)
    (plain,) = asyncio.run(text_only.act([request]))
    (rich,) = asyncio.run(token_level.act([request]))
    # The server drops the stop string (OpenAI semantics); the policy puts it back from vLLM's stop_reason.
    assert plain.text == rich.text == expected.text
    assert plain.token_ids is None and plain.logprobs is None
    assert rich.token_ids == expected.token_ids
    assert rich.logprobs == pytest.approx(expected.logprobs, abs=1e-4)


def test_policy_top_logprobs_over_http_equal_the_in_process_ones(server: Any, hf_policy: Any) -> None:
    """ARPO's entropy through a server: OpenAIPolicy asks for the top-k alternatives and rebuilds exactly the
    Generation.top_logprobs HFPolicy gives in process (ids too in completions mode, where tokens come as ids)."""
    prompt = _prompt_ids(hf_policy.tokenizer, "Hi")
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=7, top_logprobs=3)
    (expected,) = hf_policy.generate([prompt], sampling)
    completions = OpenAIPolicy(server.base_url, MODEL, mode="completions", tokenizer=hf_policy.tokenizer)
    (gen,) = asyncio.run(completions.act([GenerationRequest(messages=(), prompt_token_ids=tuple(prompt),
                                                            sampling=sampling)]))
    assert gen.token_ids == expected.token_ids
    assert len(gen.top_logprobs) == len(expected.top_logprobs)
    for got, want in zip(gen.top_logprobs, expected.top_logprobs):
        assert got == pytest.approx(want, abs=1e-4)
    assert gen.top_token_ids == expected.top_token_ids
    chat = OpenAIPolicy(server.base_url, MODEL, tokenizer=hf_policy.tokenizer)
    (reply,) = asyncio.run(chat.act([GenerationRequest(messages=({"role": "user", "content": "Hi"},),
                                                       sampling=sampling)]))
    assert reply.top_logprobs is not None and len(reply.top_logprobs) == len(reply.token_ids)
    for values, own in zip(reply.top_logprobs, reply.logprobs):
        assert 3 <= len(values) <= 4 and list(values[:3]) == sorted(values[:3], reverse=True)
        assert own in values or own == pytest.approx(values[-1])
    with pytest.raises(OpenAIServerError, match="top-3 log-probs"):
        chat._alternatives(None, [], (), 3, 2, "/chat/completions")  # a server that ignores top_logprobs
    completions.close()
    chat.close()


def test_arpo_branching_measures_entropy_through_the_server(server: Any, hf_policy: Any) -> None:
    """Entropy-guided branching with an HTTP policy: every turn's segment entropy comes from the server's
    top-k alternatives (it used to stop with 'neither top-k log-probs nor entropies')."""
    from agentgym.rollout.branching import BranchingConfig, BranchingSampler
    from agentgym.rollout import EpisodeSpec, RolloutConfig
    from agentgym.registration.suites import load_suite

    policy = OpenAIPolicy(server.base_url, MODEL, mode="completions", tokenizer=hf_policy.tokenizer)
    tasks = load_suite("games-calc").split("train")[:2]
    specs = [EpisodeSpec("agentgym/Calculator-v0", task=t, seed=10 * k + g, group_id=f"g{k}")
             for k, t in enumerate(tasks) for g in range(2)]
    config = RolloutConfig(sampling=SamplingParams(max_tokens=12, seed=1), system_prompt="", max_context_tokens=400)
    trajectories = BranchingSampler(policy, config, BranchingConfig(budget=2, initial_rollouts=1)).run(specs)
    policy.close()
    assert len(trajectories) == 4 and all(t.error is None for t in trajectories)
    for t in trajectories:
        entropy = t.metadata["segment_entropy"]
        assert len(entropy) == len(t.turns) and all(isinstance(h, float) and 0.0 <= h <= 1.0 for h in entropy)


def test_generation_failure_is_a_retried_500(hf_policy: Any) -> None:
    from agentgym.serving.openai_server import ServerThread

    class Broken:
        tokenizer = hf_policy.tokenizer
        name = "broken"
        calls = 0

        def generate(self, prompts: Any, sampling: Any) -> Any:
            Broken.calls += 1
            raise RuntimeError("out of memory")

    with ServerThread(Broken(), model_name="broken") as srv:
        resp = httpx.post(srv.base_url + "/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error["type"] == "server_error" and "out of memory" in error["message"]
        policy = OpenAIPolicy(srv.base_url, mode="completions", tokenizer=hf_policy.tokenizer, max_retries=1,
                              backoff_s=0.01)
        request = GenerationRequest(messages=(), prompt_token_ids=(1, 2), sampling=SamplingParams(max_tokens=2))
        with pytest.raises(OpenAIServerError, match="after 2 attempt.*out of memory"):
            asyncio.run(policy.act([request]))
    assert Broken.calls == 3


def test_server_rejection_raises_with_message(server: Any) -> None:
    policy = OpenAIPolicy(server.base_url, "no-such-model", max_retries=3, backoff_s=0.01)
    request = GenerationRequest(messages=({"role": "user", "content": "Hi"},), sampling=SamplingParams(max_tokens=2))
    with pytest.raises(OpenAIServerError, match="404.*does not exist") as info:
        asyncio.run(policy.act([request]))
    assert isinstance(info.value, AgentGymError) and info.value.status_code == 404


# ---- OpenAIPolicy on its own ---------------------------------------------------------------------------


def test_an_episode_the_server_refuses_as_too_long_is_a_context_limit_not_an_error(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A chat-mode policy (no tokenizer) cannot count tokens, so the engine cannot stop a growing episode before
    the model's context is full; the server's refusal (HTTP 400 context_length_exceeded) ends it as a truncation
    with its turns kept, not an "error" that trainers drop."""
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy
    from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
    from agentgym.serving.openai_server import ServerThread

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128,
                             max_position_embeddings=1024)
    model = HFPolicy.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("short"), config=config))
    with ServerThread(model, model_name=MODEL) as srv:
        policy = OpenAIPolicy(srv.base_url, MODEL, max_retries=0)
        request = GenerationRequest(messages=({"role": "user", "content": "word " * 2000},))
        with pytest.raises(OpenAIContextLengthError, match="maximum context length is 1024") as info:
            asyncio.run(policy.act([request]))
        assert info.value.status_code == 400
        sampling = SamplingParams(max_tokens=16, temperature=1.0, seed=1)
        specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=s, env_kwargs={"max_turns": 40}) for s in range(3)]
        trajectories = RolloutEngine(policy, RolloutConfig(sampling=sampling, max_in_flight=3)).run(specs)
    for trajectory in trajectories:
        assert trajectory.end_reason == "context_limit" and trajectory.error is None, trajectory.error
        assert 1 <= len(trajectory.turns) < 40 and not trajectory.success


@pytest.mark.parametrize(("status", "body", "too_long"), [
    (400, {"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested 5000 "
                                "tokens (4900 in the messages, 100 in the completion).", "type": "BadRequestError",
                     "code": 400}}, True),  # vLLM
    (400, {"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}},
     True),  # OpenAI: the code says it whatever the words
    (400, {"error": {"message": "the request exceeds the available context size, try increasing it",
                     "type": "exceed_context_size_error", "code": 400}}, True),  # llama.cpp
    (422, {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` "
                    "tokens and 200 `max_new_tokens`"}, True),  # TGI
    (400, {"object": "error", "message": "Requested token count exceeds the model's maximum context length of 4096 "
                                         "tokens.", "code": 400}, True),  # LiteLLM-style proxies
    (400, {"error": {"message": "prompt is too long: 213462 tokens > 200000 maximum", "type": "invalid_request_error"}},
     True),  # Anthropic's OpenAI-compatible endpoint
    (422, {"error": "Input validation error: `max_new_tokens` must be <= 4096. Given: 5000", "error_type": "validation"},
     False),  # TGI: max_tokens too large for any prompt is a setting to fix, not a conversation that grew too long
    (400, {"error": {"message": "temperature must be non-negative", "type": "invalid_request_error", "code": None}},
     False),
    (401, {"error": {"message": "Invalid API key; the context length is irrelevant", "code": "invalid_api_key"}}, False),
])
def test_each_servers_context_length_refusal_is_recognised(monkeypatch: pytest.MonkeyPatch, status: int,
                                                          body: dict[str, Any], too_long: bool) -> None:
    import agentgym.policies.openai_http as module

    real = httpx.AsyncClient
    monkeypatch.setattr(module.httpx, "AsyncClient", lambda **kw: real(
        transport=httpx.MockTransport(lambda request: httpx.Response(status, json=body)), **kw))
    policy = OpenAIPolicy("http://fake", "m", max_retries=0)
    with pytest.raises(OpenAIServerError) as info:
        asyncio.run(policy.act([GenerationRequest(messages=({"role": "user", "content": "Hi"},))]))
    assert isinstance(info.value, OpenAIContextLengthError) is too_long
    assert info.value.status_code == status


def test_unreachable_server_fails_after_retries() -> None:
    port = _free_port()
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, backoff_s=0.01, timeout_s=5)
    request = GenerationRequest(messages=({"role": "user", "content": "Hi"},))
    start = time.monotonic()
    with pytest.raises(OpenAIServerError, match=r"failed after 3 attempt\(s\).*Connect") as info:
        asyncio.run(policy.act([request]))
    assert info.value.status_code is None
    assert time.monotonic() - start < 5


def test_retries_on_429_and_5xx_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentgym.policies.openai_http as module

    statuses = [429, 503, 200]
    seen: list[dict[str, Any]] = []

    def handler(request: Any) -> Any:
        seen.append(json.loads(request.content))
        status = statuses[len(seen) - 1]
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "busy", "type": "x", "param": None, "code": None}})
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                      "finish_reason": "length"}]})

    real = httpx.AsyncClient
    monkeypatch.setattr(module.httpx, "AsyncClient",
                        lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    policy = OpenAIPolicy("http://fake", "m", max_retries=3, backoff_s=0.001, extra_body={"top_k": 5})
    assert policy.base_url == "http://fake/v1"
    request = GenerationRequest(messages=({"role": "user", "content": "Hi"},),
                                sampling=SamplingParams(max_tokens=3, stop=("x",), seed=1))
    (gen,) = asyncio.run(policy.act([request]))
    assert gen.text == "ok" and gen.finish_reason == "length" and gen.token_ids is None
    assert len(seen) == 3
    assert seen[0] == {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                       "temperature": 1.0, "top_p": 1.0, "stop": ["x"], "seed": 1, "top_k": 5}


def test_every_http_client_of_a_policy_shares_one_tls_context() -> None:
    """httpx loads the CA bundle into a fresh SSL context for each client it builds (40 ms each); a policy with
    128 requests in flight opens 16 clients per event loop, so each run (a trainer step) paid 0.6 s before its
    first request. One context, built once per policy, serves them all, in every loop."""

    async def contexts() -> list[Any]:
        state = await policy._state()
        return [client._transport._pool._ssl_context for client in state.clients]

    policy = OpenAIPolicy("https://127.0.0.1:9/v1", "m", max_concurrency=128)
    first, second = asyncio.run(contexts()), asyncio.run(contexts())
    assert len(first) == 16 and len({id(c) for c in first + second}) == 1
    assert first[0].verify_mode == ssl.CERT_REQUIRED  # still verifies certificates
    policy.close()


def test_idle_connections_are_dropped_before_a_uvicorn_server_drops_them() -> None:
    """uvicorn (vLLM, SGLang, ``agentgym serve``) closes a connection idle for 5 s. A client that kept it as long
    would now and then send a request just as the server closes it: a ReadError and a retry's backoff."""
    import uvicorn

    async def expiries() -> list[float | None]:
        state = await policy._state()
        return [client._transport._pool._keepalive_expiry for client in state.clients]

    server_idle_s = uvicorn.Config(app=None).timeout_keep_alive  # type: ignore[arg-type]
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "m", max_concurrency=32)
    assert all(e is not None and e < server_idle_s - 0.5 for e in asyncio.run(expiries()))
    policy.close()


def test_config_errors(model_dir: Any) -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        OpenAIPolicy("http://127.0.0.1:1/v1", mode="completions")
    with pytest.raises(ConfigError, match="http"):
        OpenAIPolicy("127.0.0.1:8000")
    with pytest.raises(ConfigError, match="mode"):
        OpenAIPolicy("http://x/v1", mode="stream")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="does not exist"):
        OpenAIPolicy("http://x/v1", mode="completions", tokenizer="/no/such/dir")
    with pytest.raises(ConfigError, match="max_retries"):
        OpenAIPolicy("http://x/v1", max_retries=-1)
    policy = make_policy("openai:http://127.0.0.1:9/v1#tiny")
    assert isinstance(policy, OpenAIPolicy) and policy.model == "tiny" and policy.mode == "chat"
    assert make_policy("openai:http://127.0.0.1:9/v1").model is None
