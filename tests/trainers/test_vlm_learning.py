"""The tiny VLM's learning recipe on MiniWoB++ (benchmarks/vlm_miniwob.py), its mechanics in a few seconds:
set-of-marks demonstrations that carry their screenshots, BC that scores them with the pixels, one GRPO step."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browsers import needs_browser
from tests.helpers.scripts import load_script

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]


def _benchmark() -> Any:
    return load_script("benchmarks/vlm_miniwob.py")


@needs_browser
def test_bc_on_screenshot_demonstrations_then_a_grpo_step_with_the_tiny_vlm(tmp_path: Path) -> None:
    import torch

    from agentgym.errors import ConfigError
    from agentgym.models.loading import load_model, load_processor
    from agentgym.models.tiny_vlm import build_tiny_vlm
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations
    from agentgym.trainers.config import GrpoConfig, load_config
    from agentgym.trainers.grpo import GrpoTrainer

    bench = _benchmark()
    suite = load_suite(bench.SUITE)
    model_dir = build_tiny_vlm(tmp_path / "model")
    model, tokenizer = load_model(model_dir)
    processor = load_processor(model_dir)
    demos = collect_demonstrations(suite, "train", 3, tokenizer, system_prompt="", processor=processor,
                                   policy=bench.MarkReferencePolicy(tokenizer=tokenizer))
    assert len(demos) == 3 and all(d.outcome.get("success") for d in demos)
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    for demo in demos:
        # The solver's pixel click became a mark, and the prompt carries the screenshot as the VLM's image tokens.
        assert all(t.action.startswith("click_mark(") for t in demo.turns), [t.action for t in demo.turns]
        assert all(len(t.images) == 1 and t.prompt_token_ids.count(image_id) == 4 for t in demo.turns)
    # BC needs the pixels of these demonstrations: without the processor it says how to get them.
    with pytest.raises(ConfigError, match="processor"):
        behaviour_clone(model, tokenizer, demos, steps=1, learning_rate=1e-3, batch_size=3, seed=0, progress=False)
    losses: list[float] = []
    behaviour_clone(model, tokenizer, demos, steps=6, learning_rate=1e-2, batch_size=3, seed=0, progress=False,
                    processor=processor, log=lambda step, m: losses.append(m["bc/loss"]))
    assert len(losses) == 2 and losses[-1] < losses[0], losses  # logged at step 0 and at the last step
    vision = [p for n, p in model.named_parameters() if "vision" in n]
    fresh, _ = load_model(model_dir)
    fresh_vision = [p for n, p in fresh.named_parameters() if "vision" in n]
    assert any(not torch.equal(a, b) for a, b in zip(vision, fresh_vision)), "BC's loss reaches the vision tower"
    model.save_pretrained(tmp_path / "bc")
    tokenizer.save_pretrained(tmp_path / "bc")
    processor.save_pretrained(tmp_path / "bc")

    base = load_config(str(REPO / bench.CONFIG)).to_dict()
    config = GrpoConfig.from_dict({**base, "model": str(tmp_path / "bc"), "suite": bench.SUITE,
                                   "output_dir": str(tmp_path / "grpo"), "steps": 1, "tasks_per_step": 1,
                                   "group_size": 2, "eval_tasks": 1, "progress": False})
    summary = GrpoTrainer(config).train()
    assert summary["eval_before"]["episodes"] == summary["eval_after"]["episodes"] == 1
    import json

    [step] = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()
              if '"train/loss"' in line]
    assert math.isfinite(step["train/loss"]) and step["train/tokens"] > 0
    assert step["train/logprob_mismatch"] < 1e-3, "the update scores the rollouts with the sampler's pixels"
