"""Vision-language architectures beyond LLaVA through HFPolicy and the trainers' scoring, each built from a config
(nothing downloaded): Qwen2-VL and Qwen2.5-VL (3-D multimodal rotary positions, M-RoPE) and Idefics3/SmolVLM (1-D
positions, an image as a run of tokens between marker tokens, pixel-shuffled features).

Under M-RoPE an image's tokens sit on a (temporal, height, width) grid of rotary positions and the text after an
image continues from the grid's extent, not from the token count. For every architecture the sampler must use
exactly what the model's own forward computes, with KV-cache reuse across turns, padding and rows of different
lengths in one batch, and training must score the stored trajectories with the sampler's log-probs.
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
from agentgym.utils.images import ImageRef  # noqa: E402
from agentgym.models.tiny import default_corpus, train_tokenizer  # noqa: E402
from agentgym.policies.base import Generation, SamplingParams  # noqa: E402
from agentgym.models.geometry import rope_index_fn, rope_position_ids  # noqa: E402
from agentgym.models.vision import pixel_inputs  # noqa: E402
from agentgym.policies.hf import HFPolicy  # noqa: E402
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.storage import TrajectoryWriter, read_trajectories  # noqa: E402
from agentgym.trainers.batch import build_batch, sequence_logprobs, vision_inputs  # noqa: E402
from tests.policies.test_multimodal import PixelEnv  # noqa: E402

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


IDEFICS_TEMPLATE = TEMPLATE.replace("'<|vision_start|><|image_pad|><|vision_end|>'", "'<image>'")


def _qwen(name: str) -> HFPolicy:
    model_name, config_name, processor_name, vision = ARCHITECTURES[name]
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


def _idefics3() -> HFPolicy:
    """Idefics3 (SmolVLM's architecture): a SigLIP tower on 28x28 images, pixel shuffle by 2, so one image token
    between ``<fake_token_around_image><global-img>`` and ``<fake_token_around_image>``; Llama text model."""
    if not hasattr(transformers, "Idefics3ForConditionalGeneration"):
        pytest.skip("this transformers has no Idefics3")
    tokenizer = train_tokenizer(default_corpus(), 400)
    tokenizer.add_tokens(["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"],
                         special_tokens=True)
    tokenizer.chat_template = IDEFICS_TEMPLATE
    cls = getattr(transformers, "Idefics3ImageProcessorPil", None) or transformers.Idefics3ImageProcessor
    image_processor = cls(do_image_splitting=False, size={"longest_edge": 28}, max_image_size={"longest_edge": 28})
    processor = transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                               chat_template=IDEFICS_TEMPLATE, image_seq_len=1)
    config = transformers.Idefics3Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 28, "patch_size": 14},
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
                     "max_position_embeddings": 4096, "tie_word_embeddings": True},
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.Idefics3ForConditionalGeneration(config).float().eval()
    return HFPolicy(model, tokenizer, processor=processor, max_batch_size=8)


@pytest.fixture(scope="module", params=[*sorted(ARCHITECTURES), "idefics3"])
def vlm(request: pytest.FixtureRequest) -> HFPolicy:
    return _idefics3() if request.param == "idefics3" else _qwen(request.param)


def _own_forward_inputs(policy: HFPolicy, ids: Any, images: list[ImageRef]) -> dict[str, Any]:
    """What the model's own forward needs beside the ids to place the images: pixels, and for M-RoPE models the
    token types its ``get_rope_index`` reads (it then computes the positions itself)."""
    inputs = dict(pixel_inputs(policy.processor, images))
    if rope_index_fn(policy.model) is not None:
        inputs["mm_token_type_ids"] = (ids == policy.model.config.image_token_id).int()
    return inputs


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


def test_positions_are_the_models_own_three_dimensional_ones(vlm: HFPolicy) -> None:
    """Scoring positions equal what the model computes by itself, and differ from counting tokens."""
    if rope_index_fn(vlm.model) is None:
        pytest.skip("1-D positions: nothing beyond the mask to compute")
    agent = _conversation(vlm, [(56, 56), (28, 56)])
    ids = torch.tensor([agent.token_ids])
    mask = torch.ones_like(ids)
    vision = pixel_inputs(vlm.processor, agent.all_images())
    positions = rope_position_ids(vlm.model, ids, mask, vision)
    assert positions.shape == (3, 1, ids.shape[1])
    # A 56x56 screenshot is 2x2 merged patches: 4 image tokens spanning 2 rows and 2 columns of positions, so the
    # text after it starts 2 positions earlier than a token count says.
    assert int(positions.max()) + 1 < ids.shape[1]
    image_id = vlm.model.config.image_token_id
    with torch.no_grad():
        own = vlm.model(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == image_id).int(),
                         **vision).logits
        ours = vlm.model(input_ids=ids, attention_mask=mask, position_ids=positions, **vision).logits
        counted = vlm.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1), **vision).logits
    torch.testing.assert_close(ours, own)
    assert not torch.allclose(counted, own, atol=1e-4), "1-D positions would score another model"


def test_sampling_with_kv_reuse_and_padding_equals_recomputing(vlm: HFPolicy) -> None:
    agent = _conversation(vlm, [(56, 56), (28, 56), (56, 28)])
    prompt, images = list(agent.token_ids), agent.all_images()
    first_turn = prompt.index(vlm.tokenizer.convert_tokens_to_ids("<|im_end|>"), prompt.index(
        vlm.model.config.image_token_id)) + 1
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    short = _conversation(vlm, [(28, 28)], seed=40)  # another row: shorter, one small image, no cache
    vlm.generate([prompt[:first_turn]], sampling, episode_ids=["e"], images=[images[:1]])
    reused_before = vlm.kv_cache.stats["reused_tokens"]
    other_sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=8)
    cached, other = vlm.generate([prompt, list(short.token_ids)], [sampling, other_sampling], episode_ids=["e", ""],
                                  images=[images, short.all_images()])
    assert vlm.kv_cache.stats["reused_tokens"] > reused_before, "the second turn reused the first turn's cache"
    fresh = HFPolicy(vlm.model, vlm.tokenizer, processor=vlm.processor, kv_cache_episodes=0)
    alone = fresh.generate([prompt], sampling, images=[images])[0]
    other_alone = fresh.generate([list(short.token_ids)], other_sampling, images=[short.all_images()])[0]
    assert cached.token_ids == alone.token_ids and other.token_ids == other_alone.token_ids
    np.testing.assert_allclose(cached.logprobs, alone.logprobs, atol=1e-4)
    np.testing.assert_allclose(other.logprobs, other_alone.logprobs, atol=1e-4)
    # The sampled tokens' log-probs are the model's: scoring prompt + action with its own forward agrees.
    full = torch.tensor([prompt + list(alone.token_ids)])
    image_id = vlm.model.config.image_token_id
    with torch.no_grad():
        logits = vlm.model(input_ids=full, attention_mask=torch.ones_like(full),
                            **_own_forward_inputs(vlm, full, images)).logits
    logp = torch.log_softmax(logits[0, len(prompt) - 1:-1].float(), -1)
    scored = logp.gather(-1, torch.tensor(alone.token_ids)[:, None]).squeeze(-1)
    np.testing.assert_allclose(scored.numpy(), alone.logprobs, atol=1e-4)
    blind = fresh.generate([prompt], sampling, images=[[_image(90, s) for s in [(56, 56), (28, 56), (56, 28)]]])[0]
    assert blind.logprobs[0] != pytest.approx(alone.logprobs[0], abs=1e-6), "the pixels reach the model"


def test_rollouts_are_stored_and_scored_with_the_samplers_log_probs(vlm: HFPolicy, tmp_path: Path) -> None:
    """Engine rollouts (pipelined, several rows per batch, KV reuse) on an env with screenshots; the trainers'
    scoring of the stored trajectories reproduces the sampler's log-probs."""
    config = RolloutConfig(progress=False, sampling=SamplingParams(max_tokens=10, seed=3), max_in_flight=4)
    specs = [EpisodeSpec("agentgym-test/Screenshot-v0", seed=s, group_id=f"g{s // 2}", env_kwargs={"max_turns": 3})
             for s in range(4)]
    out = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(out) as writer:
        trajs = asyncio.run(RolloutEngine(vlm, config).arun(specs, writer=writer))
    assert all(t.error is None and t.has_tokens for t in trajs), [t.error for t in trajs]
    assert sum(len(t.turns) for t in trajs) > 4, "some episodes ran several turns (cached prefixes with images)"
    back = list(read_trajectories(out))
    image_id = vlm.model.config.image_token_id
    for t in back:
        view = t.token_view()
        assert all(view.loss_mask[i] == 0 for i, tok in enumerate(view.input_ids) if tok == image_id)
    batch = build_batch(back, torch.zeros(len(back)), [True] * len(back), pad_id=int(vlm.tokenizer.pad_token_id))
    with torch.no_grad():
        vision = vision_inputs(batch, vlm.processor)
        logp = sequence_logprobs(vlm.model, batch.input_ids, batch.attention_mask, vision=vision)
    mask = batch.loss_mask.bool()
    assert torch.allclose(logp[mask], batch.sampler_logprobs[mask], atol=2e-4), \
        float((logp[mask] - batch.sampler_logprobs[mask]).abs().max())
