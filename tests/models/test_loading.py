"""Models named by Hub id load offline from the local Hugging Face cache, everywhere a model can be named.

The cache is a real one laid out as ``huggingface_hub`` writes it (``models--org--name/{blobs,refs,snapshots}``,
snapshot files symlinked to content-addressed blobs) in a temporary ``HF_HOME``, holding the tiny model. The
environment is changed after ``huggingface_hub`` was imported, as a user's notebook would, so these tests also
prove the resolver reads the cache location at call time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.loading import hub_cache_dir, parse_hub_id, resolve_model_dir  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def _add_snapshot(cache: Path, repo_id: str, commit: str, source: Path, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put ``source``'s files in ``cache`` as huggingface_hub does: blobs by hash, snapshot entries as symlinks."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 50),
                            config=SMALL)


@pytest.fixture()
def hf_home(tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HF_HOME whose hub cache holds ``org/tiny`` (main) and a second revision tagged ``v2``."""
    home = tmp_path / "hf-home"
    cache = home / "hub"
    _add_snapshot(cache, "org/tiny", COMMIT, tiny_dir)
    # a second revision that differs only in its saved rollout defaults, to tell revisions apart
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    (other / "agentgym.json").write_text(json.dumps({"system_prompt": "", "max_tokens": 7, "suite": "games-calc"}))
    _add_snapshot(cache, "org/tiny", OTHER_COMMIT, other, refs=("v2",))
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


# ---- the resolver -------------------------------------------------------------------------------------
def test_hub_id_shapes() -> None:
    assert parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert parse_hub_id("org/tiny@v2") == ("org/tiny", "v2")
    for not_hub in ("/abs/path", "./rel/dir", "runs/tiny/model", "tiny", "~/models/x", "a/b c", "org/../x", "org/x-"):
        assert parse_hub_id(not_hub) is None, not_hub


def test_hub_ids_resolve_to_cached_snapshots_and_revisions(hf_home: Path, tiny_dir: Path) -> None:
    main = resolve_model_dir("org/tiny")
    assert main == hf_home / "hub" / "models--org--tiny" / "snapshots" / COMMIT
    assert (main / "config.json").read_bytes() == (tiny_dir / "config.json").read_bytes()
    assert resolve_model_dir("org/tiny@v2").name == OTHER_COMMIT  # a branch or tag, through refs/
    assert resolve_model_dir(f"org/tiny@{COMMIT}").name == COMMIT  # a commit hash
    assert resolve_model_dir(str(tiny_dir)) == tiny_dir  # a local directory is returned as is


def test_hub_cache_follows_the_environment_at_call_time(hf_home: Path, tmp_path: Path, tiny_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub_cache_dir() == hf_home / "hub"
    elsewhere = tmp_path / "hub-cache"
    _add_snapshot(elsewhere, "other/model", COMMIT, tiny_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(elsewhere))  # wins over HF_HOME, as in huggingface_hub
    assert resolve_model_dir("other/model").parent.parent.parent == elsewhere
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
        resolve_model_dir("org/tiny")


def test_missing_models_fail_with_the_fix(hf_home: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_model_dir("org/missing")
    message = str(info.value)
    assert "hf download org/missing" in message and "huggingface-cli download org/missing" in message
    assert "HF_HOME" in message and str(hf_home / "hub") in message and "never downloads" in message
    with pytest.raises(ConfigError, match="revision 'nope'"):
        resolve_model_dir("org/tiny@nope")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_dir(tmp_path / "missing")
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model_dir(tmp_path)
    # a path object is never taken for a Hub id, even when its text looks like one
    with pytest.raises(ConfigError, match="directory 'org/tiny' does not exist"):
        resolve_model_dir(Path("org/tiny"))


# ---- every place a model can be named ---------------------------------------------------------------------
def test_hf_policy_loads_a_cached_hub_id(hf_home: Path, tiny_dir: Path) -> None:
    from agentgym.policies import SamplingParams
    from agentgym.policies.hf import HFPolicy

    policy = HFPolicy.from_pretrained("org/tiny")
    local = HFPolicy.from_pretrained(tiny_dir)
    assert policy.name == "org/tiny"
    ids = policy.tokenizer("Compute 2 + 3")["input_ids"]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    assert policy.generate([ids], params)[0].token_ids == local.generate([ids], params)[0].token_ids
    assert HFPolicy.from_pretrained("org/tiny@v2").default_system_prompt == ""  # v2's agentgym.json was read
    with pytest.raises(ConfigError, match="hf download org/missing"):
        HFPolicy.from_pretrained("org/missing")


def test_eval_cli_accepts_a_cached_hub_id(hf_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--suite", "games-calc", "--policy", "hf:org/tiny@v2", "--limit", "2", "--out", str(out),
                 "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["policy"] == "hf:org/tiny@v2"
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    # the v2 revision's saved defaults were used: max_tokens 7 caps every sampled turn
    assert all(len(turn["action_token_ids"]) <= 7 for t in trajectories for turn in t["turns"])
    assert main(["eval", "--suite", "games-calc", "--policy", "hf:org/missing", "--limit", "1", "--out",
                 str(tmp_path / "bad"), "--no-progress"]) == 2
    assert "hf download org/missing" in capsys.readouterr().err


def test_grpo_config_with_a_hub_id_validates_and_loads(hf_home: Path, tmp_path: Path) -> None:
    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer

    config = GrpoConfig(model="org/tiny", suite="games-calc", output_dir=str(tmp_path / "run"), tensorboard=False)
    trainer = GrpoTrainer(config)
    assert trainer.model_dir.name == COMMIT
    model, tokenizer = trainer._load(config.model)
    assert model.dtype == torch.float32 and all(p.requires_grad for p in model.parameters())
    assert tokenizer.chat_template
    with pytest.raises(ConfigError, match="GrpoConfig.model: .*hf download org/missing"):
        GrpoTrainer(GrpoConfig(model="org/missing", suite="games-calc"))
    with pytest.raises(ConfigError, match="GrpoConfig.reference_model: .*hf download org/ref"):
        GrpoTrainer(GrpoConfig(model="org/tiny", suite="games-calc", kl_coef=0.1, reference_model="org/ref"))


def test_serve_accepts_a_cached_hub_id(hf_home: Path) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from agentgym.serving.openai_server import run_server, serve_in_background

    with serve_in_background("org/tiny") as base_url:
        assert httpx.get(base_url + "/models").json()["data"][0]["id"] == "org/tiny"
        reply = httpx.post(base_url + "/completions", json={"model": "org/tiny", "prompt": "Compute 2 + 3",
                                                           "max_tokens": 4, "temperature": 0}, timeout=60)
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] is not None
    with pytest.raises(ConfigError, match="hf download org/missing"):
        run_server("org/missing")
