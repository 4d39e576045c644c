"""Sequence packing: first-fit-decreasing bins, packed tensors, and equality with the padded layout."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.errors import ConfigError
from agentgym.models import TinyModelConfig, create_model, default_corpus, train_tokenizer
from agentgym.trainers import algorithms as alg
from agentgym.trainers.batch import TrainingBatch, sequence_logprobs
from agentgym.trainers.packing import pack_sequences, packed_inputs, packed_sequence_logprobs, unpack_logprobs

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                        max_position_embeddings=512, vocab_size=384)
LENGTHS = [5, 17, 40, 3, 33, 1, 60, 12, 0, 25]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(default_corpus(), SMALL.vocab_size)


def make_batch(lengths: list[int], vocab: int = 384, seed: int = 0) -> TrainingBatch:
    g = torch.Generator().manual_seed(seed)
    n, width = len(lengths), max(lengths)
    real = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(3, vocab, (n, width), generator=g) * real
    loss_mask = ((torch.rand(n, width, generator=g) < 0.4).long() * real).float()
    logps = -3 + 0.1 * torch.randn(n, width, generator=g) * loss_mask
    batch = TrainingBatch(ids, real, loss_mask, torch.randn(n, generator=g), logps * loss_mask)
    batch.old_logprobs = batch.sampler_logprobs.clone()
    return batch


# ---- pack_sequences --------------------------------------------------------------------------------


def test_first_fit_decreasing_places_every_sequence_once_within_budget():
    bins = pack_sequences(LENGTHS, 64)
    placed = sorted(i for b in bins for i in b)
    assert placed == [i for i, n in enumerate(LENGTHS) if n > 0]  # the empty sequence is left out
    assert all(sum(LENGTHS[i] for i in b) <= 64 for b in bins)
    assert bins[0][0] == 6  # longest first
    # FFD by hand: 60 3 1 | 40 17 5 | 33 25 | 12: 4 bins for 196 tokens, the minimum ceil(196 / 64).
    assert bins == [[6, 3, 5], [2, 1, 0], [4, 9], [7]]


def test_pack_sequences_rejects_bad_input():
    with pytest.raises(ConfigError, match="more than max_tokens"):
        pack_sequences([10, 70], 64)
    with pytest.raises(ConfigError, match="positive integer"):
        pack_sequences([1], 0)
    with pytest.raises(ConfigError, match="negative"):
        pack_sequences([-1], 8)
    assert pack_sequences([], 8) == []


# ---- packed_inputs / unpack ------------------------------------------------------------------------


def test_packed_inputs_layout():
    batch = make_batch([3, 2, 4])
    inputs = packed_inputs(batch, [[2, 1], [0]], width=8)
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 0], [0, 1, 2, 0, 0, 0, 0, 0]]
    assert inputs["seq_index"].tolist() == [[2, 2, 2, 2, 1, 1, -1, -1], [0, 0, 0, -1, -1, -1, -1, -1]]
    assert inputs["input_ids"][0, :4].tolist() == batch.input_ids[2, :4].tolist()
    assert torch.equal(inputs["advantages"][0, :6], torch.cat([batch.advantages[2, :4], batch.advantages[1, :2]]))
    mask = inputs["attention_mask"]
    assert mask.shape == (2, 1, 8, 8) and mask.dtype == torch.float32
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed[3] == [1, 1, 1, 1, 0, 0, 0, 0]  # last token of sequence 2: causal within its sequence
    assert allowed[5] == [0, 0, 0, 0, 1, 1, 0, 0]  # second token of sequence 1 does not see sequence 2
    assert allowed[7] == [0, 0, 0, 0, 0, 0, 0, 1]  # padding sees only itself, so no row is all -inf
    assert set(mask.unique().tolist()) == {0.0, float("-inf")}
    # Round trip of every per-token field through the packed layout.
    for name in ("loss_mask", "sampler_logprobs", "old_logprobs"):
        back = unpack_logprobs(inputs[name], inputs, num_sequences=3, width=4)
        assert torch.equal(back, getattr(batch, name)), name


def test_packed_inputs_rejects_bad_bins():
    batch = make_batch([3, 2, 4])
    with pytest.raises(ConfigError, match="more than one bin"):
        packed_inputs(batch, [[0, 1], [1]])
    with pytest.raises(ConfigError, match="has 3 sequences"):
        packed_inputs(batch, [[3]])
    with pytest.raises(ConfigError, match="more than width"):
        packed_inputs(batch, [[0, 2]], width=6)


# ---- equality with the padded layout on a real model -----------------------------------------------


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_loss_and_gradients_equal_padded(tokenizer, attention):
    model = create_model(tokenizer, SMALL)
    model.set_attn_implementation(attention)  # both pass a 4-D mask through to the kernel unchanged
    batch = make_batch(LENGTHS, vocab=model.config.vocab_size, seed=1)
    n, width = batch.input_ids.shape
    real = batch.attention_mask.bool()
    tokens, _ = alg.loss_denominators(batch.loss_mask)

    def loss_of(logp, old, adv, mask):
        per_token, _ = alg.clipped_policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.28, loss_mask=mask)
        return alg.aggregate_loss(per_token, mask, mode="token-mean", global_token_count=tokens)

    model.zero_grad()
    padded = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    padded_loss = loss_of(padded, batch.old_logprobs, batch.advantages, batch.loss_mask)
    padded_loss.backward()
    padded_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    bins = pack_sequences(batch.attention_mask.sum(1).tolist(), 64)
    unpacked = torch.zeros(n, width)
    packed_loss = 0.0
    for micro in (bins[:2], bins[2:]):  # two micro-batches, as a trainer would run them
        inputs = packed_inputs(batch, micro)
        logp = packed_sequence_logprobs(model, inputs)
        assert torch.isfinite(logp).all()
        loss = loss_of(logp, inputs["old_logprobs"], inputs["advantages"], inputs["loss_mask"])
        loss.backward()
        packed_loss += float(loss.detach())
        unpacked += unpack_logprobs(logp.detach(), inputs, n, width)

    assert (unpacked - padded.detach())[real].abs().max() < 1e-4
    assert unpacked[:, 0].abs().max() == 0  # the first token of every sequence has no log-prob
    assert abs(packed_loss - float(padded_loss.detach())) < 1e-5
    for p, g in zip(model.parameters(), padded_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_per_token_advantages_survive_packing_and_micro_batching():
    """Step-level methods (GiGPO, ARPO hard attribution) put different values on one row's tokens: packing and
    ``select`` must carry each token's own value, not a per-row scalar."""
    batch = make_batch([5, 3, 6])
    batch.advantages = torch.arange(18, dtype=torch.float32).reshape(3, 6)  # every token its own value
    inputs = packed_inputs(batch, pack_sequences([5, 3, 6], 8), width=8)
    for row in range(inputs["seq_index"].shape[0]):
        for col in range(8):
            i = int(inputs["seq_index"][row, col])
            if i >= 0:
                assert inputs["advantages"][row, col] == batch.advantages[i, int(inputs["position_ids"][row, col])]
    sub = batch.select(torch.tensor([1]))
    assert sub.advantages.tolist() == [[6.0, 7.0, 8.0]]
