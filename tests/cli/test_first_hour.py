"""The first hour of a new user: sampled evals that vary per turn, progress that shows and never garbles logs,
``--version``, optional W&B / MLflow logging, and the small things a first run trips over."""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from agentgym.cli import main
from agentgym.errors import ConfigError, DependencyNotInstalled
from agentgym.policies import SamplingParams
from agentgym.utils.progress import ProgressBar, progress_enabled, track
from agentgym.cli.report import render_summary_table
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.trajectory import Trajectory, Turn

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# ---- 1. sampled turns differ, and stay reproducible by seed -----------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
    return build_tiny_model(tmp_path_factory.mktemp("first-hour") / "model", config=config)


def _sampled_episode(policy: Any, seed: int, *, deterministic: bool = False) -> Trajectory:
    """One 4-turn Echo episode of a random tiny model at temperature 1 (its actions are invalid: 4 turns)."""
    config = RolloutConfig(sampling=SamplingParams(max_tokens=8, temperature=1.0, seed=seed), system_prompt="",
                           deterministic=deterministic, progress=False)
    spec = EpisodeSpec("agentgym-test/Echo-v0", seed=3, env_kwargs={"max_turns": 4})
    [traj] = RolloutEngine(policy, config).run([spec])
    assert traj.error is None and len(traj.turns) == 4, (traj.error, len(traj.turns))
    return traj


def test_sampled_turns_differ_and_repeat_by_seed(tiny_dir: Path) -> None:
    from agentgym.policies.hf import HFPolicy

    policy = HFPolicy.from_pretrained(tiny_dir)
    first = _sampled_episode(policy, seed=7)
    actions = [t.action_token_ids for t in first.turns]
    assert len(set(actions)) > 1, f"every turn sampled the same tokens: {actions}"
    again = _sampled_episode(policy, seed=7)
    assert [t.action_token_ids for t in again.turns] == actions
    other = _sampled_episode(policy, seed=8)
    assert [t.action_token_ids for t in other.turns] != actions
    # deterministic mode derives the same per-turn seeds: one episode alone samples the same turns
    assert [t.action_token_ids for t in _sampled_episode(policy, seed=7, deterministic=True).turns] == actions


def test_concurrent_sampled_runs_repeat_by_seed(tiny_dir: Path) -> None:
    """``agentgym eval --temperature 1 --seed S`` twice: episodes batch by timing, results must still repeat."""
    from agentgym.policies.hf import HFPolicy

    policy = HFPolicy.from_pretrained(tiny_dir)
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i, env_kwargs={"max_turns": 3}) for i in range(8)]

    def run(seed: int, window_s: float) -> list[list[tuple[int, ...] | None]]:
        config = RolloutConfig(sampling=SamplingParams(max_tokens=6, temperature=1.0, seed=seed), system_prompt="",
                               progress=False, batch_window_s=window_s)
        return [[t.action_token_ids for t in traj.turns] for traj in RolloutEngine(policy, config).run(specs)]

    first = run(3, 0.0)
    assert run(3, 0.05) == first  # another batching of the same requests
    assert run(4, 0.0) != first


@pytest.mark.parametrize("deterministic", [False, True])
def test_every_turn_and_episode_gets_its_own_seed(deterministic: bool) -> None:
    from agentgym.policies import ReferencePolicy

    from agentgym.rollout import EpisodeSpec

    config = RolloutConfig(sampling=SamplingParams(seed=5), deterministic=deterministic)
    engine = RolloutEngine(ReferencePolicy(), config)
    spec = EpisodeSpec("agentgym/Calculator-v0")
    seeds = [engine._sampling_for(spec, e, t).seed for e in range(3) for t in range(4)]
    assert None not in seeds and len(set(seeds)) == 12
    own = [engine._sampling_for(EpisodeSpec("agentgym/Calculator-v0", sampling_seed=s), e, t).seed
           for s in (11, 12) for e in range(3) for t in range(4)]
    assert len(set(own)) == 8  # an episode's own seed: its position in the run no longer matters, its turn does
    unseeded = RolloutEngine(ReferencePolicy(), RolloutConfig(sampling=SamplingParams(seed=None)))
    assert unseeded._sampling_for(spec, 2, 3).seed is None  # no seed asked: the backend's own randomness


