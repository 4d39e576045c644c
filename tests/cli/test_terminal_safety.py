"""Model and env text printed by the CLI cannot send the terminal a control sequence (clipboard, title, cursor)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentgym.storage import write_trajectories
from agentgym.trajectory import Trajectory, Turn

REPO = Path(__file__).resolve().parents[2]

# OSC 52 writes the clipboard, OSC 0 sets the window title, CSI 2A moves the cursor up two lines (to draw over the
# header a fake "success=True"), U+009B is the 8-bit CSI, U+009D the 8-bit OSC; \r returns to the line start.
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
TITLE = "\x1b]0;pwned\x07"
CURSOR_UP = "\x1b[2A\x1b[2Ksuccess=True"
C1_CSI = "\x9b2J"
C1_OSC = "\x9d0;x\x9c"
OVERWRITE = "ok\rsuccess=True"
FORBIDDEN = (b"\x1b", b"\x07", b"\xc2\x9b", b"\xc2\x9d", b"\xc2\x9c", b"\r")


def _hostile_trajectory() -> Trajectory:
    return Trajectory(
        env_id="agentgym-test/Echo-v0", task_id=f"task{TITLE}", seed=0,
        turns=(Turn(observation=f"obs {CLIPBOARD} {C1_OSC}", action=f"act {CURSOR_UP} {C1_CSI}", reward=0.0,
                    info={"kind": f"tool_call{TITLE}"}),),
        outcome={"success": False, "score": 0.0, "end_reason": f"answered{C1_CSI}"}, end_reason=f"answered{C1_CSI}",
        policy="p", traj_id="t0", error=f"boom {OVERWRITE}", metadata={"final_observation": f"end {CLIPBOARD}"},
    )


def test_view_prints_no_control_sequence_from_model_or_env_text(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, [_hostile_trajectory()])
    result = subprocess.run([sys.executable, "-m", "agentgym.cli", "view", str(path)], capture_output=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    for raw in FORBIDDEN:
        assert raw not in result.stdout and raw not in result.stderr, raw
    shown = result.stdout.decode()
    # each one is shown, escaped, so the user sees what the model sent
    for visible in (r"\x1b]52;c;cm0gLXJmIH4K\x07", r"\x1b]0;pwned\x07", r"\x1b[2A", r"\x9b2J", r"\x9d0;x\x9c",
                    r"ok\x0dsuccess=True"):
        assert visible in shown, visible
    assert "success=False" in shown


def test_terminal_safe_keeps_text_layout_and_escapes_the_rest() -> None:
    from agentgym.utils.terminal import terminal_safe

    plain = "line one\n\tindented – ünïcode 😀"
    assert terminal_safe(plain) is plain
    assert terminal_safe("a\x00b\x7fc\u202ed") == r"a\x00b\x7fc\u202ed"
    assert all(terminal_safe(chr(c)) != chr(c) for c in [*range(0x20), *range(0x7f, 0xa0)] if chr(c) not in "\n\t")


def test_view_skips_a_corrupt_middle_line_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    good = Trajectory(env_id="e", task_id="t", seed=1, turns=(), outcome={"success": True}, end_reason="answered",
                      policy="p", traj_id="a")
    write_trajectories(path, [good])
    with path.open("ab") as fh:
        fh.write(b'{"schema_version": 1, "env_id": "agentgym/Ma{"x": 1}\n')  # an append glued onto a torn line
    write_trajectories(path, [good])
    result = subprocess.run([sys.executable, "-m", "agentgym.cli", "view", str(path)], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert f"{path}:2: skipping a corrupt line" in result.stderr
    assert result.stdout.count("seed=1") == 2


def test_play_transcript_prints_no_control_sequence_the_env_echoes() -> None:
    # the env quotes the unreadable action back in its error observation
    result = subprocess.run([sys.executable, "-m", "agentgym.cli", "play", "agentgym/GuessNumber-v0", "--seed", "3"],
                            input=f"guess({TITLE}{C1_CSI})\n:q\n".encode(), capture_output=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    for raw in FORBIDDEN:
        assert raw not in result.stdout, raw
    assert rb"guess(\x1b]0;pwned\x07\x9b2J)" in result.stdout
