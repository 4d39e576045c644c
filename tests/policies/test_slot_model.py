"""SlotModel's packed prefill: every row's logits equal one plain forward of its whole sequence, for rows of
different lengths in scattered slots, on a first turn and on a next turn over the cached columns, with attention
run one row at a time and as one padded call over the run of slots."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.models import TinyModelConfig
from agentgym.policies import slot_model
from agentgym.policies.slot_model import SlotModel
from tests.helpers.tiny_models import build_context_sensitive_tiny_model

CONFIG = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                         max_position_embeddings=512, vocab_size=400, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from agentgym.models import load_tiny_model

    path = build_context_sensitive_tiny_model(tmp_path_factory.mktemp("slots") / "tiny", CONFIG)
    return load_tiny_model(path)[0].eval()


def plain_logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def close(a, b):
    return torch.allclose(a.float(), b, atol=1e-4, rtol=1e-4)


@pytest.fixture(params=["per_row", "padded"])
def attention(request, monkeypatch):
    """Force one attention path: the per-row calls, or one padded call however much padding it takes."""
    if request.param == "per_row":
        monkeypatch.setattr(slot_model, "_PAD_WASTE", 0)
        monkeypatch.setattr(slot_model, "_ROW_CALL_PAIRS", 0)
        monkeypatch.setattr(slot_model, "_GPU_ROW_CALL_PAIRS", 0)
    else:
        monkeypatch.setattr(slot_model, "_PAD_WASTE", float("inf"))
    return request.param


def test_rows_of_different_lengths_in_scattered_slots_match_a_plain_forward(model, attention):
    generator = torch.Generator().manual_seed(0)
    net = SlotModel(model, slots=24)
    slots = [0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 20, 23]  # slots in runs with holes, and far apart
    # First turn: whole prompts of 33 to 60 tokens.
    prompts = {s: torch.randint(0, 400, (33 + (5 * k) % 28,), generator=generator).tolist()
               for k, s in enumerate(slots)}
    with torch.inference_mode():
        first = net.prefill(slots, [prompts[s] for s in slots], [0] * len(slots))
    for j, s in enumerate(slots):
        assert close(first[j], plain_logits(model, prompts[s])[-1]), s
    # Next turn: suffixes of 1 to 40 tokens over the cached prompts, the logits after chosen positions too.
    suffixes = {s: torch.randint(0, 400, (1 + (7 * k) % 40,), generator=generator).tolist()
                for k, s in enumerate(slots)}
    at = torch.tensor([[0, len(suffixes[s]) - 1] for s in slots])
    with torch.inference_mode():
        second = net.prefill(slots, [suffixes[s] for s in slots], [len(prompts[s]) for s in slots], at=at)
    for j, s in enumerate(slots):
        full = plain_logits(model, prompts[s] + suffixes[s])
        assert close(second[j, 0], full[len(prompts[s])]), s
        assert close(second[j, 1], full[-1]), s


def test_the_padded_call_is_taken_for_short_runs_over_dense_slots_only(model):
    """Forced runs of 2 tokens over a dense run of slots go padded; rows of 1 and 60 tokens over contexts of 10
    and 600 columns, or two slots far apart, go one row at a time (padding would compute twice the work or more)."""
    net = SlotModel(model, slots=64)
    assert net._padded_plan(list(range(32)), [2] * 32, [100 + k for k in range(32)]) is not None
    assert net._padded_plan(list(range(16)), [1, 60] * 8, [10, 600] * 8) is None
    assert net._padded_plan([0, 63], [30, 30], [100, 100]) is None


def test_on_a_gpu_observation_prefills_go_padded_where_a_cpu_takes_them_row_by_row(model):
    """Every slot feeding a 90-token observation over contexts of 100 to 600 columns: on a CPU the padding
    (about 1.6x the real pairs) costs more than 64 row calls; on a GPU, where a row call is a handful of kernel
    launches, one padded call wins. Far more pairs than a mask may take go row by row on either."""
    live = [(k, 90, 100 + (k * 37) % 500) for k in range(64)]
    assert not slot_model.padding_pays(live, on_gpu=False, heads=4)
    assert slot_model.padding_pays(live, on_gpu=True, heads=4)
    assert SlotModel(model, slots=64)._padded_plan(*zip(*[(s, n, c) for s, n, c in live])) is None  # a CPU model
    huge = [(k, 256, 4096) for k in range(256)]  # 256 rows x 256 tokens x 4352 columns: 285M pairs
    assert not slot_model.padding_pays(huge, on_gpu=True, heads=4)
    # the cap counts scores, a pair per head: a model of 28 heads pads 7x fewer pairs than the tiny model's 4
    mid = [(k, 64, 1024) for k in range(256)]  # 256 x 64 x 1088 = 17.8M pairs
    assert slot_model.padding_pays(mid, on_gpu=True, heads=4) and not slot_model.padding_pays(mid, on_gpu=True, heads=28)