# ---- 2. progress ------------------------------------------------------------------------------------------
def test_progress_setting_auto_follows_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTGYM_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert progress_enabled(True) is True and progress_enabled(False) is False

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_enabled("auto") is False  # tests, CI logs, redirected output: plain text
    monkeypatch.setattr(sys, "stderr", Tty())
    assert progress_enabled("auto") is True
    monkeypatch.setenv("RANK", "1")
    assert progress_enabled("auto") is False  # torchrun: rank 0 draws
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("AGENTGYM_PROGRESS", "0")
    assert progress_enabled("auto") is False
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("AGENTGYM_PROGRESS", "1")
    assert progress_enabled("auto") is True
    with pytest.raises(ConfigError, match="'auto'"):
        progress_enabled("sometimes")


def test_rollout_progress_defaults_to_auto_and_is_validated() -> None:
    assert RolloutConfig().progress == "auto"
    assert RolloutConfig(progress=True).progress is True
    with pytest.raises(ConfigError, match="progress"):
        RolloutConfig(progress="yes")


def _recording_console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)


def test_bar_shows_count_rate_and_eta_and_log_lines_stay_whole() -> None:
    console = _recording_console()
    log = logging.getLogger("agentgym.test_first_hour")
    handler = logging.StreamHandler(sys.stderr)  # made before the bar, like logging.basicConfig
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with ProgressBar(3, "GRPO steps", enabled=True, unit="step", console=console) as bar:
            for step in range(3):
                log.info("step %d finished, loss 0.25", step + 1)
                bar.advance(info="ok")
        assert handler.stream is sys.stderr  # restored after the bar
    finally:
        log.removeHandler(handler)
    text = _ANSI.sub("", console.file.getvalue())
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines()]
    for step in (1, 2, 3):  # each log line printed whole, on a line of its own, above the bar
        assert f"step {step} finished, loss 0.25" in lines
    assert any("GRPO steps" in line and "3/3" in line and "eta" in line for line in lines), text


def test_nested_bar_joins_the_live_display() -> None:
    console = _recording_console()
    with ProgressBar(2, "outer", enabled=True, console=console) as outer:
        with ProgressBar(5, "episodes", enabled=True) as inner:  # a second Live would raise rich's LiveError
            assert inner._progress is outer._progress
            inner.advance(5)
        assert len(outer._progress.tasks) == 1  # the finished inner line is gone
        outer.advance(2)
    assert outer._progress is None


def test_track_counts_a_resumed_loop_and_is_silent_when_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(track(range(3, 6), "steps", completed=3, enabled=False)) == [3, 4, 5]
    assert capsys.readouterr().err == ""


def test_trainer_configs_take_progress_and_loggers() -> None:
    from agentgym.trainers.config import GrpoConfig

    base = {"model": "m", "suite": "games-calc"}
    assert GrpoConfig.from_dict(base).progress == "auto"
    assert GrpoConfig.from_dict({**base, "progress": False, "loggers": ["mlflow"]}).loggers == ("mlflow",)
    with pytest.raises(ConfigError, match="GrpoConfig.progress"):
        GrpoConfig.from_dict({**base, "progress": "sometimes"})
    with pytest.raises(ConfigError, match="GrpoConfig.loggers.*'neptune'.*wandb, mlflow"):
        GrpoConfig.from_dict({**base, "loggers": ["neptune"]})


def test_bc_steps_are_numbered(tiny_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from agentgym.models.tiny import load_tiny_model
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import behaviour_clone, collect_demonstrations

    model, tokenizer = load_tiny_model(tiny_dir)
    demos = collect_demonstrations(load_suite("games-calc"), "train", 2, tokenizer, system_prompt="")
    logged: list[int] = []
    with caplog.at_level(logging.INFO, logger="agentgym.trainers.bc"):
        behaviour_clone(model, tokenizer, demos, steps=2, learning_rate=1e-3, batch_size=1, seed=0,
                        log=lambda step, metrics: logged.append(step), progress=False)
    shown = [r.getMessage().split(":")[0] for r in caplog.records if r.name == "agentgym.trainers.bc"]
    assert shown == ["BC step 1/2", "BC step 2/2"]  # were all "step 0" in make quickstart
    assert logged == [0, 1]


# ---- 3. --version -----------------------------------------------------------------------------------------
def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"agentgym {importlib.metadata.version('agentgym')}"


# ---- 4. W&B / MLflow --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tracker", "module", "package"), [("wandb", "wandb", "wandb"),
                                                            ("mlflow", "mlflow", "mlflow-skinny")])
