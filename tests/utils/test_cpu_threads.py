"""The torch thread count chosen on a CPU: one per process on a loaded machine, the free cores otherwise, the user's
explicit setting always; and the one-line hint for a step far slower than expected."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from agentgym.errors import ConfigError
from agentgym.utils.cpu_threads import SlowStepWatch, apply_cpu_threads, choose_threads


def test_a_loaded_machine_gets_one_thread_an_idle_one_its_cores() -> None:
    busy = choose_threads(cores=2, load=3.5, own_share=0.5, environ={})  # the quickstart's busy 2-core machine
    assert busy.threads == 1 and busy.source == "auto"
    assert "load average 3.5" in busy.reason and "2 cores" in busy.reason
    assert choose_threads(cores=8, load=0.2, own_share=0.2, environ={}).threads == 8
    assert choose_threads(cores=8, load=4.9, own_share=0.9, environ={}).threads == 4  # 4 cores are someone else's


def test_several_processes_share_the_cores() -> None:
    assert choose_threads(cores=8, load=0.0, own_share=0.0, environ={"LOCAL_WORLD_SIZE": "4"}).threads == 2
    assert choose_threads(cores=2, load=0.0, own_share=0.0, processes=4, environ={}).threads == 1


def test_explicit_settings_win_in_order() -> None:
    env = {"OMP_NUM_THREADS": "3", "AGENTGYM_CPU_THREADS": "5"}
    assert (choose_threads(7, cores=2, load=9.0, environ=env).threads, choose_threads(7, environ=env).source) == (3, "user")
    assert choose_threads(7, cores=2, load=9.0, environ={"AGENTGYM_CPU_THREADS": "5"}).threads == 5
    assert choose_threads(7, cores=2, load=9.0, own_share=0.0, environ={}).threads == 7
    with pytest.raises(ConfigError, match="AGENTGYM_CPU_THREADS must be a positive integer"):
        choose_threads(environ={"AGENTGYM_CPU_THREADS": "many"})


def test_a_torch_set_num_threads_call_by_the_user_wins() -> None:
    code = ("import torch, agentgym.utils.cpu_threads as c; torch.set_num_threads(1); "
            "print(c.apply_cpu_threads(2).source, torch.get_num_threads())")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                                          "AGENTGYM_CPU_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["user", "1"]


def test_apply_sets_torch_and_logs_the_choice_once(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("AGENTGYM_CPU_THREADS", "1")
    try:
        with caplog.at_level(logging.INFO, logger="agentgym.utils.cpu_threads"):
            assert apply_cpu_threads().threads == 1 and torch.get_num_threads() == 1
            apply_cpu_threads()
        lines = [r.getMessage() for r in caplog.records if r.name == "agentgym.utils.cpu_threads"]
        assert len(lines) <= 1 and all("1 torch thread (AGENTGYM_CPU_THREADS=1)" in line for line in lines)
    finally:
        torch.set_num_threads(before)


def test_a_step_far_slower_than_the_fastest_gets_one_hint(caplog: pytest.LogCaptureFixture) -> None:
    watch = SlowStepWatch("a BC step", threads=2)
    with caplog.at_level(logging.WARNING, logger="agentgym.utils.cpu_threads"):
        assert watch.observe(1.5) is None
        hint = watch.observe(12.6)
        assert watch.observe(13.7) is None  # once
    assert hint is not None and "8x the fastest" in hint and "OMP_NUM_THREADS=1" in hint
    assert [r.getMessage() for r in caplog.records] == [hint]


def test_a_step_starved_of_cpu_time_gets_the_hint_at_once() -> None:
    hint = SlowStepWatch("a BC step", threads=2).observe(12.6, cpu_seconds=3.0)
    assert hint is not None and "got only 0.2 of the" in hint and "OMP_NUM_THREADS=1" in hint
    assert SlowStepWatch("a BC step", threads=1).observe(12.6, cpu_seconds=12.0) is None  # busy on its one core
    assert SlowStepWatch("a BC step", threads=2).observe(0.4, cpu_seconds=0.0) is None  # short steps stay quiet
