"""The extension tutorial (examples/README.md) runs as written.

``examples/`` is copied into an empty directory and every ```bash block of the tutorial runs there, in order,
unchanged (``python`` and ``agentgym`` resolve to this interpreter). Each block's test then checks what the
block produced: the derived schema, the checks, the eval summaries, the trained model, the plugin's tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BLOCKS = re.findall(r"```bash\n(.*?)```", (EXAMPLES / "README.md").read_text(encoding="utf-8"), re.DOTALL)


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # the `python` and `agentgym` of this interpreter first
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tutorial")
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    return root


def _run_block(workdir: Path, needle: str) -> str:
    """Run the one bash block that contains ``needle``; return its output."""
    matching = [b for b in BLOCKS if needle in b]
    assert len(matching) == 1, f"expected one ```bash block with {needle!r} in examples/README.md, got {len(matching)}"
    if shutil.which("agentgym", path=_env()["PATH"]) is None and "agentgym " in matching[0]:
        pytest.skip("the agentgym command is not installed (pip install -e .)")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", matching[0]], cwd=workdir, capture_output=True,
                          text=True, timeout=600, env=_env())
    assert proc.returncode == 0, (f"block failed:\n{matching[0]}\nstdout:\n{proc.stdout[-3000:]}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")
    return proc.stdout


def test_every_block_is_covered() -> None:
    needles = ["custom_tool.py", "check_reverse.py", "reverse_grpo.yaml", "new-env", "mcp_env.py"]
    assert len(BLOCKS) == len(needles) and all(any(n in b for b in BLOCKS) for n in needles)


def test_the_env_fits_in_40_lines() -> None:
    assert len((EXAMPLES / "reverse_env.py").read_text(encoding="utf-8").splitlines()) <= 40


def test_custom_tool(workdir: Path) -> None:
    out = _run_block(workdir, "custom_tool.py")
    schema = json.loads(out[: out.index("\n}\n") + 2])
    params = schema["function"]["parameters"]
    assert params["properties"]["backwards"] == {"type": "boolean", "default": False,
                                                 "description": "Spell it from the last letter to the first."}
    assert params["required"] == ["word"]
    assert "r e t t o" in out and "is not of type 'string'" in out
    assert re.search(r"Reverse the word (\w+)\. -> ([a-z ]+)$", out.strip().splitlines()[-1])


def test_check_and_validate(workdir: Path) -> None:
    assert "suite reverse: all 80 tasks solved by the reference solver" in _run_block(workdir, "check_reverse.py")


def test_eval_and_train(workdir: Path) -> None:
    out = _run_block(workdir, "reverse_grpo.yaml")
    reference = json.loads((workdir / "runs/reverse/eval-reference/summary.json").read_text(encoding="utf-8"))
    assert reference["episodes"] == 16 and reference["success_rate"] == 1.0
    tiny = json.loads((workdir / "runs/reverse/eval-tiny/summary.json").read_text(encoding="utf-8"))
    assert tiny["episodes"] == 2 and tiny["policy"] == "hf:runs/reverse/model"
    assert re.search(r"held-out success: \d\.\d+ before GRPO -> \d\.\d+ after", out), out[-500:]
    metrics = [json.loads(line) for line in (workdir / "runs/reverse/grpo/metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in m for m in metrics)
    assert (workdir / "runs/reverse/grpo/model/config.json").is_file()


def test_new_env_skeleton_is_green_on_first_run(workdir: Path) -> None:
    out = _run_block(workdir, "new-env")
    assert re.search(r"\b2 passed\b", out), out
    assert (workdir / "word-game/word_game/env.py").is_file()


def test_mcp_tools(workdir: Path) -> None:
    if importlib.util.find_spec("mcp") is None:
        pytest.skip("pip install 'agentgym[mcp]'")
    lines = _run_block(workdir, "mcp_env.py").strip().splitlines()
    assert lines[0] == "['answer', 'backwards']"
    word, backwards, reward = re.fullmatch(r"Reverse the word (\w+)\. -> (\w+) -> (\S+)", lines[1]).groups()
    assert backwards == word[::-1] and float(reward) == 1.0