def test_missing_tracker_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracker: str,
                                           module: str, package: str) -> None:
    from agentgym.trainers.metrics import MetricsLogger

    monkeypatch.setitem(sys.modules, module, None)  # import fails as if the package were not installed
    with pytest.raises(DependencyNotInstalled) as info:
        MetricsLogger(tmp_path, tensorboard=False, loggers=[tracker])
    assert f"pip install {package}" in str(info.value) and "agentgym[tracking]" in str(info.value)


def test_mlflow_logging_to_a_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.metrics import MetricsLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants a database; a folder is enough here
    uri = (tmp_path / "mlruns").as_uri()
    config = GrpoConfig.from_dict({"model": "m", "suite": "games-calc", "loggers": ["mlflow"],
                                   "tracking_project": "first-hour", "tracking_uri": uri, "tensorboard": False})
    metrics = MetricsLogger.from_config(tmp_path / "run", config)
    metrics.log(1, {"train/success_rate": 0.25, "note": "text is not a metric"})
    metrics.log(2, {"train/success_rate": 0.75, "eval/mean_action_tokens": None})
    metrics.close()
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("first-hour").experiment_id])
    history = client.get_metric_history(run.info.run_id, "train/success_rate")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["group_size"] == "8" and run.data.params["suite"] == "games-calc"
    assert set(run.data.metrics) == {"train/success_rate"}
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["note"] == "text is not a metric"  # metrics.jsonl keeps every record


