"""Chunked log-probs (``lm_head`` over a few positions at a time) equal the full-logits ones, and stay small."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgym.errors import ConfigError
from agentgym.trainers.batch import TrainingBatch, right_padded, sequence_logprobs
from agentgym.trainers.logprobs import DEFAULT_CHUNK_SIZE
from agentgym.trainers.packing import pack_sequences, packed_inputs, packed_sequence_logprobs

VOCAB = 384
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=2)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False),
    "qwen2-tied": lambda: transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True),
    # Gemma 2 soft-caps its final logits (cap * tanh(logits / cap)); a small cap makes the capping matter.
    "gemma2-softcap": lambda: transformers.Gemma2Config(**SHAPE, head_dim=8, final_logit_softcapping=2.0),
}


def build(name: str, model_cls: type | None = None) -> torch.nn.Module:
    """Seeded from-config model whose matrices are re-drawn wide enough that every logit depends on the context."""
    config = CONFIGS[name]()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(config) if model_cls else transformers.AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    return model.float().eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return build(request.param)


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def padded_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids (pad id 2) and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    attention = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=g)
    return torch.where(attention.bool(), ids, torch.full_like(ids, 2)), attention


def logprobs_and_grads(model, fn, weights: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp = fn()
    (logp * weights).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def assert_same(full: tuple[torch.Tensor, list[torch.Tensor]], chunked: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    (lp_a, g_a), (lp_b, g_b) = full, chunked
    assert lp_a.shape == lp_b.shape
    assert float((lp_a - lp_b).abs().max()) <= 1e-5
    assert float(lp_a.abs().max()) > 1.0  # real log-probs, not zeros
    for a, b in zip(g_a, g_b):
        assert float(a.abs().max()) > 0.0
        assert float((a - b).abs().max()) <= 1e-5 * max(1.0, float(a.abs().max()))


@pytest.mark.parametrize("chunk_size", [1, 5, 16, DEFAULT_CHUNK_SIZE])
def test_chunked_equals_full_with_padding_and_temperature(model, chunk_size):
    ids, attention = padded_batch([23, 15, 6])  # 66 predicted positions: 5 and 16 do not divide it
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3)) * attention
    full = logprobs_and_grads(model, lambda: sequence_logprobs(model, ids, attention, 0.7, chunk_size=None), weights)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*chunked log-probs unavailable")  # the split must be taken, not the fallback
        chunked = logprobs_and_grads(model, lambda: sequence_logprobs(model, ids, attention, 0.7, chunk_size=chunk_size),
                                     weights)
    assert_same(full, chunked)
    assert torch.equal(chunked[0][:, 0], torch.zeros(3))


def test_chunked_equals_full_without_grad_and_for_one_token(model):
    ids, attention = padded_batch([12, 9], seed=4)
    with torch.no_grad():
        full = sequence_logprobs(model, ids, attention, chunk_size=None)
        chunked = sequence_logprobs(model, ids, attention, chunk_size=4)
    assert chunked.grad_fn is None and chunked.dtype == torch.float32
    assert float((full - chunked).abs().max()) <= 1e-5
    for chunk in (None, 4):  # one token: nothing to predict, position 0 gets 0
        one = sequence_logprobs(model, ids[:, :1], attention[:, :1], chunk_size=chunk)
        assert one.shape == (2, 1) and torch.equal(one, torch.zeros(2, 1))


def test_packed_chunked_equals_full(model):
    lengths = [20, 7, 13, 4, 30]
    ids, attention = padded_batch(lengths, seed=5)
    n, width = ids.shape
    loss_mask = attention.float()
    batch = TrainingBatch(ids, attention, loss_mask, torch.zeros(n), torch.zeros(n, width))
    inputs = packed_inputs(batch, pack_sequences(lengths, max_tokens=32))
    weights = torch.randn(inputs["input_ids"].shape, generator=torch.Generator().manual_seed(6))
    full = logprobs_and_grads(model, lambda: packed_sequence_logprobs(model, inputs, 1.3, chunk_size=None), weights)
    chunked = logprobs_and_grads(model, lambda: packed_sequence_logprobs(model, inputs, 1.3, chunk_size=9), weights)
    assert_same(full, chunked)
    assert torch.equal(chunked[0][inputs["position_ids"] == 0], torch.zeros(int((inputs["position_ids"] == 0).sum())))


def test_lora_model_is_chunked_with_its_adapters_on_and_off():
    """LoRA (q/v projections and lm_head): the split runs through the adapted modules; disabling them is seen too."""
    peft = pytest.importorskip("peft")
    base = build("llama")
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"],
                                                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"))
    with torch.no_grad():  # non-zero adapters, so that "on" and "off" differ
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    ids, attention = padded_batch([14, 9], seed=9)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(10)) * attention
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*chunked log-probs unavailable")
        full = logprobs_and_grads(model, lambda: sequence_logprobs(model, ids, attention, chunk_size=None), weights)
        chunked = logprobs_and_grads(model, lambda: sequence_logprobs(model, ids, attention, chunk_size=6), weights)
        with model.disable_adapter(), torch.no_grad():
            off_full = sequence_logprobs(model, ids, attention, chunk_size=None)
            off_chunked = sequence_logprobs(model, ids, attention, chunk_size=6)
    (lp_a, g_a), (lp_b, g_b) = full, chunked
    assert float((lp_a - lp_b).abs().max()) <= 1e-5
    trained = list(zip(g_a, g_b))
    assert len(trained) == 10 and all(float(a.abs().max()) > 0 for a, _ in trained)  # 2 layers x 2 + lm_head, A and B
    assert all(float((a - b).abs().max()) <= 1e-5 * max(1.0, float(a.abs().max())) for a, b in trained)
    assert float((off_full - off_chunked).abs().max()) <= 1e-5
    assert float((off_full - lp_a).abs().max()) > 1e-2  # the adapters matter, and "off" really was off


def test_at_most_chunk_size_positions_of_logits_exist_at_once():
    """Every tensor with a vocabulary-sized last dim, forward and backward, has at most chunk x V elements."""
    dispatch = pytest.importorskip("torch.utils._python_dispatch")

    class LargestLogits(dispatch.TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                # [hidden, V] is the lm_head weight transposed (a view, not logits): not counted.
                if isinstance(t, torch.Tensor) and t.shape[-1:] == (VOCAB,) and t.shape != (SHAPE["hidden_size"], VOCAB):
                    self.largest = max(self.largest, t.numel())
            return out

    model = build("llama").train()
    ids, attention = padded_batch([40, 40, 25], seed=7)
    sequence_logprobs(model, ids, attention, chunk_size=8)  # the one-off split check runs outside the count
    sizes = {}
    for chunk in (None, 8):
        with LargestLogits() as mode:
            sequence_logprobs(model, ids, attention, 0.9, chunk_size=chunk).sum().backward()
        sizes[chunk] = mode.largest
    assert sizes[None] >= 3 * 39 * VOCAB
    assert 0 < sizes[8] <= 8 * VOCAB


def _scaled_llama() -> type:
    """A model class whose forward does something to its logits that the splitter does not know about (built in
    the test: subclassing at import would import the Llama modelling code in every xdist worker that collects)."""

    class ScaledLlama(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3.0
            return out

    return ScaledLlama


def test_unknown_logit_transform_falls_back_to_full_logits_with_a_warning():
    model = build("llama", _scaled_llama())
    ids, attention = padded_batch([10, 6], seed=8)
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match="chunked log-probs unavailable"):
            chunked = sequence_logprobs(model, ids, attention, chunk_size=4)
        full = sequence_logprobs(model, ids, attention, chunk_size=None)
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
    assert float((chunked - full).abs().max()) <= 1e-6
    want = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert float((chunked[0, 1:] - want).abs().max()) <= 1e-5  # the scaled model's own values


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "512"])
def test_bad_chunk_size_is_a_config_error(bad, llama):
    model = llama
    ids, attention = padded_batch([5])
    with pytest.raises(ConfigError, match="chunk_size must be a positive integer"):
        sequence_logprobs(model, ids, attention, chunk_size=bad)
    batch = TrainingBatch(ids, attention, attention.float(), torch.zeros(1), torch.zeros(ids.shape))
    inputs = packed_inputs(batch, [[0]])
    with pytest.raises(ConfigError, match="or None for the unchunked"):
        packed_sequence_logprobs(model, inputs, chunk_size=bad)


def test_right_padding_is_detected_and_nothing_else_is():
    rows = torch.tensor
    assert right_padded(rows([[1, 1, 0], [1, 1, 1], [0, 0, 0]]))
    assert not right_padded(rows([[0, 1, 1]]))  # left padding: positions and attention need the mask
    assert not right_padded(rows([[1, 0, 1]]))  # a token after a pad
    assert right_padded(rows([[True, False]])) and right_padded(rows([[1]]))
    assert not right_padded(torch.ones(1, 1, 3, 3))  # a packed 4-D mask is never dropped


@pytest.mark.parametrize("padding", ["right", "left"])
def test_padded_rows_score_as_each_row_alone(model, padding, monkeypatch):
    """Right-padded rows reach attention with no mask at all, so SDPA runs its causal kernel (causal attention
    hides the later padding); left-padded ones keep their mask. Either way each real token's log-prob and gradient
    are the unpadded row's, and a padded position scores 0."""
    import transformers.integrations.sdpa_attention as sdpa

    lengths = [23, 15, 6]
    ids, attention = padded_batch(lengths, seed=7)
    if padding == "left":
        ids, attention = torch.stack([r.roll(int(w - n)) for r, n, w in zip(ids, lengths, [23] * 3)]), \
            torch.stack([a.roll(int(23 - n)) for a, n in zip(attention, lengths)])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(8)) * attention
    kernel, calls = sdpa.torch.nn.functional.scaled_dot_product_attention, []

    def spy(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[0], attn_mask is None and bool(kwargs.get("is_causal"))))
        return kernel(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(sdpa.torch.nn.functional, "scaled_dot_product_attention", spy)
    batched = logprobs_and_grads(model, lambda: sequence_logprobs(model, ids, attention, 0.9), weights)
    monkeypatch.undo()
    causal = [plain for rows, plain in calls if rows == len(lengths)]  # the batch's calls, not a probe's
    if model.config._attn_implementation == "sdpa":
        assert causal and all(causal) == (padding == "right"), calls
    assert torch.equal(batched[0][attention == 0], torch.zeros(int((attention == 0).sum())))
    alone_logp = torch.zeros(ids.shape)
    model.zero_grad(set_to_none=True)
    for i, n in enumerate(lengths):
        cols = attention[i].nonzero().squeeze(1)
        row = sequence_logprobs(model, ids[i:i + 1, cols], torch.ones(1, n, dtype=torch.long), 0.9)
        (row * weights[i:i + 1, cols]).sum().backward()
        alone_logp[i, cols] = row.detach()[0]
    alone = (alone_logp, [p.grad.clone() for p in model.parameters() if p.requires_grad])
    assert_same(alone, batched)
