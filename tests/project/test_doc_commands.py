"""Every shell command of the README and of ``docs/*.md`` runs as copied.

A newcomer copies these lines first; one that fails, or runs and quietly measures nothing (a served model evaluated
without the prompt it was trained with scored 0 on every episode), is the first thing they meet. Each command
found in a fenced shell block must have an entry in :data:`PLAN`, which says how the test runs it: as written, or
in a reduced form whose reason is written next to it (a smaller training run, a free port instead of a fixed one).
A command added to the docs without an entry fails :func:`test_every_documented_command_has_a_plan`.

Commands run from a fresh directory that links the repository's ``configs`` and ``examples`` and copies its
``benchmarks`` (a benchmark writes its figures beside its script), so relative paths resolve as in a checkout and
everything they write stays in the test's directory. ``agentgym``
and ``python`` are this interpreter's. Servers are started, probed and stopped. The quick commands run by default;
those that train, build or serve a model are ``slow`` (about 5 minutes on 2 CPU cores).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = ("bash", "sh", "shell", "console")
COMMAND_STARTS = ("agentgym ", "python ", "make ", "torchrun ")


def documented_commands(path: Path) -> list[str]:
    """The command lines of ``path``'s fenced shell blocks, comments and ``$ `` prompts stripped, continuations
    joined."""
    found: list[str] = []
    fence: str | None = None
    block: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\s*```(\S*)", line)
        if match is None:
            if fence is not None:
                block.append(line)
            continue
        if fence is None:
            fence, block = match.group(1), []
            continue
        if fence in SHELL_FENCES:
            for command in "\n".join(block).replace("\\\n", " ").splitlines():
                command = command.split("  #", 1)[0].strip().removeprefix("$ ")
                if command.startswith(COMMAND_STARTS):
                    found.append(command)
        fence = None
    return found


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the test runs one documented command.

    Attributes:
        reduced: The command actually run when it differs from the documented one (``{port}`` is a free port).
        why: Why it is reduced (required with ``reduced``).
        stdin: Input for an interactive command.
        serves: The command is a server: probe this path until it answers, then stop it (SIGINT).
        slow: Runs only with the slow tests (training, building or serving a model).
        cwd_repo: Runs in the repository (a read-only check of its files) instead of the scratch directory.
    """

    reduced: str | None = None
    why: str = ""
    stdin: str | None = None
    serves: str | None = None
    slow: bool = False
    cwd_repo: bool = False


#: The reduced training run the train and quickstart commands stand for: the same recipe and model, minutes less.
SMALL = ("--set steps=1 --set bc_steps=200 --set bc_demos=200 --set tasks_per_step=4 --set group_size=2 "
         "--set eval_every=0 --set eval_tasks=8 --set checkpoint_every=0")
#: The quickstart recipe's full BC warm start (a model with a non-zero success rate) and one small GRPO step.
WARM_START_ONLY = ("--set steps=1 --set tasks_per_step=4 --set group_size=2 --set eval_every=0 --set eval_tasks=8 "
                   "--set checkpoint_every=0")
TRAIN_X = "agentgym train configs/quickstart_calc.yaml --set steps=50 --set mask_void_turns=true --output-dir runs/x"
SERVED_EVAL = "agentgym eval --suite games-calc --policy openai:http://127.0.0.1:8000/v1#model --temperature 0"
HF_EVAL = "agentgym eval --suite games-calc --policy hf:runs/quickstart/grpo/model --temperature 0"
#: Episodes of the two evaluations of the quickstart model that are compared (the split has 100; 30 keep it short).
COMPARED = 30

