"""metrics.jsonl after a resume: every step once, in order, and one evaluation before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trainers.metrics import MetricsLogger, read_metrics  # noqa: E402
from tests.trainers.test_grpo import model_dir, small_config  # noqa: E402, F401 - the shared tiny-model fixture


def _check_once_each(path: Path, steps: int) -> None:
    records = read_metrics(path)
    train = [r["step"] for r in records if "train/success_rate" in r]
    evals = [r["step"] for r in records if "eval/success_rate" in r]
    assert train == list(range(1, steps + 1)), train
    assert evals == [0, 2, steps], evals


def test_metrics_after_a_resume_hold_each_step_once(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "run"
    config = small_config(model_dir, out, steps=4, checkpoint_every=2, eval_every=2, keep_checkpoints=3)
    GrpoTrainer(config).train()
    metrics = out / "metrics.jsonl"
    _check_once_each(metrics, 4)

    # killed after step 3 was logged, before the final checkpoint: the run resumes from step 2
    (out / "checkpoints" / "latest").write_text("step-000002")
    GrpoTrainer(config).train()
    _check_once_each(metrics, 4)

    # the same config once more, after it finished: only the final evaluation runs again, and is logged once
    GrpoTrainer(config).train()
    _check_once_each(metrics, 4)

    # killed before its first checkpoint: everything runs again, the step-0 evaluation included, logged once
    for path in (out / "checkpoints").iterdir():
        path.unlink() if path.is_file() else None
    (out / "checkpoints" / "latest").unlink(missing_ok=True)
    GrpoTrainer(config).train()
    _check_once_each(metrics, 4)


def test_a_failed_metrics_append_is_cut_back_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    import resource
    import signal

    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"loss": 1.0})
    size = logger.path.stat().st_size
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, old[1]))  # the next record fits only in part: EFBIG
    try:
        with pytest.raises(OSError):
            logger.log(2, {"loss": 0.5, "note": "x" * 100})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, previous)
    assert logger.path.stat().st_size == size, "the part of the record that was written is cut back"
    logger.log(2, {"loss": 0.5})
    logger.close()
    assert [r["step"] for r in read_metrics(logger.path)] == [1, 2]
    with logger.path.open("ab") as fh:
        fh.write(b'{"step": 3, "lo')  # a crash mid-line in an older release
    assert [r["step"] for r in read_metrics(logger.path)] == [1, 2]
    assert json.loads(logger.path.read_bytes().splitlines()[0])["step"] == 1


def test_a_run_stopped_before_an_evaluation_step_evaluates_it_on_resume(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after step 2's update (checkpointed) but during its evaluation: the resumed run starts at step 2 and
    must still evaluate there, or the learning curve silently misses a point."""
    from agentgym.trainers.interrupt import TrainingInterrupted

    out = tmp_path / "run"
    config = small_config(model_dir, out, steps=4, checkpoint_every=0, eval_every=2, keep_checkpoints=3)
    evaluate = GrpoTrainer._evaluate

    def stop_at_step_2(self: GrpoTrainer, step: int) -> dict:
        if step == 2:
            raise KeyboardInterrupt
        return evaluate(self, step)

    monkeypatch.setattr(GrpoTrainer, "_evaluate", stop_at_step_2)
    with pytest.raises(TrainingInterrupted) as stopped:
        GrpoTrainer(config).train()
    assert stopped.value.step == 2
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "eval/success_rate" in r] == [0]
    monkeypatch.setattr(GrpoTrainer, "_evaluate", evaluate)

    GrpoTrainer(config).train()
    _check_once_each(out / "metrics.jsonl", 4)
    GrpoTrainer(config).train()  # the finished run again: nothing owed at step 2, logged once
    _check_once_each(out / "metrics.jsonl", 4)
