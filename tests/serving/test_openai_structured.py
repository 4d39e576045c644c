"""Structured output from `agentgym serve`, driven by the `openai` SDK: an untrained tiny model's replies parse and
validate against the requested schema every time (``.parse()`` with a pydantic model, ``json_schema``,
``json_object``, vLLM's ``guided_json``), and schemas outside the supported subset are a 400 that names the keyword."""

from __future__ import annotations

import json
import os
from typing import Any, Literal

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("fastapi")
pytest.importorskip("torch")
pytest.importorskip("transformers")

MODEL = "tiny-json"
MESSAGES = [{"role": "user", "content": "Describe a player as JSON."}]


class Item(pydantic.BaseModel):
    name: str
    count: int


class Player(pydantic.BaseModel):
    name: str
    level: int
    score: float
    active: bool
    role: Literal["tank", "healer", "dps"]
    tags: list[str]
    best: Item


SCHEMA = {"type": "object", "properties": {
    "answer": {"type": "integer"}, "unit": {"enum": ["m", "s", None]},
    "steps": {"type": "array", "items": {"type": "object", "properties": {"op": {"type": "string"}},
                                         "required": ["op"], "additionalProperties": False}},
    "note": {"type": "string", "description": "free text"}},
    "required": ["answer", "unit", "steps"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.policies.hf import HFPolicy
    from agentgym.serving.openai_server import ServerThread

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    policy = HFPolicy.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny"), config=config))
    with ServerThread(policy, model_name=MODEL, max_batch_size=8, batch_window_s=0.01) as srv, \
            openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120) as c:
        yield c


def test_sdk_parse_with_a_pydantic_model_always_validates(client: Any) -> None:
    for seed in range(4):
        reply = client.beta.chat.completions.parse(model=MODEL, messages=MESSAGES, response_format=Player,
                                                   max_tokens=140, temperature=1.0, seed=seed)
        choice = reply.choices[0]
        assert isinstance(choice.message.parsed, Player), choice.message.content
        assert choice.finish_reason == "stop"
        assert Player.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_schema_and_guided_json_validate_for_every_seed_and_choice(client: Any) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=64,
                                           temperature=1.0, seed=3, n=3)
    guided = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=1.0, seed=5,
                                            extra_body={"guided_json": json.dumps(SCHEMA)})
    text = client.completions.create(model=MODEL, prompt="JSON:", max_tokens=40, temperature=1.0, seed=7,
                                     extra_body={"guided_json": SCHEMA})
    outputs = [c.message.content for c in reply.choices] + [guided.choices[0].message.content, text.choices[0].text]
    for output in outputs:
        jsonschema.validate(json.loads(output), SCHEMA)
    assert len(set(outputs[:3])) > 1  # three independent samples, each valid
    # Greedy decoding of the same request is the same document (the constraint does not change what is chosen
    # among the allowed tokens).
    greedy = [client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=64,
                                             temperature=0).choices[0].message.content for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_json_object_mode_streams_one_object(client: Any) -> None:
    for seed in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40, seed=seed,
                                               response_format={"type": "json_object"})
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40, seed=1, stream=True,
                                                 response_format={"type": "json_object"}))
    assert isinstance(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), dict)


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "object", "properties": {"name": {"type": "string", "minLength": 3}}}, "minLength"),
    ({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}, "anyOf"),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"},
     "$ref"),
    ({"type": ["string", "null"]}, "type"),
])
def test_unsupported_schema_is_a_400_naming_the_keyword(client: Any, schema: Any, keyword: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=32)
    assert info.value.body["code"] == "unsupported_schema" and keyword in info.value.body["message"]
    assert info.value.body["param"] == "response_format"


def _fan_out(levels: int) -> dict[str, Any]:
    """Each definition holds the next one twice: 2**levels nodes if every $ref were expanded without a bound."""
    defs = {f"D{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/D{i + 1}"},
                                                      "b": {"$ref": f"#/$defs/D{i + 1}"}}} for i in range(levels)}
    defs[f"D{levels}"] = {"type": "integer"}
    return {"$defs": defs, "type": "object", "properties": {"root": {"$ref": "#/$defs/D0"}}}


@pytest.mark.parametrize(("schema", "limit"), [
    (_fan_out(30), "more than 2048 nodes"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}, "the limit is 32768"),
])
def test_a_schema_too_large_to_compile_is_a_quick_400(client: Any, schema: Any, limit: str) -> None:
    """A client's schema cannot make the server compile millions of automaton nodes (2**30 for the fan-out)."""
    import time

    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    start = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=32)
    assert info.value.body["code"] == "unsupported_schema" and limit in info.value.body["message"]
    assert time.monotonic() - start < 30


def test_bad_structured_requests_are_400s(client: Any) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=5)
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format={"type": "yaml"})
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt,
                                       extra_body={"guided_json": SCHEMA})
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=40,
                                       extra_body={"ignore_eos": True})


def test_json_constraint_walks_only_valid_documents() -> None:
    """The automaton with random choices among the allowed tokens (any model's preference): every walk ends in a
    complete valid document within its token budget, down to the smallest budget the schema admits."""
    import random

    from agentgym.policies.json_constraint import JsonConstraint, TokenVocabulary
    from tests.helpers.chat_families import FAMILIES, build_tokenizer

    tok = build_tokenizer(next(f for f in FAMILIES if f.name == "qwen2.5"))
    vocabulary = TokenVocabulary(tok)
    for schema in (SCHEMA, Player.model_json_schema(), None):
        constraint = JsonConstraint(schema, vocabulary)
        for seed in range(12):
            rng = random.Random(seed)
            budget = rng.choice([constraint.min_tokens, constraint.min_tokens + 2, constraint.min_tokens + 40])
            state, ids = constraint.start(budget), []
            while True:
                allowed, may_end = constraint.allowed(state)
                options = [int(t) for t in allowed] + ([-1] if may_end else [])
                assert options, tok.decode(ids)
                pick = -1 if may_end and rng.random() < 0.2 else rng.choice(options)
                if pick == -1:
                    break
                ids.append(pick)
                state = constraint.advance(state, pick)
            assert len(ids) + 1 <= budget
            document = json.loads(tok.decode(ids))
            if schema is None:
                assert isinstance(document, dict)
            else:
                jsonschema.validate(document, schema)