# ---- 5. polish --------------------------------------------------------------------------------------------
def test_tiny_model_saves_no_max_length(tiny_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import torch

    from agentgym.models.tiny import load_tiny_model

    assert "max_length" not in json.loads((tiny_dir / "generation_config.json").read_text())
    model, tokenizer = load_tiny_model(tiny_dir)
    capfd.readouterr()
    model.generate(torch.tensor([tokenizer.encode("hello")]), max_new_tokens=2, do_sample=False)
    err = capfd.readouterr().err
    assert "max_length" not in err, err


def _turn(ids: tuple[int, ...] | None) -> Turn:
    return Turn(observation="o", action="a", reward=0.0, info={"kind": "answer"},
                prompt_token_ids=(1,) if ids else None, action_token_ids=ids)


def _traj(*turns: Turn) -> Trajectory:
    return Trajectory(env_id="e", task_id="t", seed=0, turns=turns, outcome={"success": True, "score": 1.0},
                      end_reason="answered")


def test_action_tokens_not_recorded_show_na_not_zero() -> None:
    from rich.console import Console

    chat = summarize([_traj(_turn(None)), _traj(_turn(None), _turn(None))])
    assert chat["mean_action_tokens"] is None
    assert summarize([_traj(_turn((1, 2, 3))), _traj(_turn((4,)), _turn((5, 6)))])["mean_action_tokens"] == 3.0
    mixed = summarize([_traj(_turn((1, 2))), _traj(_turn(None))])  # only the measured episode counts
    assert mixed["mean_action_tokens"] == 2.0
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(render_summary_table(chat, title="calc [test] chat"))
    text = console.file.getvalue()
    assert "calc [test] chat" in text
    assert re.search(r"mean action tokens\s*│\s*n/a", text), text


def test_eval_table_title_keeps_the_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--suite", "games-maze", "--policy", "reference", "--limit", "2", "--out",
                 str(tmp_path / "eval"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "games-maze [test] with reference" in out
    assert re.search(r"mean action tokens\s*│\s*n/a", out), out  # the reference policy records no token ids


@pytest.mark.parametrize("content", ['{\n  "episodes": 2\n}\n', '{"episodes": 2}\n{"a": 1}\n', "not json at all\n",
                                     '[1, 2]\n{"x": 1}\n'])
def test_view_of_a_malformed_file_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   content: str) -> None:
    path = tmp_path / "summary.json"
    path.write_text(content)
    assert main(["view", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentgym view: error: ") and "is not a trajectories file" in err
    assert "trajectories.jsonl" in err and "Traceback" not in err


def test_first_swe_reset_announces_the_cache_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The slow first reset (pip download + unpack of the library's sdist) is logged with its size, once."""
    import shutil

    from agentgym.envs.swe.env import _prepared_sandbox_config
    from agentgym.tasks.swe.libraries import cache_root, get_library

    lib = get_library("toolz")
    sdist = cache_root() / "sdists" / lib.sdist_name
    if not sdist.is_file():
        pytest.skip(f"needs {sdist} (downloaded by the SWE tests); this test stays offline")
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(tmp_path))  # a machine that never used toolz
    (cache_root() / "sdists").mkdir(parents=True)
    shutil.copy(sdist, cache_root() / "sdists" / lib.sdist_name)  # the download itself is PyPI's part
    with caplog.at_level(logging.INFO, logger="agentgym.envs.swe.env"):
        _prepared_sandbox_config("toolz", "bwrap")
        _prepared_sandbox_config("toolz", "bwrap")  # built: silent
    messages = [r.getMessage() for r in caplog.records if r.name == "agentgym.envs.swe.env"]
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"SWE: first use of {lib.key}")
    ready = re.match(rf"SWE: {re.escape(lib.key)} ready in [0-9.]+ s \((\d+) files, ([0-9.]+) MB in ", messages[1])
    assert ready and int(ready.group(1)) > 10 and float(ready.group(2)) > 0.1, messages[1]
    assert (cache_root() / "src" / lib.key / lib.package_dir).is_dir()


def test_dense_index_build_logs_its_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Encoding documents for a dense index (minutes for the full corpus on a CPU) is logged at start and end."""
    pytest.importorskip("faiss")
    pytest.importorskip("transformers")
    from agentgym.tools.retrieval.base import Document
    from agentgym.tools.retrieval.dense import DenseRetriever, default_model_dir

    try:
        default_model_dir()
    except Exception:  # noqa: BLE001 - the bundled MiniLM is part of agentgym[search]
        pytest.skip("needs agentgym[search] (the bundled all-MiniLM-L6-v2)")
    docs = [Document(f"d{i}", f"title {i}", f"document number {i} about topic {i % 3}") for i in range(5)]
    dense = DenseRetriever(cache_dir=tmp_path, batch_size=2)
    assert dense.progress == "auto"
    with caplog.at_level(logging.INFO, logger="agentgym.tools.retrieval.dense"):
        dense.index(docs)
        DenseRetriever(cache_dir=tmp_path, batch_size=2).index(docs)  # from the cache: nothing to announce
    messages = [r.getMessage() for r in caplog.records if r.name == "agentgym.tools.retrieval.dense"]
    assert len(messages) == 2, messages
    assert messages[0].startswith("dense index: encoding 5 documents with ") and str(tmp_path) in messages[0]
    assert re.fullmatch(r"dense index: 5 documents encoded in [0-9.]+ s \(384-dim embeddings, 0\.0 MB\)", messages[1])


def test_demonstrated_actions_longer_than_a_turn_are_reported_with_the_fix(tiny_dir: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A warm start that clones actions the policy's turns would cut teaches what can never be sampled (a TextWorld
    study ran 150 BC steps at 0.000 success that way): the demonstrations say so, with the length to set."""
    from agentgym.models.tiny import load_tiny_model
    from agentgym.registration.suites import load_suite
    from agentgym.trainers.bc import collect_demonstrations

    _, tokenizer = load_tiny_model(tiny_dir)
    suite = load_suite("games-calc")
    with caplog.at_level(logging.WARNING, logger="agentgym.trainers.bc"):
        demos = collect_demonstrations(suite, "train", 2, tokenizer, system_prompt="", max_action_tokens=3)
    longest = max(len(t.action_token_ids) for d in demos for t in d.turns)
    assert longest > 3 and f"(longest {longest})" in caplog.text and f"to at least {longest}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentgym.trainers.bc"):
        collect_demonstrations(suite, "train", 2, tokenizer, system_prompt="", max_action_tokens=longest)
    assert "longer than" not in caplog.text
