"""Qwen2-VL style models (3-D multimodal rotary positions, M-RoPE) through HFPolicy and the trainers' scoring.

A from-config Qwen2-VL (nothing downloaded): its image tokens sit on a (temporal, height, width) grid of rotary
positions and the text after an image continues from the grid's extent, not from the token count. The sampler
must use exactly the positions the model's own forward computes, with KV-cache reuse across turns, padding and
rows of different lengths in one batch, and training must score the stored trajectories with the same positions.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")

from agentgym.agent import ChatAgent  # noqa: E402
from agentgym.images import ImageRef  # noqa: E402
from agentgym.models.tiny import default_corpus, train_tokenizer  # noqa: E402
from agentgym.policies.base import Generation, SamplingParams  # noqa: E402
from agentgym.policies.hf import HFPolicy, pixel_inputs, rope_position_ids  # noqa: E402
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.storage import TrajectoryWriter, read_trajectories  # noqa: E402
from agentgym.trainers.batch import build_batch, sequence_logprobs, vision_inputs  # noqa: E402
from tests.test_multimodal import PixelEnv  # noqa: E402

IMAGE_PAD, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
TEMPLATE = (
    r"{%- for message in messages -%}{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}"
    r"{%- if message['content'] is string -%}{{- message['content'] -}}{%- elif message['content'] -%}"
    r"{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    r"{%- elif part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}{%- endif -%}"
    r"{%- endfor -%}{%- endif -%}{{- '<|im_end|>\n' -}}{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


class ScreenshotEnv(PixelEnv):
    """PixelEnv with 56x56 screenshots: 4 image tokens on a 2x2 grid, so 3-D positions differ from counted ones."""

    def _begin_episode(self, task: Any) -> Any:  # type: ignore[override]
        obs = super()._begin_episode(task)
        return {"text": obs["text"], "image": np.kron(obs["image"][:14, :14], np.ones((4, 4, 1), dtype=np.uint8))}

    def step(self, action):  # type: ignore[no-untyped-def]
        obs, *rest = super().step(action)
        return ({"text": obs["text"], "image": np.kron(obs["image"][:14, :14], np.ones((4, 4, 1), dtype=np.uint8))},
                *rest)


if "agentgym-test/Screenshot-v0" not in gym.registry:
    gym.register(id="agentgym-test/Screenshot-v0", entry_point=ScreenshotEnv)


def _processor(tokenizer: Any, processor_cls: Any) -> Any:
    """A ``Qwen2VLProcessor`` over the tiny tokenizer, screenshots resized to at most 56x56 pixels (4x4 patches,
    2x2 after merging: up to 4 image tokens).

    transformers insists on a video processor, which needs torchvision; where torchvision is missing (this
    machine: no CPU build on PyPI) the processor is assembled with the same attributes, no video processor.
    """
    cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    image_processor = cls(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2, temporal_patch_size=2)
    try:
        return processor_cls(image_processor=image_processor, tokenizer=tokenizer, chat_template=TEMPLATE)
    except (AttributeError, ImportError, TypeError):
        processor = processor_cls.__new__(processor_cls)
        processor.chat_template, processor.image_processor, processor.tokenizer = TEMPLATE, image_processor, tokenizer
        processor.video_processor = None
        processor.image_token, processor.video_token = IMAGE_PAD, "<|video_pad|>"
        processor.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        processor.video_token_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
        return processor


#: (model class, config class, processor class, vision config): Qwen2-VL and Qwen2.5-VL, whose vision towers and
#: position layouts differ (Qwen2.5-VL: windowed attention, a time axis in seconds), at the smallest sizes
ARCHITECTURES = {
    "qwen2-vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLConfig", "Qwen2VLProcessor",
                 {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2}),
    "qwen2.5-vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", "Qwen2_5_VLProcessor",
                   {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                    "window_size": 56, "fullatt_block_indexes": [1]}),
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def qwen(request: pytest.FixtureRequest) -> HFPolicy:
    model_name, config_name, processor_name, vision = ARCHITECTURES[request.param]
    if not hasattr(transformers, model_name):
        pytest.skip(f"this transformers has no {model_name}")
    tokenizer = train_tokenizer(default_corpus(), 400)
    tokenizer.add_tokens([VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>"], special_tokens=True)
    tokenizer.chat_template = TEMPLATE
    config = getattr(transformers, config_name)(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 4, "intermediate_size": 128, "max_position_embeddings": 4096,
                     "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        vision_config={**vision, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_PAD),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids(VISION_START),
        vision_end_token_id=tokenizer.convert_tokens_to_ids(VISION_END), tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, model_name)(config).float().eval()
    processor = _processor(tokenizer, getattr(transformers, processor_name))
    return HFPolicy(model, tokenizer, processor=processor, max_batch_size=8)


def _image(seed: int, shape: tuple[int, int]) -> ImageRef:
    return ImageRef.from_array(np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8))


def _gen(tokenizer: Any, text: str) -> Generation:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    return Generation(text=text, token_ids=ids, logprobs=(0.0,) * len(ids))


def _conversation(policy: HFPolicy, sizes: list[tuple[int, int]], seed: int = 0) -> ChatAgent:
    agent = ChatAgent(policy.tokenizer, images=True, processor=policy.processor)
    agent.start("Act.", "look at the page", images=[_image(seed, sizes[0])])
    for turn, size in enumerate(sizes[1:], start=1):
        agent.record_action(_gen(policy.tokenizer, f"click({turn}, {turn})"))
        agent.add_observation(f"clicked {turn}", images=[_image(seed + turn, size)])
    return agent


def test_positions_are_the_models_own_three_dimensional_ones(qwen: HFPolicy) -> None:
    """Scoring positions equal what the model computes by itself, and differ from counting tokens."""
    agent = _conversation(qwen, [(56, 56), (28, 56)])
    ids = torch.tensor([agent.token_ids])
    mask = torch.ones_like(ids)
    vision = pixel_inputs(qwen.processor, agent.all_images())
    positions = rope_position_ids(qwen.model, ids, mask, vision)
    assert positions.shape == (3, 1, ids.shape[1])
    # A 56x56 screenshot is 2x2 merged patches: 4 image tokens spanning 2 rows and 2 columns of positions, so the
    # text after it starts 2 positions earlier than a token count says.
    assert int(positions.max()) + 1 < ids.shape[1]
    image_id = qwen.model.config.image_token_id
    with torch.no_grad():
        own = qwen.model(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == image_id).int(),
                         **vision).logits
        ours = qwen.model(input_ids=ids, attention_mask=mask, position_ids=positions, **vision).logits
        counted = qwen.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1), **vision).logits
    torch.testing.assert_close(ours, own)
    assert not torch.allclose(counted, own, atol=1e-4), "1-D positions would score another model"


def test_sampling_with_kv_reuse_and_padding_equals_recomputing(qwen: HFPolicy) -> None:
    agent = _conversation(qwen, [(56, 56), (28, 56), (56, 28)])
    prompt, images = list(agent.token_ids), agent.all_images()
    first_turn = prompt.index(qwen.tokenizer.convert_tokens_to_ids("<|im_end|>"), prompt.index(
        qwen.model.config.vision_end_token_id)) + 1
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    short = _conversation(qwen, [(28, 28)], seed=40)  # another row: shorter, one small image, no cache
    qwen.generate([prompt[:first_turn]], sampling, episode_ids=["e"], images=[images[:1]])
    reused_before = qwen.kv_cache.stats["reused_tokens"]
    other_sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=8)
    cached, other = qwen.generate([prompt, list(short.token_ids)], [sampling, other_sampling], episode_ids=["e", ""],
                                  images=[images, short.all_images()])
    assert qwen.kv_cache.stats["reused_tokens"] > reused_before, "the second turn reused the first turn's cache"
    fresh = HFPolicy(qwen.model, qwen.tokenizer, processor=qwen.processor, kv_cache_episodes=0)
    alone = fresh.generate([prompt], sampling, images=[images])[0]
    other_alone = fresh.generate([list(short.token_ids)], other_sampling, images=[short.all_images()])[0]
    assert cached.token_ids == alone.token_ids and other.token_ids == other_alone.token_ids
    np.testing.assert_allclose(cached.logprobs, alone.logprobs, atol=1e-4)
    np.testing.assert_allclose(other.logprobs, other_alone.logprobs, atol=1e-4)
    # The sampled tokens' log-probs are the model's: scoring prompt + action with its own forward agrees.
    full = torch.tensor([prompt + list(alone.token_ids)])
    image_id = qwen.model.config.image_token_id
    with torch.no_grad():
        logits = qwen.model(input_ids=full, attention_mask=torch.ones_like(full),
                            mm_token_type_ids=(full == image_id).int(), **pixel_inputs(qwen.processor, images)).logits
    logp = torch.log_softmax(logits[0, len(prompt) - 1:-1].float(), -1)
    scored = logp.gather(-1, torch.tensor(alone.token_ids)[:, None]).squeeze(-1)
    np.testing.assert_allclose(scored.numpy(), alone.logprobs, atol=1e-4)
    blind = fresh.generate([prompt], sampling, images=[[_image(90, s) for s in [(56, 56), (28, 56), (56, 28)]]])[0]
    assert blind.logprobs[0] != pytest.approx(alone.logprobs[0], abs=1e-6), "the pixels reach the model"


def test_rollouts_are_stored_and_scored_with_the_samplers_log_probs(qwen: HFPolicy, tmp_path: Path) -> None:
    """Engine rollouts (pipelined, several rows per batch, KV reuse) on an env with screenshots; the trainers'
    scoring of the stored trajectories reproduces the sampler's log-probs."""
    config = RolloutConfig(progress=False, sampling=SamplingParams(max_tokens=10, seed=3), max_in_flight=4)
    specs = [EpisodeSpec("agentgym-test/Screenshot-v0", seed=s, group_id=f"g{s // 2}", env_kwargs={"max_turns": 3})
             for s in range(4)]
    out = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(out) as writer:
        trajs = asyncio.run(RolloutEngine(qwen, config).arun(specs, writer=writer))
    assert all(t.error is None and t.has_tokens for t in trajs), [t.error for t in trajs]
    assert sum(len(t.turns) for t in trajs) > 4, "some episodes ran several turns (cached prefixes with images)"
    back = list(read_trajectories(out))
    image_id = qwen.model.config.image_token_id
    for t in back:
        view = t.token_view()
        assert all(view.loss_mask[i] == 0 for i, tok in enumerate(view.input_ids) if tok == image_id)
    batch = build_batch(back, torch.zeros(len(back)), [True] * len(back), pad_id=int(qwen.tokenizer.pad_token_id))
    with torch.no_grad():
        vision = vision_inputs(batch, qwen.processor)
        logp = sequence_logprobs(qwen.model, batch.input_ids, batch.attention_mask, vision=vision)
    mask = batch.loss_mask.bool()
    assert torch.allclose(logp[mask], batch.sampler_logprobs[mask], atol=2e-4), \
        float((logp[mask] - batch.sampler_logprobs[mask]).abs().max())
