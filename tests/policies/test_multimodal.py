"""GUI agents that see: image observations as content parts, stored by reference, sent to OpenAI servers, and
sampled and trained on with the tiny vision-language model (LLaVA architecture, built from a config offline)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from agentgym.agent import ChatAgent
from agentgym.errors import AgentGymError
from agentgym.utils.images import ImageRef, decode_png, encode_png, observation_parts
from agentgym.policies import ScriptedPolicy
from agentgym.policies.base import Generation, SamplingParams
from agentgym.cli.report import write_html_report
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.storage import TrajectoryWriter, read_trajectories
from agentgym.suite import Task
from tests.helpers.envs import EchoEnv

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
STOP = '<tool_call>{"name": "stop", "arguments": {}}</tool_call>'


def _pixels(seed: int, shape: tuple[int, int] = (21, 16)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


class PixelEnv(EchoEnv):
    """EchoEnv whose observations are ``{"text", "image"}``; the image depends on the task and the turn."""

    def _begin_episode(self, task: Task) -> Any:  # type: ignore[override]
        self._seen = 0
        return {"text": task.prompt, "image": _pixels(len(task.prompt))}

    def step(self, action):  # type: ignore[no-untyped-def]
        obs, reward, terminated, truncated, info = super().step(action)
        self._seen += 1
        return {"text": obs, "image": _pixels(100 + self._seen)}, reward, terminated, truncated, info


if "agentgym-test/Pixel-v0" not in gym.registry:
    gym.register(id="agentgym-test/Pixel-v0", entry_point=PixelEnv)


# ---- images and storage ------------------------------------------------------------------------------
def test_png_codec_round_trips_and_names_files_by_content(tmp_path: Path) -> None:
    for shape in ((7, 5, 3), (4, 9, 4), (6, 3)):
        pixels = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
        back = decode_png(encode_png(pixels))
        assert np.array_equal(back.reshape(pixels.shape), pixels)
    a, b = ImageRef.from_array(_pixels(0)), ImageRef.from_array(_pixels(0).copy())
    assert a == b and a.sha256 == hashlib.sha256(a.png_bytes()).hexdigest()
    assert a != ImageRef.from_array(_pixels(1))
    assert a.to_dict() == {"path": f"images/{a.sha256}.png", "sha256": a.sha256, "width": 16, "height": 21}
    uri = a.data_uri()
    assert uri.startswith("data:image/png;base64,")
    assert np.array_equal(decode_png(base64.b64decode(uri.split(",", 1)[1])), _pixels(0))
    # A PNG written by another encoder (Pillow uses all row filters) reads back too.
    from PIL import Image

    Image.fromarray(_pixels(3, (30, 40))).save(tmp_path / "pil.png", optimize=True)
    assert np.array_equal(decode_png((tmp_path / "pil.png").read_bytes()), _pixels(3, (30, 40)))
    with pytest.raises(AgentGymError, match="uint8"):
        ImageRef.from_array(np.zeros((4, 4, 3), dtype=np.float32))
    text, images = observation_parts({"text": "hello", "image": _pixels(0)})
    assert text == "hello" and images == (a,)
    assert observation_parts("plain") == ("plain", ())


def test_text_only_policy_sees_the_text_part_and_images_are_stored_by_reference(tmp_path: Path) -> None:
    policy = ScriptedPolicy([ECHO, STOP])
    seen: list[Any] = []
    act = policy.act

    async def recording_act(requests):  # type: ignore[no-untyped-def]
        seen.extend(r.messages for r in requests)
        return await act(requests)

    policy.act = recording_act  # type: ignore[method-assign]
    out = tmp_path / "run" / "trajectories.jsonl"
    with TrajectoryWriter(out) as writer:
        [traj] = RolloutEngine(policy, RolloutConfig(progress=False)).run(
            [EpisodeSpec("agentgym-test/Pixel-v0", seed=3)], writer=writer)
    # A text-only policy: every message is a plain string, exactly the text part.
    assert all(isinstance(m["content"], str) for messages in seen for m in messages)
    assert seen[0][-1]["content"] == traj.turns[0].observation
    # The trajectory still records each observation's image, and the final one.
    assert [len(t.images) for t in traj.turns] == [1, 1] and len(traj.final_images) == 1
    assert np.array_equal(traj.turns[1].images[0].array(), _pixels(101))
    line = out.read_text()
    assert "base64" not in line and len(line) < 4000, "images are never inlined in the JSONL"
    record = json.loads(line)
    refs = [t["images"][0] for t in record["turns"]] + record["metadata"]["final_images"]
    for ref in refs:
        file = out.parent / ref["path"]
        assert ref["path"].startswith("images/") and file.is_file()
        assert hashlib.sha256(file.read_bytes()).hexdigest() == ref["sha256"] == file.stem
    [back] = list(read_trajectories(out))
    assert back.turns[1].images == traj.turns[1].images
    assert np.array_equal(back.turns[1].images[0].array(), _pixels(101))
    assert np.array_equal(back.final_images[0].array(), traj.final_images[0].array())
    # The report shows them as <img> of the files beside it.
    report = write_html_report(out.parent / "report.html", summarize([back]), [back], "pixels")
    html = report.read_text()
    for ref in refs:
        assert f"<img src='{ref['path']}'" in html
    # A corrupted file is reported, not shown as something else.
    (out.parent / refs[0]["path"]).write_bytes(b"not a png")
    [again] = list(read_trajectories(out))
    with pytest.raises(AgentGymError, match="does not hash"):
        again.turns[0].images[0].array()


def test_text_turns_keep_their_exact_record() -> None:
    [traj] = RolloutEngine(ScriptedPolicy([ECHO, STOP]), RolloutConfig(progress=False)).run(
        [EpisodeSpec("agentgym-test/Echo-v0" if "agentgym-test/Echo-v0" in gym.registry else _echo_id(), seed=1)])
    record = traj.to_dict()
    assert all("images" not in t for t in record["turns"]) and "final_images" not in record["metadata"]


def _echo_id() -> str:
    gym.register(id="agentgym-test/Echo-v0", entry_point=EchoEnv)
    return "agentgym-test/Echo-v0"


def test_cli_view_lists_images_and_writes_an_html_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli import main

    out = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(out) as writer:
        RolloutEngine(ScriptedPolicy([ECHO, STOP]), RolloutConfig(progress=False)).run(
            [EpisodeSpec("agentgym-test/Pixel-v0", seed=3)], writer=writer)
    html = tmp_path / "elsewhere" / "view.html"
    assert main(["view", str(out), "--html", str(html)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("image ") >= 3 and "images/" in printed
    page = html.read_text()
    srcs = [s.split("'")[0] for s in page.split("<img src='")[1:]]
    assert len(srcs) == 3 and all((html.parent / s).is_file() for s in srcs), "images copied beside the report"


# ---- OpenAI chat mode --------------------------------------------------------------------------------
class _Recorder(http.server.BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        reply = STOP if len(type(self).bodies) > 1 else ECHO
        data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_openai_chat_policy_sends_images_as_data_uris() -> None:
    from agentgym.policies.openai import OpenAIPolicy

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.bodies = []
    try:
        policy = OpenAIPolicy(f"http://127.0.0.1:{server.server_port}/v1", model="vlm", max_retries=0)
        assert policy.accepts_images
        [traj] = RolloutEngine(policy, RolloutConfig(progress=False)).run([EpisodeSpec("agentgym-test/Pixel-v0", seed=3)])
        assert traj.end_reason == "answered", traj.error
        text_only = OpenAIPolicy(f"http://127.0.0.1:{server.server_port}/v1", model="vlm", images=False)
        assert not text_only.accepts_images
    finally:
        server.shutdown()
        server.server_close()
    first, second = _Recorder.bodies
    user = first["messages"][-1]
    assert user["content"][0] == {"type": "text", "text": traj.turns[0].observation}
    part = user["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    png = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
    assert hashlib.sha256(png).hexdigest() == traj.turns[0].images[0].sha256
    # The second request repeats the history: two images, each in its own observation message.
    urls = [p["image_url"]["url"] for m in second["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]
    assert len(urls) == 2 and urls[0] == part["image_url"]["url"]
    json.dumps(second)  # the wire body is plain JSON


# ---- the tiny VLM ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentgym.models import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="module")
def vlm(vlm_dir: Path) -> Any:
    from agentgym.policies.hf import HFPolicy

    return HFPolicy.from_pretrained(vlm_dir, max_batch_size=8)


def _gen(tokenizer: Any, text: str) -> Generation:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    return Generation(text=text, token_ids=ids, logprobs=(0.0,) * len(ids))


def test_vlm_chat_agent_expands_image_placeholders_token_exactly(vlm: Any) -> None:
    assert vlm.accepts_images and vlm.processor is not None
    image_id = vlm.tokenizer.convert_tokens_to_ids("<image>")
    per_image = (28 // 14) ** 2
    agent = ChatAgent(vlm.tokenizer, images=True, processor=vlm.processor)
    images = [ImageRef.from_array(_pixels(i)) for i in range(3)]
    agent.start("Act.", "task: click the red square", images=[images[0]])
    assert agent.messages[-1]["content"][1] == {"type": "image", "image": images[0]}
    assert agent.token_ids.count(image_id) == per_image
    for turn in (1, 2):
        agent.record_action(_gen(vlm.tokenizer, f"click({turn}, {turn})"))
        agent.add_observation(f"clicked {turn}", images=[images[turn]])
        assert agent.pending_prompt_ids.count(image_id) == per_image
    # The linear ids equal a fresh render of the whole conversation expanded by the processor: no fork.
    assert agent.template_forks == 0 and agent.token_ids.count(image_id) == 3 * per_image
    # A text observation in the same conversation stays a plain string.
    agent.record_action(_gen(vlm.tokenizer, "key(Enter)"))
    agent.add_observation("no screenshot this time")
    assert agent.messages[-1]["content"] == "no screenshot this time" and agent.template_forks == 0
    with pytest.raises(AgentGymError, match="processor"):
        ChatAgent(vlm.tokenizer, images=True)


def test_vlm_sampling_reuses_the_kv_cache_and_needs_the_pixels(vlm: Any) -> None:
    from agentgym.policies.hf import HFPolicy

    agent = ChatAgent(vlm.tokenizer, images=True, processor=vlm.processor)
    agent.start("Act.", "look", images=[ImageRef.from_array(_pixels(5))])
    agent.record_action(_gen(vlm.tokenizer, "click(3, 4)"))
    agent.add_observation("again", images=[ImageRef.from_array(_pixels(6))])
    prompt = list(agent.token_ids)
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    first = vlm.generate([prompt[:40]], sampling, episode_ids=["e"], images=[agent.all_images()[:1]])[0]
    assert first.token_ids
    cached = vlm.generate([prompt], sampling, episode_ids=["e"], images=[agent.all_images()])[0]
    assert vlm.kv_cache.stats["reused_tokens"] > 0
    fresh = HFPolicy(vlm.model, vlm.tokenizer, processor=vlm.processor, kv_cache_episodes=0)
    recomputed = fresh.generate([prompt], sampling, images=[agent.all_images()])[0]
    assert cached.token_ids == recomputed.token_ids
    np.testing.assert_allclose(cached.logprobs, recomputed.logprobs, atol=1e-4)
    # Other pixels give other log-probs: the images really reach the model.
    other = fresh.generate([prompt], sampling, images=[[ImageRef.from_array(_pixels(50))] * 2])[0]
    assert other.logprobs[0] != pytest.approx(recomputed.logprobs[0], abs=1e-6)
    with pytest.raises(AgentGymError, match="image tokens"):
        fresh.generate([prompt], sampling, images=[agent.all_images()[:1] * 3])


def test_vlm_rollout_records_images_by_reference_and_a_grpo_step_trains_on_them(vlm: Any, tmp_path: Path) -> None:
    import torch

    from agentgym.trainers import algorithms as alg
    from agentgym.trainers.batch import build_batch, sequence_logprobs, vision_inputs

    config = RolloutConfig(progress=False, sampling=SamplingParams(max_tokens=12, seed=3), deterministic=True)
    specs = [EpisodeSpec("agentgym-test/Pixel-v0", seed=s, group_id=f"g{s // 2}", env_kwargs={"max_turns": 2})
             for s in range(4)]
    out = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(out) as writer:
        trajs = RolloutEngine(vlm, config).run(specs, writer=writer)
    assert all(t.error is None and t.has_tokens for t in trajs), [t.error for t in trajs]
    assert all(len(t.turns) == 2 and all(len(turn.images) == 1 for turn in t.turns) for t in trajs)
    back = list(read_trajectories(out))  # in the order the episodes finished, which need not be the specs' order
    assert ({t.traj_id: t.token_view().input_ids for t in back}
            == {t.traj_id: t.token_view().input_ids for t in trajs})
    assert "base64" not in out.read_text() and (tmp_path / "images").is_dir()
    # Scores below are given by position: put the episodes back in seed order, or a finishing order that pairs the
    # two 1.0 scores in one group (seeds 0 and 1 are group g0) leaves every advantage 0 and nothing to train.
    back.sort(key=lambda t: t.seed)
    image_id = vlm.tokenizer.convert_tokens_to_ids("<image>")
    for t in back:
        view = t.token_view()
        image_positions = [i for i, tok in enumerate(view.input_ids) if tok == image_id]
        assert len(image_positions) == 4 * len(t.prompt_images)
        assert all(view.loss_mask[i] == 0 for i in image_positions), "image placeholder tokens are never trained"
        assert sum(view.loss_mask) == t.num_action_tokens

    # Scoring the stored trajectories (pixels from the PNG files) reproduces the sampler's log-probs exactly.
    batch = build_batch(back, torch.zeros(len(back)), [True] * len(back), pad_id=int(vlm.tokenizer.pad_token_id))
    assert batch.images is not None and [len(i) for i in batch.images] == [2] * 4
    model = vlm.model
    with torch.no_grad():
        vision = vision_inputs(batch, vlm.processor)
        logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, vision=vision)
        blind = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    mask = batch.loss_mask.bool()
    assert torch.allclose(logp[mask], batch.sampler_logprobs[mask], atol=2e-4)
    assert not torch.allclose(blind[mask], batch.sampler_logprobs[mask], atol=2e-4), "pixels change the scores"
    sub = batch.select(torch.tensor([1, 3]))
    assert sub.images == [batch.images[1], batch.images[3]]

    # One GRPO update (group advantages, clipped loss) on the VLM: finite loss, parameters move.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = alg.group_advantages(scores, [t.group_id for t in back])
    batch.advantages = adv[:, None].expand_as(batch.loss_mask).clone()
    batch.old_logprobs = logp
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    new = sequence_logprobs(model, batch.input_ids, batch.attention_mask, vision=vision_inputs(batch, vlm.processor))
    per_token, _ = alg.clipped_policy_loss(new, batch.old_logprobs, batch.advantages, loss_mask=batch.loss_mask)
    loss = alg.aggregate_loss(per_token, batch.loss_mask, mode="token-mean",
                              global_token_count=float(batch.loss_mask.sum()), global_seq_count=4.0)
    loss.backward()
    vision_grad = sum(float(p.grad.abs().sum()) for n, p in model.named_parameters()
                      if "vision" in n and p.grad is not None)
    optimizer.step()
    model.eval()
    assert torch.isfinite(loss)
    assert vision_grad > 0, "the loss reaches the vision tower through the image tokens"
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_serve_takes_image_parts_for_a_vlm_with_the_openai_client(vlm: Any) -> None:
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from agentgym.serving.openai_server import serve_in_background

    image = ImageRef.from_array(_pixels(7))
    agent = ChatAgent(vlm.tokenizer, images=True, processor=vlm.processor)
    agent.start("Act.", "what do you see?", images=[image])
    content = [{"type": "text", "text": "what do you see?"},
               {"type": "image_url", "image_url": {"url": image.data_uri()}}]
    with serve_in_background(vlm, model_name="tiny-vlm") as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="EMPTY")
        reply = client.chat.completions.create(
            model="tiny-vlm", messages=[{"role": "system", "content": "Act."}, {"role": "user", "content": content}],
            max_tokens=5, temperature=0, extra_body={"return_token_ids": True})
        choice = reply.choices[0]
        # The server expands the image exactly as the ChatAgent does, and samples what HFPolicy samples in-process.
        assert (reply.model_extra or {})["prompt_token_ids"] == agent.token_ids
        local = vlm.generate([agent.token_ids], SamplingParams(max_tokens=5, temperature=0), images=[[image]])[0]
        assert (choice.model_extra or {})["token_ids"] == list(local.token_ids)
        assert choice.message.content == local.text
        stream = client.chat.completions.create(
            model="tiny-vlm", messages=[{"role": "system", "content": "Act."}, {"role": "user", "content": content}],
            max_tokens=5, temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == local.text
        with pytest.raises(openai.BadRequestError, match="data:image"):
            client.chat.completions.create(model="tiny-vlm", max_tokens=2, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}])
    from agentgym.serving.openai_protocol import APIError, _message_text

    with pytest.raises(APIError, match="reads text only"):
        _message_text(content, 1, vision=False)


@pytest.mark.skipif(not __import__("tests.helpers.browsers", fromlist=["HAVE_BROWSER"]).HAVE_BROWSER,
                    reason="needs Chromium (apt-get install chromium) and playwright")
def test_a_miniwob_episode_with_the_tiny_vlm(vlm: Any, tmp_path: Path) -> None:
    if "agentgym/MiniWoB-v0" not in gym.registry:
        gym.register(id="agentgym/MiniWoB-v0", entry_point="agentgym.envs.gui.env:MiniWoBEnv")
    config = RolloutConfig(progress=False, sampling=SamplingParams(max_tokens=8, seed=0), step_timeout_s=60)
    spec = EpisodeSpec("agentgym/MiniWoB-v0", seed=0, env_kwargs={"task_id": "click-button", "max_turns": 2})
    out = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(out) as writer:
        [traj] = RolloutEngine(vlm, config).run([spec], writer=writer)
    assert traj.error is None and traj.has_tokens and len(traj.turns) == 2, traj.error
    image_id = vlm.tokenizer.convert_tokens_to_ids("<image>")
    for turn in traj.turns:
        [image] = turn.images
        assert (image.width, image.height) == (160, 210) and (tmp_path / image.path).is_file()
        assert turn.prompt_token_ids.count(image_id) == 4  # the screenshot, resized to 28x28: 2x2 patches
    [back] = list(read_trajectories(out))
    assert back.turns[0].images[0].array().shape == (210, 160, 3)
    assert "base64" not in out.read_text()


def test_grpo_trainer_update_on_vlm_trajectories(vlm_dir: Path, tmp_path: Path) -> None:
    """The trainer's own update path (load, sample, score with pixels, clipped update) on the tiny VLM."""
    import torch

    from agentgym.trainers.batch import build_batch
    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer

    config = GrpoConfig(model=str(vlm_dir), suite="games-calc", output_dir=str(tmp_path), steps=1, tasks_per_step=2,
                        group_size=2, eval_tasks=2, eval_every=0, checkpoint_every=1, system_prompt="",
                        max_tokens_per_turn=8, tensorboard=False, micro_batch_size=2, seed=0, packing=True)
    trainer = GrpoTrainer(config)
    trainer.model, trainer.tokenizer = trainer._load(vlm_dir)
    trainer.reference = None
    policy = trainer._generation_policy(vlm_dir)
    assert policy.accepts_images and type(trainer.model).__name__ == "LlavaForConditionalGeneration"
    rollout = RolloutConfig(progress=False, sampling=SamplingParams(max_tokens=8, seed=1), deterministic=True)
    specs = [EpisodeSpec("agentgym-test/Pixel-v0", seed=s, group_id=f"g{s // 2}", env_kwargs={"max_turns": 2})
             for s in range(4)]
    trajectories = RolloutEngine(policy, rollout).run(specs)
    assert all(t.has_tokens and t.prompt_images for t in trajectories)
    batch = build_batch(trajectories, torch.tensor([1.0, -1.0, -1.0, 1.0]), [True] * 4, pad_id=0)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    stats = trainer._update(batch, optimizer, trainer._schedule(optimizer), 0)
    assert torch.isfinite(torch.tensor(stats["train/loss"])) and stats["train/tokens"] > 0
    assert stats["train/logprob_mismatch"] < 1e-4, "scored with the sampler's pixels (packing falls back to padded)"
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    # What the trainer writes for a trained model or a checkpoint loads back as a VLM.
    from agentgym.policies.hf import HFPolicy

    saved = tmp_path / "saved"
    trainer.model.save_pretrained(saved)
    trainer.tokenizer.save_pretrained(saved)
    trainer._save_defaults(saved)
    assert HFPolicy.from_pretrained(saved).accepts_images
