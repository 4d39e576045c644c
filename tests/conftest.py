"""Shared test setup: everything offline, deterministic hashing, test-only envs registered."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs several test files at once on few cores: one math thread per worker (and per process it
    # starts), or each torch op's thread team would spin against the other workers' teams.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import gymnasium as gym
import pytest

import agentgym  # noqa: F401


def _register_test_envs() -> None:
    for name in ("Flaky-v0", "Echo-v0", "Unseeded-v0", "CheapEcho-v0", "Progress-v0"):
        env_id = f"agentgym-test/{name}"
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=f"tests.helpers.envs:{name.split('-')[0]}Env")


_register_test_envs()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
