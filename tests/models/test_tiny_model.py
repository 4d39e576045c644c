"""The built-in tiny model: config checks, the byte/digit-level tokenizer, ChatML, build/save/load."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError
from agentgym.models import (
    TinyModelConfig,
    build_tiny_model,
    create_model,
    default_corpus,
    load_tiny_model,
    train_tokenizer,
)

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                        max_position_embeddings=512, vocab_size=384)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(default_corpus(), 512)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", config=SMALL)


# ---- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"architecture": "gpt2"}, "'llama' or 'qwen2'"),
        ({"hidden_size": 0}, "positive integer"),
        ({"hidden_size": 64, "num_heads": 5}, "divisible by num_heads"),
        ({"hidden_size": 12, "num_heads": 4, "num_kv_heads": 4}, "must be even"),
        ({"num_heads": 4, "num_kv_heads": 3}, "divisible by num_kv_heads"),
        ({"vocab_size": 100}, ">= 259"),
        ({"seed": -1}, "non-negative"),
    ],
)
def test_config_rejects_bad_values_with_a_fix(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        TinyModelConfig(**kwargs)


def test_config_defaults_are_valid():
    config = TinyModelConfig()
    assert (config.architecture, config.hidden_size, config.num_layers, config.vocab_size) == ("llama", 128, 4, 512)


# ---- tokenizer ---------------------------------------------------------------------------------------


def test_default_corpus_is_deterministic_ascii_and_covers_the_tasks():
    corpus = default_corpus()
    assert corpus == default_corpus()
    assert all(line.isascii() for line in corpus)
    joined = "\n".join(corpus)
    for needle in ("calc(", "answer(", "guess(", 'move("north")', "<tool_call>", "higher", "lower", "correct", "west"):
        assert needle in joined


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text())
def test_tokenizer_round_trips_any_unicode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    "text",
    ["", " ", "hé 😀 中文 \x00\x1f\x7f\t\r\n", "  leading and trailing  ", "a\u2063b", "emoji 👩‍👩‍👧 flags 🇫🇷",
     "<|im_end|> in text", "ｆｕｌｌｗｉｄｔｈ １２３"],
)
def test_tokenizer_round_trips_edge_cases(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_digits_are_single_tokens(tokenizer):
    for text in ("1234567890", "calc(27*42)", " 1134", "x=3.14159", "answer(1000000)"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = [tokenizer.decode([i]) for i in ids]
        digits = [p for p in pieces if any(c.isdigit() for c in p)]
        assert digits == [c for c in text if c.isdigit()], pieces
    # No merge ever joins a digit with anything: every vocabulary entry with a digit is that digit alone.
    for token_id in range(len(tokenizer)):
        piece = tokenizer.decode([token_id])
        if any(c in "0123456789" for c in piece):
            assert len(piece) == 1, piece


def test_special_tokens(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.bos_token is None
    assert tokenizer.encode("<|im_start|>user", add_special_tokens=False)[0] == 1
    assert tokenizer.decode([1, 2, 0], skip_special_tokens=True) == ""
    assert len(tokenizer) <= 512


def test_special_tokens_in_training_texts_get_no_merges():
    tok = train_tokenizer(["<|im_start|>user\nhi<|im_end|>\n"] * 200, 300)
    assert not [t for t in tok.get_vocab() if ("<|" in t or "|>" in t) and t not in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]


def test_train_tokenizer_rejects_tiny_vocab():
    with pytest.raises(ConfigError, match="vocab_size"):
        train_tokenizer(["abc"], 100)


def test_chat_template_renders_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "calc(2+2)"},
        {"role": "tool", "content": "4"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\ncalc(2+2)<|im_end|>\n"
        "<|im_start|>tool\n4<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=False)
    assert no_prompt.endswith("What is 2+2?<|im_end|>\n")
    with pytest.raises(Exception, match="Unknown chat role"):
        tokenizer.apply_chat_template([{"role": "wizard", "content": "x"}], tokenize=False)


def test_chat_agent_accepts_the_template(tokenizer):
    assert ChatAgent(tokenizer)._glue() == ("<|im_end|>\n", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    agent = ChatAgent(tokenizer, observation_role="tool")
    agent.start("Solve it.", "2+2?")
    assert tokenizer.decode(agent.token_ids) == (
        "<|im_start|>system\nSolve it.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


# ---- model -------------------------------------------------------------------------------------------


def test_build_save_reload_gives_identical_logits(built):
    assert (built / "config.json").is_file()
    model, tok = load_tiny_model(built)
    auto_model = transformers.AutoModelForCausalLM.from_pretrained(built).eval()
    auto_tok = transformers.AutoTokenizer.from_pretrained(built)
    assert isinstance(model, transformers.LlamaForCausalLM)
    # The in-memory model for the same tokenizer and config is the one that was saved.
    fresh = create_model(tok, SMALL)
    ids = torch.tensor([tok.encode("<|im_start|>user\ncalc(27*42)<|im_end|>\n")])
    assert auto_tok.encode("calc(27*42)") == tok.encode("calc(27*42)")
    with torch.inference_mode():
        logits = [m(ids).logits for m in (model, auto_model, fresh)]
    assert torch.equal(logits[0], logits[1])
    assert torch.equal(logits[0], logits[2])
    assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.config.pad_token_id == tok.pad_token_id == 0
    assert model.config.vocab_size == len(tok)
    assert model.config.max_position_embeddings == SMALL.max_position_embeddings == tok.model_max_length
    assert tok.chat_template is not None and tok.eos_token == "<|im_end|>"


def test_same_config_and_seed_give_identical_weights(tokenizer):
    first = create_model(tokenizer, SMALL).state_dict()
    second = create_model(tokenizer, SMALL).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = create_model(tokenizer, TinyModelConfig(**{**SMALL.__dict__, "seed": 1})).state_dict()
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_create_model_leaves_global_rng_alone(tokenizer):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    create_model(tokenizer, SMALL)
    assert torch.equal(torch.rand(3), expected)


def test_qwen2_architecture_and_extra_texts(tmp_path):
    config = TinyModelConfig(architecture="qwen2", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, vocab_size=300, tie_word_embeddings=False)
    path = build_tiny_model(tmp_path / "qwen", texts=["supercalifragilistic"] * 50, config=config)
    model, tok = load_tiny_model(path)
    assert isinstance(model, transformers.Qwen2ForCausalLM)
    assert model.config.tie_word_embeddings is False
    # The extra text was frequent enough to get merged tokens of its own.
    assert len(tok.encode("supercalifragilistic", add_special_tokens=False)) < len("supercalifragilistic")


def test_load_tiny_model_rejects_missing_directory(tmp_path):
    with pytest.raises(ConfigError, match="build_tiny_model"):
        load_tiny_model(tmp_path / "nope")
