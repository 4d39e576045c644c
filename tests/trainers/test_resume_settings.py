"""Resuming a training run only with the config it was made with: another config is refused with each changed
field and both ways out, before the run directory changes; ``force_resume`` records the change and trains on with
the new config (its learning rate too, not the restored scheduler's); a resume says the step it continues from."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trainers.metrics import read_metrics  # noqa: E402
from tests.trainers.test_grpo import model_dir, small_config  # noqa: E402, F401 - the shared tiny-model fixture


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_changed_config_is_refused_with_the_diff_before_anything_changes(model_dir: Path,  # noqa: F811
                                                                           tmp_path: Path) -> None:
    out = tmp_path / "run"
    GrpoTrainer(small_config(model_dir, out, steps=1, warmup_steps=0)).train()
    stored = json.loads((out / "config.json").read_text())
    assert stored["trainer"] == "grpo" and stored["group_size"] == 4 and stored["learning_rate"] == 3e-4
    before = _snapshot(out)

    changed = small_config(model_dir, out, steps=1, warmup_steps=0, group_size=2, learning_rate=1e-3)
    with pytest.raises(ConfigError) as refused:
        GrpoTrainer(changed).train()
    message = str(refused.value)
    assert "  group_size: 4 -> 2\n" in message and "  learning_rate: 0.0003 -> 0.001\n" in message
    assert "--force" in message and "new output directory" in message
    assert _snapshot(out) == before, "a refused resume must leave the run directory as it was"

    # fields about display and bookkeeping may change: the same run resumes
    GrpoTrainer(small_config(model_dir, out, steps=1, warmup_steps=0, progress=False, keep_checkpoints=3)).train()


def test_a_forced_resume_records_the_change_and_trains_with_the_new_config(model_dir: Path,  # noqa: F811
                                                                           tmp_path: Path) -> None:
    out = tmp_path / "run"
    GrpoTrainer(small_config(model_dir, out, steps=1, warmup_steps=0)).train()
    forced = small_config(model_dir, out, steps=2, warmup_steps=0, learning_rate=1e-3)
    GrpoTrainer(forced).train(force_resume=True)

    changes = [json.loads(line) for line in (out / "resume_changes.jsonl").read_text().splitlines()]
    assert len(changes) == 1 and changes[0]["settings_file"] == "config.json"
    assert {c["field"]: (c["old"], c["new"]) for c in changes[0]["changes"]} == {
        "steps": (1, 2), "learning_rate": (3e-4, 1e-3)}
    assert json.loads((out / "config.json").read_text())["learning_rate"] == 1e-3, "config.json describes the run now"
    lrs = {r["step"]: r["lr"] for r in read_metrics(out / "metrics.jsonl") if "lr" in r}
    assert lrs == {1: pytest.approx(3e-4), 2: pytest.approx(1e-3)}, "the restored scheduler kept the old rate"


def test_a_resume_says_the_step_it_continues_from(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                  caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "run"
    config = small_config(model_dir, out, steps=2, checkpoint_every=1)
    GrpoTrainer(config).train()
    (out / "checkpoints" / "latest").write_text("step-000001")  # killed after the first step's checkpoint
    with caplog.at_level(logging.INFO, logger="agentgym.trainers.loop"):
        GrpoTrainer(config).train()
    assert f"resuming {out} from step 1 of 2 (checkpoint step-000001" in caplog.text
    shown = [r.getMessage() for r in caplog.records
             if r.name == "agentgym.trainers.loop" and r.getMessage().startswith("step ")]
    assert shown == [line for line in shown if "{" not in line and "=" in line] and len(shown) == 2, shown
    assert shown[0].startswith("step 2/2  train/success_rate=0 ") and shown[1] == "step 2/2  eval/success_rate=0"


def _curve(run: Path) -> list[dict[str, object]]:
    """metrics.jsonl without its clocks: what two runs of the same computation must agree on."""
    return [{k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith(("_s", "_per_s"))}
            for r in read_metrics(run / "metrics.jsonl")]


def test_a_finished_run_given_more_steps_trains_on_as_if_started_with_them(model_dir: Path,  # noqa: F811
                                                                           tmp_path: Path) -> None:
    from tests.trainers.test_grpo import _params_digest

    from transformers import AutoModelForCausalLM

    settings = dict(warmup_steps=1, eval_every=2, checkpoint_every=2)
    GrpoTrainer(small_config(model_dir, tmp_path / "straight", steps=4, **settings)).train()
    out = tmp_path / "extended"
    GrpoTrainer(small_config(model_dir, out, steps=2, **settings)).train()
    summary = GrpoTrainer(small_config(model_dir, out, steps=4, **settings)).train()  # no --force: only steps grew

    assert _curve(out) == _curve(tmp_path / "straight"), "the step-2 evaluation and every later step as in one run"
    digest = [_params_digest(AutoModelForCausalLM.from_pretrained(run / "model")) for run in (out, tmp_path / "straight")]
    assert digest[0] == digest[1]
    assert summary["resumed_from"].endswith("step-000002") and summary["episodes"] == 4 * 2 * 4
    assert json.loads((out / "config.json").read_text())["steps"] == 4
    changes = [json.loads(line) for line in (out / "resume_changes.jsonl").read_text().splitlines()]
    assert [c["changes"] for c in changes] == [[{"field": "steps", "old": 2, "new": 4}]]

    with pytest.raises(ConfigError, match="steps: 3 is below the 4 steps .* set steps to at least 4"):
        GrpoTrainer(small_config(model_dir, out, steps=3, **settings)).train()
