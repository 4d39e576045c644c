"""``agentgym eval`` on a disk that fills: real ENOSPC from a small tmpfs, real EFBIG from RLIMIT_FSIZE.

The eval runs as a user runs it (``python -m agentgym.cli eval`` in a subprocess). Where the disk must fill at a
chosen episode, the policy is a real OpenAI client talking to a scripted chat server in this process: the server
fills or frees the disk when an episode starts, and ``--max-in-flight 1`` makes episodes (and their writes) one at
a time, so which episodes meet a full disk is known.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (needs root, or CAP_SYS_ADMIN); skipped with the reason where mounting is not permitted."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({result.stderr.strip() or 'mount failed'}); "
                    "these tests need root or CAP_SYS_ADMIN")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> None:
    """Fill ``disk`` to the last byte (pages, then single bytes), so the next append stores part of its line and
    then fails with ENOSPC, the way a disk that fills mid-write behaves."""
    with (disk / "filler").open("ab", buffering=0) as fh:
        for size in (1 << 16, 4096, 1):
            while True:
                try:
                    fh.write(b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break


def free(disk: Path) -> None:
    (disk / "filler").unlink()


_REPLY = "Let me think. " + "hmm " * 1500 + "\nanswer(3)"


class ScriptedChat:
    """An OpenAI-compatible ``/v1/chat/completions`` that answers ``answer(3)`` (one turn per Calculator episode)
    and calls ``on_episode(n)`` before answering the n-th request (1-based). The reply is padded to 6 KB, so each
    trajectory line spans more than a 4 KiB page: on a full tmpfs its write stores the bytes that fit in the file's
    last page, then fails."""

    def __init__(self, on_episode: Callable[[int], None]) -> None:
        self.requests = 0
        lock = threading.Lock()
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    chat.requests += 1
                    # the previous episode's trajectory is written off the event loop; let it land first
                    time.sleep(0.2)
                    on_episode(chat.requests)
                body = json.dumps({"id": f"c{chat.requests}", "object": "chat.completion", "model": "scripted",
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": _REPLY}}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def policy(self) -> str:
        return f"openai:http://127.0.0.1:{self.server.server_address[1]}/v1#scripted"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _eval(*args: str, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentgym.cli", "eval", "--no-progress", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, preexec_fn=preexec)


def _lines(path: Path) -> list[dict]:
    """Every line of ``path`` parsed strictly: one corrupt line fails the test."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the file must end on a line boundary"
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def _calc_eval(out: Path, policy: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _eval("--suite", "games-calc", "--policy", policy, "--limit", "10", "--max-in-flight", "1", "--out",
                 str(out), *extra)


def test_a_disk_that_fills_then_frees_loses_whole_episodes_only_and_says_so(small_disk: Path) -> None:
    def on_episode(n: int) -> None:
        if n == 4:
            fill(small_disk)  # episodes 4 and 5 meet a full disk
        elif n == 6:
            free(small_disk)

    chat = ScriptedChat(on_episode)
    run = small_disk / "run"
    try:
        result = _calc_eval(run, chat.policy)
        assert result.returncode == 1, result.stderr
        records = _lines(run / "trajectories.jsonl")
        assert len(records) == 8, "the episodes after the disk was freed are written"
        assert "2 episode(s) could not be written" in result.stderr and "No space left on device" in result.stderr
        assert f"--out {run} --resume" in result.stderr and "Traceback" not in result.stderr
        summary = json.loads((run / "summary.json").read_text())
        assert summary["episodes"] == 8 and summary["lost_episodes"] == 2 and summary["complete"] is False
        assert not list(run.glob(".*")), "no temp or reserve file is left behind"

        again = _calc_eval(run, chat.policy, "--resume")  # the same server: --resume needs the same --policy
    finally:
        chat.close()
    assert again.returncode == 0, again.stderr
    assert chat.requests == 12, "only the two lost episodes run again"
    records = _lines(run / "trajectories.jsonl")
    assert len({(r["task_id"], r["seed"]) for r in records}) == len(records) == 10
    assert json.loads((run / "summary.json").read_text())["episodes"] == 10


def test_a_disk_that_stays_full_stops_the_run_early(small_disk: Path) -> None:
    chat = ScriptedChat(lambda n: fill(small_disk) if n == 3 else None)
    try:
        result = _calc_eval(small_disk / "run", chat.policy)
    finally:
        chat.close()
    run = small_disk / "run"
    assert result.returncode == 1, result.stderr
    # Writes trail their episodes (a writer thread), so the episode after the third lost one may already have
    # sent its first request when the run stops; none after it does.
    assert chat.requests in (5, 6), "three failed writes in a row stop the run; episodes 7-10 never start"
    assert "stopped early" in result.stderr and "--resume" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("was not written") == 3
    assert len(_lines(run / "trajectories.jsonl")) == 2
    summary = json.loads((run / "summary.json").read_text())  # written from the space reserved at the start
    assert summary["episodes"] == 2 and summary["lost_episodes"] == 3
    assert summary["not_run"] == 10 - summary["episodes"] - summary["lost_episodes"]


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_file_size_limit_mid_run_stops_it_with_whole_lines(tmp_path: Path) -> None:
    out = tmp_path / "run"
    limit = 60_000  # about seven maze episodes; the line that crosses it is written in part, then EFBIG
    result = _eval("--suite", "games-maze", "--policy", "reference", "--limit", "40", "--out", str(out),
                   preexec=_file_size_limit(limit))
    assert result.returncode == 1, result.stderr
    assert "stopped early" in result.stderr and "File too large" in result.stderr
    records = _lines(out / "trajectories.jsonl")
    assert 0 < len(records) < 40 and (out / "trajectories.jsonl").stat().st_size <= limit
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == len(records) and summary["lost_episodes"] >= 3

    again = _eval("--suite", "games-maze", "--policy", "reference", "--limit", "40", "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    records = _lines(out / "trajectories.jsonl")
    assert len({(r["task_id"], r["seed"]) for r in records}) == len(records) == 40


def test_resume_repairs_a_torn_tail_and_a_corrupt_middle_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("--suite", "games-maze", "--policy", "reference", "--out", str(out))
    assert _eval(*args, "--limit", "4").returncode == 0
    path = out / "trajectories.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1]
    lines[1] = lines[1][:50] + lines[2]  # what an append glued onto a partial line looks like
    del lines[2]
    path.write_bytes(b"\n".join(lines) + b"\n" + b'{"schema_version": 1, "env_id": "agentgym/Ma')
    result = _eval(*args, "--limit", "6", "--resume")
    assert result.returncode == 0, result.stderr
    assert f"{path}:2: moved an unreadable line" in result.stderr
    assert f"{path}:4: moved an unreadable line" in result.stderr and "torn final line" in result.stderr
    records = _lines(path)
    assert len({(r["task_id"], r["seed"]) for r in records}) == len(records) == 6
    quarantined = _lines(out / "trajectories.corrupt.jsonl")
    assert [q["line"] for q in quarantined] == [2, 4]
    assert json.loads((out / "summary.json").read_text())["episodes"] == 6
    assert os.path.getsize(path) > 0
