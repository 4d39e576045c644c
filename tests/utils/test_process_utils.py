"""agentgym.utils.procfs (the one reader of /proc) and agentgym.utils.singletons (the process-wide pools' registry)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from agentgym.utils import procfs
from agentgym.utils.singletons import ProcessSingletons

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def test_stat_fields_survive_a_command_name_with_spaces_and_parentheses():
    script = ("import time\nopen('/proc/self/comm', 'w').write('a) b (c')\nprint('ready', flush=True)\n"
              "time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert procfs.state(child.pid) in ("S", "R")
        assert procfs.parent_pid(child.pid) == os.getpid()
        assert procfs.start_ticks(child.pid) is not None
        assert procfs.status(child.pid)["Name"].strip() == "a) b (c"
    finally:
        child.kill()
        child.wait()
    assert procfs.stat_fields(child.pid) == [] and procfs.state(child.pid) is None
    assert procfs.parent_pid(child.pid) is None and procfs.start_ticks(child.pid) is None
    assert procfs.status(child.pid) is None and procfs.cmdline(child.pid) is None


def test_the_tree_walks_find_children_and_grandchildren():
    script = ("import subprocess, sys, time\nsubprocess.Popen(['sleep', '30'])\nprint('ready', flush=True)\n"
              "time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", script, "--marker"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert procfs.cmdline(child.pid) == [sys.executable, "-c", script, "--marker"]
        assert child.pid in procfs.children(os.getpid()) and child.pid in procfs.all_pids()
        (grandchild,) = procfs.children(child.pid)
        assert procfs.descendants(child.pid) == {child.pid, grandchild}
        assert {child.pid, grandchild} <= procfs.descendants(os.getpid())
    finally:
        for pid in procfs.descendants(child.pid):
            os.kill(pid, 9)
        child.wait()


class _Resource:
    def __init__(self, key: str, fail_close: bool = False) -> None:
        self.key, self.closed, self.fail_close = key, False, fail_close

    def close(self) -> None:
        failed, self.closed = self.fail_close and not self.closed, True
        if failed:  # once: the registry closes again at exit
            raise RuntimeError("close failed")


def test_one_instance_per_key_even_when_threads_ask_at_once():
    made: list[str] = []

    def factory(key: str) -> _Resource:
        made.append(key)
        time.sleep(0.01)  # a slow start: a second thread asking meanwhile must wait, not make another
        return _Resource(key)

    registry: ProcessSingletons[str, _Resource] = ProcessSingletons(factory, reusable=lambda r: not r.closed)
    got: list[_Resource] = []
    threads = [threading.Thread(target=lambda: got.append(registry.get("a"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == ["a"] and all(r is got[0] for r in got)
    assert registry.get("b") is not got[0] and [k for k, _ in registry.items()] == ["a", "b"]


def test_an_instance_no_longer_reusable_is_replaced_and_all_are_closed_even_if_one_fails():
    registry: ProcessSingletons[str, _Resource] = ProcessSingletons(
        lambda key: _Resource(key, fail_close=key == "bad"), reusable=lambda r: not r.closed)
    bad = registry.get("bad")  # closed first: its failure must not keep "a" open
    first = registry.get("a")
    first.close()
    second = registry.get("a")
    assert second is not first
    registry.close_all()
    assert second.closed and bad.closed
    assert set(registry.values()) == {second, bad}
