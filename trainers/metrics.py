"""Training metrics: one JSON line per record, TensorBoard events, and a learning-curve PNG."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "plot_learning_curve", "read_metrics"]

logger = logging.getLogger(__name__)


class MetricsLogger:
    """Append metrics to ``metrics.jsonl`` (always) and TensorBoard (when available and enabled)."""

    def __init__(self, output_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = output_dir / "metrics.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(output_dir / "tensorboard"))
            except ImportError:
                logger.warning("tensorboard is not installed; metrics go to metrics.jsonl only")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_learning_curve(metrics_path: Path, out_path: Path) -> Path | None:
    """Plot train success and held-out success against the step; returns the PNG path."""
    records = read_metrics(metrics_path)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["train/success_rate"]) for r in records if "train/success_rate" in r]
    held_out = [(r["step"], r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    if train:
        ax.plot(*zip(*train), label="train rollouts (sampled)", alpha=0.6)
    if held_out:
        ax.plot(*zip(*held_out), marker="o", label="held-out eval")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
