"""Training metrics: one JSON line per record, TensorBoard events, optional W&B / MLflow runs, a learning-curve PNG.

``metrics.jsonl`` is always written and is the record of truth; the trackers are mirrors for people who
follow runs in Weights & Biases or MLflow. Their packages are optional (``agentgym[tracking]``).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, DependencyNotInstalled
from agentgym.utils.durable import LineAppender, atomic_write_bytes, keep_first_lines

__all__ = ["TRACKERS", "MetricsLogger", "check_loggers", "plot_learning_curve", "read_metrics"]

logger = logging.getLogger(__name__)


TRACKERS = ("wandb", "mlflow")
"""Optional experiment trackers a trainer config may name in ``loggers`` (``pip install 'agentgym[tracking]'``)."""


class MetricsLogger:
    """Append metrics to ``metrics.jsonl`` (always), TensorBoard (when available and enabled) and the trackers named.

    Args:
        output_dir: The run's directory (``metrics.jsonl`` and ``tensorboard/`` go there).
        tensorboard: Also write TensorBoard event files.
        loggers: Experiment trackers, any of :data:`TRACKERS`: ``wandb`` (Weights & Biases: set ``WANDB_MODE=offline``
            to log without an account) and ``mlflow`` (a tracking server, or a local ``./mlruns`` store).
        project: W&B project / MLflow experiment name.
        tracking_uri: MLflow tracking URI (``None``: MLflow's default, ``$MLFLOW_TRACKING_URI`` or ``./mlruns``).
        run_name: The run's name in the trackers (default: the output directory's name).
        params: The run's configuration, recorded once (W&B config, MLflow params).

    Raises:
        ConfigError: ``loggers`` names an unknown tracker.
        DependencyNotInstalled: A named tracker's package is missing (checked here, before any training work).
    """

    def __init__(self, output_dir: Path, *, tensorboard: bool = True, loggers: Sequence[str] = (),
                 project: str | None = None, tracking_uri: str | None = None, run_name: str | None = None,
                 params: Mapping[str, Any] | None = None) -> None:
        check_loggers(loggers)
        self.path = output_dir / "metrics.jsonl"
        self._lines: LineAppender | None = None
        output_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(output_dir / "tensorboard"))
            except ImportError:
                logger.warning("tensorboard is not installed; metrics go to metrics.jsonl only")
        name = run_name or output_dir.resolve().name
        project = project or "agentgym"
        self._trackers: list[_Tracker] = []
        try:
            for tracker in dict.fromkeys(loggers):  # each once, in the order given
                if tracker == "wandb":
                    self._trackers.append(_WandbTracker(project, name, output_dir, params or {}))
                else:
                    self._trackers.append(_MlflowTracker(project, name, tracking_uri, params or {}))
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, output_dir: Path, config: Any, *, main: bool = True) -> MetricsLogger:
        """The logger a trainer config asks for; ranks other than the main one write no TensorBoard or tracker runs."""
        to_dict = getattr(config, "to_dict", None)
        return cls(output_dir, tensorboard=bool(getattr(config, "tensorboard", True)) and main,
                   loggers=tuple(getattr(config, "loggers", ())) if main else (),
                   project=getattr(config, "tracking_project", None),
                   tracking_uri=getattr(config, "tracking_uri", None),
                   params=to_dict() if callable(to_dict) else None)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one record; a write that fails part-way (a full disk) is cut back, so no torn line stays behind.

        Raises:
            OSError: ``metrics.jsonl`` cannot be written; it then holds exactly the records logged before.
        """
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        if self._lines is None:  # opened on first use: ranks that never log never touch the file
            self._lines = LineAppender(self.path, fsync=False)
        self._lines.append((json.dumps(record) + "\n").encode("utf-8"))
        scalars = {k: float(v) for k, v in record.items()
                   if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        if self._writer is not None:
            for key, value in scalars.items():
                self._writer.add_scalar(key, value, step)
            self._writer.flush()
        for tracker in self._trackers:
            if scalars:
                tracker.log(step, scalars)

    def records(self) -> int:
        """How many records ``metrics.jsonl`` holds now (a checkpoint stores it, so a resumed run can cut back to it)."""
        try:
            with self.path.open("rb") as fh:
                return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        except FileNotFoundError:
            return 0

    def rewind(self, records: int | None, step: int) -> int:
        """Cut ``metrics.jsonl`` back to what it held when the checkpoint a run resumes from was written.

        A resumed run logs again every step after its checkpoint (and, resuming from no checkpoint, everything,
        step-0 evaluation included), so the records logged after the checkpoint would otherwise appear twice. The
        file keeps its first ``records`` records (``None``: a checkpoint that did not store the count), then any
        record left with a step after ``step``. Returns how many records were dropped. Call on the main rank only.
        """
        self.close_file()
        before = self.records()
        if records is not None:
            keep_first_lines(self.path, records)
        if self.path.is_file():
            lines = self.path.read_bytes().splitlines(keepends=True)
            kept = [line for line in lines if _step_of(line) <= step]
            if len(kept) < len(lines):
                atomic_write_bytes(self.path, b"".join(kept))
        dropped = before - self.records()
        if dropped:
            logger.warning("%s: dropped %d record(s) logged after step %d, the point this run resumes from; those "
                           "steps are logged again", self.path, dropped, step)
        return dropped

    def close_file(self) -> None:
        """Close ``metrics.jsonl`` (the next :meth:`log` opens it again)."""
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    def close(self) -> None:
        self.close_file()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        trackers, self._trackers = getattr(self, "_trackers", []), []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception:  # noqa: BLE001 - a tracker that cannot finish must not lose the local metrics
                logger.warning("closing the %s run failed", type(tracker).__name__, exc_info=True)


def check_loggers(loggers: Sequence[str]) -> None:
    """Raise ConfigError naming the choices when ``loggers`` holds an unknown tracker."""
    for name in loggers:
        if name not in TRACKERS:
            hint = " (TensorBoard has its own field: tensorboard: true)" if name == "tensorboard" else ""
            raise ConfigError(f"Unknown logger {name!r}{hint}; loggers may name {', '.join(TRACKERS)}.")


class _Tracker:
    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _import_tracker(module: str, package: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DependencyNotInstalled(package, "tracking", f"{what}; 'pip install {package}' alone also works") from None


class _WandbTracker(_Tracker):
    """One W&B run; its files go under the output directory (``WANDB_MODE=offline`` logs without an account)."""

    def __init__(self, project: str, name: str, output_dir: Path, params: Mapping[str, Any]) -> None:
        wandb = _import_tracker("wandb", "wandb", "logging to Weights & Biases (loggers: [wandb])")
        self._run = wandb.init(project=project, name=name, dir=str(output_dir), config=dict(params))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


class _MlflowTracker(_Tracker):
    """One MLflow run through ``MlflowClient`` (no global active run: a trainer inside a user's run leaves it alone)."""

    _PARAM_CHARS = 500  # MLflow's smallest param-value limit across versions

    def __init__(self, project: str, name: str, tracking_uri: str | None, params: Mapping[str, Any]) -> None:
        _import_tracker("mlflow", "mlflow-skinny", "logging to MLflow (loggers: [mlflow])")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=tracking_uri)
        experiment = self._client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment is not None else self._client.create_experiment(project)
        self._run_id = self._client.create_run(experiment_id, run_name=name).info.run_id
        flat = [Param(str(k), json.dumps(v, default=str)[: self._PARAM_CHARS] if not isinstance(v, str)
                      else v[: self._PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(flat), 100):  # log_batch takes at most 100 params per call
            self._client.log_batch(self._run_id, params=flat[i: i + 100])

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _step_of(line: bytes) -> float:
    """The step of one ``metrics.jsonl`` line; an unreadable line sorts last (a resume drops it)."""
    try:
        record = json.loads(line)
        return float(record["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf if line.strip() else -math.inf


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of ``metrics.jsonl``; an unreadable line (left by a crash) is skipped with a warning naming it."""
    if not path.is_file():
        return []
    records = []
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            logger.warning("%s:%d: skipping an unreadable metrics line (%s)", path, lineno, exc)
    return records


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
