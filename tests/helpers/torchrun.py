"""Launching a test file as a multi-process ``torchrun`` job on this machine (gloo on CPU), with a timeout.

The distributed tests (``test_data_parallel.py``, ``test_fsdp.py``) run themselves as the worker script: pytest
launches ``torchrun FILE ARGS``, every rank runs the cases and saves what it ends with, and pytest compares that
with one process. A deadlock (a rank waiting on a collective another rank never makes) fails the test after the
timeout instead of blocking the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous port of one launch)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(script: list[str], *, nproc: int = 2, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (a path and its arguments) on ``nproc`` gloo ranks on 127.0.0.1; a hang fails after
    ``timeout`` seconds (``subprocess.run`` kills the launcher, whose workers die with it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", *script]
    try:
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the {nproc}-process run did not finish in {timeout:.0f} s (a deadlock?): "
                    f"{(exc.stderr or b'')[-2000:]!r}")
    first = result.stderr.find("Traceback")  # the failing rank's own traceback, not only torchrun's summary
    assert result.returncode == 0, result.stderr[max(first, 0):][:3000] + "\n...\n" + result.stderr[-1500:]
    return result


def build_small_model(path: Path, suite: str) -> Path:
    """The tiny from-config model at its smallest useful size (2 layers, hidden 32), tokenizer trained on
    ``suite``'s demonstrations: a real decoder whose collectives are the same as a large model's, in seconds."""
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.cli.quickstart import demonstration_texts

    small = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64)
    return build_tiny_model(path, texts=demonstration_texts(suite, 60), config=small)