PLAN: dict[str, Plan] = {
    "make quickstart": Plan(
        reduced=f"agentgym train configs/quickstart_calc.yaml {WARM_START_ONLY}", slow=True,
        why="the full run takes minutes (and installs whatever is missing first); the same recipe with its whole BC warm start "
            "and one GRPO step writes the quickstart's model to runs/quickstart/grpo/model, which the eval and serve "
            "commands then use (it answers some questions right, so their success rates compare something)"),
    "make test": Plan(reduced="make -n test", why="it runs the whole suite, this test included: only its recipe "
                                                   "is checked (make -n)", cwd_repo=True),
    "agentgym train configs/quickstart_calc.yaml": Plan(
        reduced=f"agentgym train configs/quickstart_calc.yaml {SMALL} --output-dir runs/train-check", slow=True,
        why="the quickstart recipe at a smaller size, into its own folder (the model above stays as trained)"),
    TRAIN_X: Plan(
        reduced=f"agentgym train configs/quickstart_calc.yaml {SMALL} --set mask_void_turns=true --output-dir runs/x "
                "--set save_rollouts=1", slow=True,
        why="1 step instead of 50 (the flags are the documented ones); it keeps its rollouts, which the viewer "
            "commands below open as their training run"),
    "torchrun --nproc_per_node=2 -m agentgym.cli train configs/quickstart_calc.yaml": Plan(
        reduced=f"torchrun --nproc_per_node=2 -m agentgym.cli train configs/quickstart_calc.yaml {SMALL} "
                "--output-dir runs/ddp", slow=True, why="two processes, one small step"),
    "agentgym list": Plan(),
    "agentgym --version": Plan(),
    "agentgym play agentgym/GuessNumber-v0": Plan(stdin="guess(50)\n:q\n"),
    "agentgym eval --suite games-calc --policy reference --limit 50": Plan(),
    HF_EVAL: Plan(reduced=f"{HF_EVAL} --limit {COMPARED}", slow=True,
                  why=f"{COMPARED} of the 100 test tasks, the same ones the served eval runs"),
    "agentgym serve runs/quickstart/grpo/model --port 8000": Plan(
        reduced="agentgym serve runs/quickstart/grpo/model --port {port}", serves="/health", slow=True,
        why="a free port: 8000 may be taken on a shared machine"),
    SERVED_EVAL: Plan(reduced=SERVED_EVAL.replace("8000", "{port}") + f" --limit {COMPARED}", slow=True,
                      why="the port the serve command got; the same tasks as the in-process eval"),
    "agentgym eval --suite games-calc --policy openai:http://127.0.0.1:8000/v1#model": Plan(
        reduced="agentgym eval --suite games-calc --policy openai:http://127.0.0.1:{port}/v1#model --limit 4",
        slow=True, why="the port the serve command got; 4 tasks"),
    "agentgym serve-env agentgym/Maze-v0 --port 8001": Plan(
        reduced="agentgym serve-env agentgym/Maze-v0 --port {port}", serves="/health",
        why="a free port: 8001 may be taken on a shared machine"),
    "agentgym serve-env agentgym/Maze-v0 --port 8000 --max-sessions 64 --env-kwargs '{\"max_turns\": 30}'": Plan(
        reduced="agentgym serve-env agentgym/Maze-v0 --port {port} --max-sessions 64 --env-kwargs "
                "'{\"max_turns\": 30}'", serves="/health", why="a free port: 8000 may be taken on a shared machine"),
    "agentgym view runs/eval-.../trajectories.jsonl": Plan(
        reduced="agentgym view {eval_run}/trajectories.jsonl --limit 5",
        why="`...` stands for a run's folder: the reference eval's; 5 episodes"),
    "agentgym view runs/eval-games-calc-20261129-001500 --serve": Plan(
        reduced="agentgym view {eval_run} --serve --port {port}", serves="/",
        why="the folder of the reference eval run here; a free port instead of the default one"),
    "agentgym view runs/grpo-calc --serve --port 8800": Plan(
        reduced="agentgym view runs/x --serve --port {port}", serves="/", slow=True,
        why="runs/grpo-calc stands for a training run: the one written by the train command above; a free port"),
    "agentgym view runs/grpo-calc/rollouts/step-000010.jsonl": Plan(
        reduced="agentgym view {rollouts} --limit 2", slow=True,
        why="the saved rollouts of the train command above (one step, not ten); 2 episodes"),
    "agentgym view runs/grpo-calc --html grpo-calc.html": Plan(
        reduced="agentgym view runs/x --html grpo-calc.html", slow=True, why="the train command's run, as above"),
    "agentgym rescore runs/eval-.../trajectories.jsonl --rubric examples/calc_rubric.py:build --judge scripted-naive "
    "--out rescored.jsonl": Plan(
        reduced="agentgym rescore {eval_run}/trajectories.jsonl --rubric examples/calc_rubric.py:build "
                "--judge scripted-naive --out rescored.jsonl",
        why="`...` stands for a run's folder: the reference eval's"),
    "agentgym study --list": Plan(),
    "agentgym new-env NAME": Plan(reduced="agentgym new-env my_env", why="NAME stands for the env's name"),
    "agentgym tasks build swe": Plan(
        reduced="agentgym tasks build swe --help", slow=True,
        why="it rebuilds the shipped SWE task file from pinned library checkouts in sandboxes (an hour); its options "
            "are checked, and `tasks verify swe` is covered by the SWE tests"),
    "python benchmarks/rollout_throughput.py": Plan(reduced="python benchmarks/rollout_throughput.py --quick",
                                                     slow=True, why="its documented smoke size"),
    "python benchmarks/results_table.py": Plan(
        reduced="python benchmarks/results_table.py --check", cwd_repo=True,
        why="the plain form rewrites docs/benchmarks.md in the checkout; --check runs the same generation and "
            "fails when the file would change"),
    "python benchmarks/results_table.py --check": Plan(cwd_repo=True),
}


