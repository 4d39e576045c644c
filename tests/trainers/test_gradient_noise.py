"""``benchmarks/gradient_noise.py``: the gradient noise scale of GRPO, GiGPO and their variants, measured with the
trainers' own gradients on independent batches; variants are compared on the very same rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from agentgym.models.tiny import build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from tests.helpers.scripts import load_script  # noqa: E402
from tests.helpers.tiny_models import SMALL  # noqa: E402


@pytest.fixture(scope="module")
def maze_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("credit-maze", 40),
                            config=SMALL)


def test_noise_scale_per_variant_on_saved_rollouts(maze_model: Path, tmp_path: Path) -> None:
    bench = load_script("benchmarks/gradient_noise.py")
    common = ["--task", "maze", "--model", str(maze_model), "--batches", "3", "--tasks-per-step", "2",
              "--group-size", "4", "--variants", "grpo,gigpo", "--threads", "1", "--workdir", str(tmp_path / "w")]
    assert bench.main(common + ["--save", str(tmp_path / "batches.pt"), "--out", str(tmp_path / "a.json")]) == 0
    first = json.loads((tmp_path / "a.json").read_text())
    assert first["batches"] == 3 and first["rollouts_per_batch"] == 8
    for name in ("grpo", "gigpo"):
        r = first["variants"][name]
        assert len(r["cosines"]) == 3 and all(-1.0 <= c <= 1.0 for c in r["cosines"])
        assert (r["noise_scale"] is None) == (r["mean_cos"] <= 0)
        assert len(r["grad_norms"]) == 3 and all(n >= 0.0 for n in r["grad_norms"])
    # GiGPO's step penalty on void turns gives an untrained policy a gradient even where no rollout succeeds
    assert first["variants"]["gigpo"]["empty_batches"] < 3
    # measured again on the saved rollouts: the same gradients, so the same cosines
    assert bench.main(common + ["--load", str(tmp_path / "batches.pt"), "--out", str(tmp_path / "b.json")]) == 0
    again = json.loads((tmp_path / "b.json").read_text())
    for name in ("grpo", "gigpo"):
        assert again["variants"][name]["cosines"] == pytest.approx(first["variants"][name]["cosines"], abs=1e-9)
    assert "| gigpo |" in bench.table(again)


@pytest.mark.parametrize(("flags", "message"), [
    (["--batches", "1"], "--batches must be >= 2"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--variants", "ppo"], "unknown ['ppo']"),
    (["--load", "/nonexistent.pt"], "no such file"),
    (["--env-kwargs", "[1]"], "must be a JSON object"),
])
def test_bad_flags_say_the_fix(maze_model: Path, flags: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("benchmarks/gradient_noise.py")
    with pytest.raises(SystemExit):
        bench.parse_args(["--task", "maze", "--model", str(maze_model), *flags])
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "/nonexistent"])
    assert "build the warm start first" in capsys.readouterr().err


def test_a_missing_study_warm_start_names_the_command_that_builds_it_there(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("benchmarks/gradient_noise.py")
    with pytest.raises(SystemExit):
        bench.parse_args(["--task", "babyai", "--model", str(tmp_path / "studies" / "warm-babyai")])
    assert "agentgym study grpo_babyai --agreement builds runs/studies/warm-babyai" in capsys.readouterr().err


def test_a_study_task_outside_the_benchmark_is_measured_with_its_own_settings(maze_model: Path) -> None:
    bench = load_script("benchmarks/gradient_noise.py")
    args = bench.parse_args(["--task", "textworld", "--model", str(maze_model)])
    task = bench.task_of(args.task)
    assert task.suite == "textworld" and task.max_tokens_per_turn == 48  # TextWorld's commands, not a maze move
    assert args.credit_args.eval_split == task.eval_split


def test_a_smaller_run_keeps_the_recorded_measurement_unless_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The studies size their rollouts a step from benchmarks/results/gradient_noise_TASK.json, so a quick try on
    fewer rollouts must not replace a measurement on more; ``--replace`` does, and a larger run always does."""
    bench = load_script("benchmarks/gradient_noise.py")
    import _results

    monkeypatch.setattr(_results, "RESULTS_DIR", tmp_path)

    def report(batches: int, per_batch: int, scale: float) -> dict:
        variant = {"noise_scale": scale, "mean_cos": 0.3, "se_cos": 0.05}
        return {"task": "guess", "batches": batches, "rollouts_per_batch": per_batch, "success": 0.2,
                "variants": {"grpo": variant, "gigpo": dict(variant, noise_scale=scale / 2)}}

    def recorded() -> float:
        details = json.loads((tmp_path / "gradient_noise_guess.json").read_text())["details"]
        return details["variants"]["grpo"]["noise_scale"]

    assert bench.record(report(6, 256, 536.0)) == tmp_path / "gradient_noise_guess.json"
    assert bench.record(report(2, 16, 90.0)) is None and recorded() == 536.0
    assert "measured on 1536 rollouts, this run on 32 (pass --replace" in capsys.readouterr().out
    bench.record(report(2, 16, 90.0), replace=True)
    assert recorded() == 90.0
    bench.record(report(8, 256, 500.0))
    assert recorded() == 500.0


def test_a_labelled_measurement_goes_to_its_own_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measurement at a trained model (``--label step40``) must not become the figure the studies size from."""
    bench = load_script("benchmarks/gradient_noise.py")
    import _results

    monkeypatch.setattr(_results, "RESULTS_DIR", tmp_path)
    variant = {"noise_scale": 389.0, "mean_cos": 0.4, "se_cos": 0.07}
    report = {"task": "babyai", "model": "runs/m", "batches": 6, "rollouts_per_batch": 256, "success": 0.3,
              "variants": {"grpo": dict(variant, noise_scale=149.0), "grpo_seq_mean": variant}}
    assert bench.record(report, label="step40") == tmp_path / "gradient_noise_babyai_step40.json"
    assert not (tmp_path / "gradient_noise_babyai.json").exists()


def test_a_label_that_cannot_name_a_file_is_refused(maze_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("benchmarks/gradient_noise.py")
    with pytest.raises(SystemExit):
        bench.parse_args(["--task", "maze", "--model", str(maze_model), "--label", "../step 40"])
    assert "use lower-case letters, digits and _" in capsys.readouterr().err


def test_the_noise_range_says_when_a_cosine_is_too_close_to_zero_to_bound_the_scale() -> None:
    bench = load_script("benchmarks/gradient_noise.py")
    low, high = bench.noise_range(0.240, 0.053, 128)  # TextWorld GiGPO at its warm start
    assert low == pytest.approx(128 * (1 - 0.346) / 0.346) and high == pytest.approx(128 * (1 - 0.134) / 0.134)
    assert low < 128 * (1 - 0.24) / 0.24 < high
    low, high = bench.noise_range(0.021, 0.055, 128)  # within two se of 0: only the lower bound is known
    assert low == pytest.approx(128 * (1 - 0.131) / 0.131) and high is None
    assert bench.noise_range(-0.1, 0.01, 128) == (None, None)
    assert bench._range((low, None)) == f"{low:,.0f} to unbounded"