def all_commands() -> list[str]:
    seen: dict[str, None] = {}
    for path in DOCS:
        for command in documented_commands(path):
            seen.setdefault(command, None)
    return list(seen)


def test_every_documented_command_has_a_plan() -> None:
    commands = all_commands()
    assert len(commands) >= 15, commands
    missing = [c for c in commands if c not in PLAN]
    assert not missing, f"documented commands with no entry in PLAN (add one, reduced only with a reason): {missing}"
    for command, plan in PLAN.items():
        assert (plan.reduced is None) == (not plan.why), f"{command}: a reduced form needs its reason, and only it"
    stale = [c for c in PLAN if c not in commands]
    assert not stale, f"PLAN entries for commands the docs no longer hold: {stale}"


def test_the_extractor_reads_fences_prompts_comments_and_continuations(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("text `agentgym inline`\n```python\nagentgym no\n```\n```bash\n$ agentgym a --x 1   # why\n"
                    "python b.py \\\n  --y\nls\n```\n```text\nagentgym no\n```\n", encoding="utf-8")
    assert documented_commands(page) == ["agentgym a --x 1", "python b.py    --y"]


# ---- running them ---------------------------------------------------------------------------------------------
def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "agentgym":
        return [sys.executable, "-m", "agentgym.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *words[1:]]
    return words


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "NO_COLOR": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh directory that resolves the docs' relative paths as a checkout does."""
    import shutil

    root = tmp_path_factory.mktemp("copied")
    for name in ("configs", "examples"):
        (root / name).symlink_to(REPO / name)
    # A copy, not a link: a benchmark writes its figures beside its script, which must not rewrite the checkout's.
    shutil.copytree(REPO / "benchmarks", root / "benchmarks", ignore=shutil.ignore_patterns("results", "__pycache__"))
    return root


def _resolved(command: str, **values: object) -> str:
    plan = PLAN[command]
    text = plan.reduced or command
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def run_documented(command: str, cwd: Path, timeout: int = 900, **values: object) -> subprocess.CompletedProcess[str]:
    plan = PLAN[command]
    line = _resolved(command, **values)
    result = subprocess.run(_argv(line), cwd=REPO if plan.cwd_repo else cwd, input=plan.stdin or "",
                            capture_output=True, text=True, timeout=timeout, env=_env())
    assert result.returncode == 0, f"`{line}` (documented as `{command}`) failed:\n{result.stdout[-2000:]}\n" \
                                   f"{result.stderr[-4000:]}"
    return result


class Served:
    """A documented server command, started in the background and stopped with SIGINT (Ctrl-C)."""

    def __init__(self, command: str, cwd: Path, startup_s: float = 300.0, **values: object) -> None:
        self.port = _free_port()
        self.line = _resolved(command, port=self.port, **values)
        self.log = cwd / f"server-{self.port}.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(_argv(self.line), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                            env=_env())
        deadline = time.monotonic() + startup_s
        path = PLAN[command].serves
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"`{self.line}` exited with {self.process.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"`{self.line}` did not answer {path} in {startup_s:.0f} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for server in started:
        server.stop()


#: Commands that need another's output ({eval_run}, {rollouts}, a server's {port}) run in the tests of their chain.
QUICK = [c for c, p in PLAN.items() if not p.slow and p.serves is None and "{" not in (p.reduced or "")]


@pytest.mark.parametrize("command", QUICK)
def test_a_quick_documented_command_runs_as_planned(command: str, workspace: Path) -> None:
    result = run_documented(command, workspace)
    if command.startswith("agentgym eval"):
        assert "success rate" in result.stdout


@pytest.mark.parametrize("command", [c for c, p in PLAN.items() if p.serves and not p.slow
                                     and "{eval_run}" not in (p.reduced or "")])
def test_a_documented_env_server_starts_answers_and_stops(command: str, workspace: Path,
                                                         served: list[Served]) -> None:
    server = Served(command, workspace)
    served.append(server)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as response:
        assert response.status == 200
    server.stop()
    assert server.process.returncode is not None


def test_the_view_commands_open_an_eval_run(workspace: Path, served: list[Served]) -> None:
    run_documented("agentgym eval --suite games-calc --policy reference --limit 50", workspace)
    runs = sorted((workspace / "runs").glob("eval-games-calc-*"), key=lambda p: p.stat().st_mtime)
    eval_run = runs[-1].relative_to(workspace)
    printed = run_documented("agentgym view runs/eval-.../trajectories.jsonl", workspace, eval_run=eval_run)
    assert "games-calc" in printed.stdout or "Calculator" in printed.stdout, printed.stdout[:2000]
    server = Served("agentgym view runs/eval-games-calc-20261129-001500 --serve", workspace, eval_run=eval_run)
    served.append(server)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=10) as response:
        assert response.status == 200 and b"<html" in response.read(4096).lower()
    rescored = run_documented("agentgym rescore runs/eval-.../trajectories.jsonl --rubric examples/calc_rubric.py:build "
                              "--judge scripted-naive --out rescored.jsonl", workspace, eval_run=eval_run)
    summary = json.loads(rescored.stdout)
    assert summary["compared"] == 50 and summary["judge_errors"] == 0, summary


@pytest.mark.slow
def test_the_viewer_commands_open_a_training_run(workspace: Path, served: list[Served]) -> None:
    run_documented(TRAIN_X, workspace)
    rollouts = sorted((workspace / "runs/x/rollouts").glob("step-*.jsonl"))
    assert rollouts, "the train command saved no rollouts"
    run_documented("agentgym view runs/grpo-calc/rollouts/step-000010.jsonl", workspace,
                   rollouts=rollouts[0].relative_to(workspace))
    run_documented("agentgym view runs/grpo-calc --html grpo-calc.html", workspace)
    assert (workspace / "grpo-calc.html").stat().st_size > 0
    served.append(Served("agentgym view runs/grpo-calc --serve --port 8800", workspace))


def _new_run(workspace: Path, before: set[Path]) -> Path:
    after = set((workspace / "runs").glob("eval-*")) - before
    assert len(after) == 1, after
    return after.pop()


@pytest.mark.slow
def test_the_served_quickstart_model_scores_as_in_process(workspace: Path, served: list[Served]) -> None:
    """The README's chain as copied: train, evaluate in-process, serve, evaluate through the server. The served
    eval passes no prompt or token flags and must still prompt the model as it was trained: the same replies,
    the same success."""
    run_documented("make quickstart", workspace)
    assert json.loads((workspace / "runs/quickstart/grpo/model/agentgym.json").read_text())["max_tokens"] == 24
    before = set((workspace / "runs").glob("eval-*"))
    run_documented(HF_EVAL, workspace)
    in_process = _new_run(workspace, before)
    server = Served("agentgym serve runs/quickstart/grpo/model --port 8000", workspace)
    served.append(server)
    banner = server.output()
    assert "max tokens:     24 per turn" in banner and f"127.0.0.1:{server.port}/v1" in banner, banner
    before = set((workspace / "runs").glob("eval-*"))
    result = run_documented(SERVED_EVAL, workspace, port=server.port)
    through_server = _new_run(workspace, before)
    assert "using the server's defaults" in result.stderr and "max tokens 24" in result.stderr, result.stderr
    summaries = [json.loads((run / "summary.json").read_text()) for run in (in_process, through_server)]
    assert summaries[1]["end_reasons"].get("context_limit", 0) == 0, summaries[1]
    assert not any("context_limit" in w for w in summaries[1]["warnings"]), summaries[1]["warnings"]

    def episodes(run: Path) -> dict[str, tuple[list[str], bool]]:
        rows = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
        return {row["task_id"]: ([turn["action"] for turn in row["turns"]], bool(row["outcome"].get("success")))
                for row in rows}

    here, there = episodes(in_process), episodes(through_server)
    assert here.keys() == there.keys() and len(here) == COMPARED
    # Greedy replies are the same when the prompts are; batches padded differently may flip a near-tie token
    # (the last float bits of a logit), so one episode in the run may differ, and only it may score otherwise.
    differing = [k for k in here if here[k][0] != there[k][0]]
    assert len(differing) <= 1, f"{len(differing)}/{COMPARED} episodes replied otherwise through the server"
    assert all(here[k][1] == there[k][1] for k in here if k not in differing)
    assert abs(summaries[1]["success_rate"] - summaries[0]["success_rate"]) * COMPARED <= len(differing), summaries
    run_documented("agentgym eval --suite games-calc --policy openai:http://127.0.0.1:8000/v1#model", workspace,
                   port=server.port)


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, p in PLAN.items() if p.slow and p.serves is None
                                     and c not in ("make quickstart", HF_EVAL, SERVED_EVAL, TRAIN_X)
                                     and "{" not in (p.reduced or "") and "runs/x" not in (p.reduced or "")])
def test_a_slow_documented_command_runs_as_planned(command: str, workspace: Path) -> None:
    run_documented(command, workspace)
