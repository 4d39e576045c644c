"""Build and verify SWE tasks: inject a bug, keep it only if real tests catch it, write our own spec.

For each library: run its tests on the pristine tree (in the sandbox) to learn which pass; draw AST
mutations spread over its functions; run the tests of the mutated module's test files; keep a bug only if
1..``max_failing`` previously passing tests now fail and nothing fails to collect. Those tests become the
hidden FAIL_TO_PASS set, a sample of the still-passing ones PASS_TO_PASS, and the statement is written
from the first failing test's pytest output (never from the diff). The spec (library, version, file,
mutation, test ids, statement) is one JSON line; :func:`verify_tasks` rebuilds each repo state from the
cached sdist and checks the tests again.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.tasks.swe.libraries import (
    DEPS_MOUNT,
    LIBRARIES,
    Library,
    fetch_library,
    get_library,
    test_deps,
)
from agentgym.tasks.swe.mutations import Mutation, apply_mutation, candidate_mutations
from agentgym.tasks.swe.workspace import (
    PRISTINE,
    collect_results,
    run_tests_code,
    setup_code,
)

from agentgym.errors import TaskError

__all__ = ["DATA_FILE", "SweTaskSpec", "build_tasks", "load_specs", "sandbox_config_for", "statement_for",
           "test_files_for", "verify_tasks", "write_specs"]

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "swe_tasks.jsonl"
MAX_PASS_TO_PASS = 25
RUN_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class SweTaskSpec:
    """One task as stored in ``tasks/data/swe_tasks.jsonl`` (our own data: no library code in it)."""

    id: str
    library: str
    version: str
    sha256: str
    mutation: Mutation
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    hidden_tests: tuple[str, ...]
    visible_tests: tuple[str, ...]
    statement: str
    split: str
    extra: dict[str, Any] = field(default_factory=dict)
    visible_pass: tuple[str, ...] | None = None
    """Visible tests that pass on the buggy tree, measured at build time (None: not measured; graders then
    measure it themselves). Optional so that task files written before it existed still load."""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "library": self.library, "version": self.version, "sha256": self.sha256,
                "mutation": self.mutation.to_dict(), "fail_to_pass": list(self.fail_to_pass),
                "pass_to_pass": list(self.pass_to_pass), "hidden_tests": list(self.hidden_tests),
                "visible_tests": list(self.visible_tests), "statement": self.statement, "split": self.split,
                **({"extra": self.extra} if self.extra else {}),
                **({"visible_pass": list(self.visible_pass)} if self.visible_pass is not None else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweTaskSpec:
        return cls(id=data["id"], library=data["library"], version=data["version"], sha256=data["sha256"],
                   mutation=Mutation.from_dict(data["mutation"]), fail_to_pass=tuple(data["fail_to_pass"]),
                   pass_to_pass=tuple(data["pass_to_pass"]), hidden_tests=tuple(data["hidden_tests"]),
                   visible_tests=tuple(data.get("visible_tests", ())), statement=data["statement"],
                   split=data["split"], extra=dict(data.get("extra") or {}),
                   visible_pass=tuple(data["visible_pass"]) if data.get("visible_pass") is not None else None)

    def buggy_files(self, pristine: Path) -> dict[str, str]:
        """The files that differ from the pristine tree, with their buggy text."""
        source = (pristine / self.mutation.file).read_text(encoding="utf-8")
        return {self.mutation.file: apply_mutation(source, self.mutation)}


def load_specs(path: Path | str = DATA_FILE) -> list[SweTaskSpec]:
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"No SWE task file at {path}; build one with `agentgym tasks build swe`.")
    return [SweTaskSpec.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def sandbox_config_for(library: str, *, backend: str = "auto", **limits: Any) -> Any:
    """Sandbox settings for one library: its pristine tree and test-only dependencies mounted read-only."""
    from agentgym.tools.sandbox import SandboxConfig, SandboxLimits

    get_library(library)  # an unknown name fails here, with the list of known ones
    defaults = {"wall_timeout_s": 120.0, "cpu_timeout_s": 120.0, "memory_bytes": 2048 << 20,
                "workdir_bytes": 256 << 20, "file_size_bytes": 64 << 20, "pids": 128, "episode_cpu_s": 3600}
    image = "agentgym-sandbox:2"
    if backend == "docker":
        from agentgym.tasks.swe.images import ensure_library_image

        image = ensure_library_image(library)
    deps = test_deps(library)
    mounts = (((str(fetch_library(library)), PRISTINE),) if backend != "docker" else ()) \
        + (((str(deps), DEPS_MOUNT),) if deps is not None else ())
    return SandboxConfig(backend=backend, limits=SandboxLimits(**{**defaults, **limits}), preload=(),
                         mounts=mounts, docker_image=image, max_workers=16)


def test_files_for(lib: Library, pristine: Path, module_file: str) -> list[str]:
    """The test files that exercise ``module_file`` (by name), or all of them when none matches."""
    all_tests = sorted(str(p.relative_to(pristine)) for p in (pristine / lib.test_dir).glob("test_*.py")
                       if p.name not in lib.skip_tests)
    stem = Path(module_file).stem.lstrip("_")
    matching = [t for t in all_tests if stem and stem in Path(t).stem]
    return matching or all_tests


def _split_for(lib: str, file: str, function: str) -> str:
    digest = hashlib.sha1(f"{lib}:{file}:{function}".encode()).hexdigest()
    return "test" if int(digest, 16) % 5 == 0 else "train"


_ASSERTION_LINE = re.compile(r"^E\s+(.*)$", re.MULTILINE)
_FILE_LINE = re.compile(r"[\w./\\-]*\.py:\d+(?::\d+)?:?")


def _scrub(text: str, mutation: Mutation) -> str:
    """``text`` without source locations or the mutated file's and function's names (they point at the bug).

    What stays is the behaviour: the assertion, the values, the exception type and message.
    """
    text = _FILE_LINE.sub("<file>", text)
    path = mutation.file
    for name in (path, Path(path).name, path[:-3].replace("/", ".")):
        text = re.sub(rf"(?<![\w/.]){re.escape(name)}(?![\w])", "<module>", text)
    for name in {mutation.function, *_distinctive_names(mutation.function)}:
        text = re.sub(rf"(?<![\w]){re.escape(name)}(?![\w])", "<function>", text)
    return text


def _distinctive_names(function: str) -> list[str]:
    """The parts of a qualified function name that identify it (not dunders, not short common words)."""
    last = function.split(".")[-1]
    return [] if last.startswith("__") or len(last) < 4 else [last]


def statement_for(lib: Library, test_id: str, report: str, failing: int, mutation: Mutation) -> str:
    """A bug report that describes the symptom: the failing test's name and what it reported, scrubbed.

    Never the location: no ``file.py:123`` (not even a test file's, whose traceback line sits next to the
    call that breaks) and no name of the mutated file or function, so the agent has to debug to find it.
    """
    test_name = _scrub(test_id.split("::")[-1], mutation)
    detail = _scrub(report, mutation).strip() or "(no message)"
    return (f"A test of {lib.name} {lib.version} fails: `{test_name}`.\n\nWhat it reports:\n```\n" + detail[:2000]
            + f"\n```\n\n{failing} test(s) fail in total. Find the bug in the library's code (not in the tests) "
            "and fix it; the failing tests are hidden from you, but the other tests are available.")


def _statement(lib: Library, test_id: str, output: str, failing: int, mutation: Mutation) -> str:
    """A bug report written from what the failing test printed (its ``E`` lines)."""
    errors = [line for line in _ASSERTION_LINE.findall(output) if line.strip()][:12]
    return statement_for(lib, test_id, "\n".join(errors) if errors else output.strip()[-1200:], failing, mutation)


class _Runner:
    """Runs test selections for one library in fresh sandbox sessions (one per run)."""

    def __init__(self, library: str, backend: str = "auto") -> None:
        from agentgym.tools.sandbox import SandboxPool

        self.lib = get_library(library)
        self.pristine = fetch_library(library)
        self.pool = SandboxPool(sandbox_config_for(library, backend=backend))

    def run(self, files: dict[str, str], hidden: Sequence[str], test_args: Sequence[str], *,
            restore_tests: bool = False) -> tuple[str, dict[str, str]]:
        with self.pool.session() as session:
            setup = session.run(setup_code(self.lib, files, hidden), max_output=1 << 20, timeout_s=60)
            if not setup.ok:
                raise TaskError(f"sandbox setup failed for {self.lib.name}: {setup.stderr[-500:]}")
            result = session.run(run_tests_code(self.lib, test_args, timeout_s=RUN_TIMEOUT_S,
                                                restore_tests=restore_tests),
                                 max_output=4 << 20, timeout_s=RUN_TIMEOUT_S + 30)
        output, data = collect_results(result.stdout)
        return output, dict(data.get("outcomes") or {})

    def close(self) -> None:
        self.pool.close()


def build_tasks(libraries: Iterable[str] = tuple(LIBRARIES), *, per_library: int = 45, seed: int = 0,
                max_candidates: int = 220, max_failing: int = 25, max_per_function: int = 2, workers: int = 2,
                progress_file: Path | str | None = None,
                log: Callable[[str], None] = print) -> list[SweTaskSpec]:
    """Generate validated tasks (see the module docstring). Deterministic for a given seed and machine.

    A build takes about an hour on two cores, so every accepted task is appended to ``progress_file``
    at once; a rerun with the same file resumes, keeping what was accepted and skipping those candidates.
    """
    specs: list[SweTaskSpec] = []
    progress = Path(progress_file) if progress_file else None
    previous = load_specs(progress) if progress is not None and progress.is_file() else []
    for name in libraries:
        runner = _Runner(name)
        lib, pristine = runner.lib, runner.pristine
        try:
            all_tests = test_files_for(lib, pristine, "")
            _, base = runner.run({}, [], all_tests)
            passing = {t for t, o in base.items() if o == "passed"}
            if not passing:
                raise TaskError(f"no test of {lib.key} passes in the sandbox; check its test dependencies.")
            log(f"{lib.key}: {len(passing)} of {len(base)} tests pass on the pristine tree")
            rng = random.Random(f"{seed}/{lib.key}")
            by_function: dict[tuple[str, str], list[Mutation]] = defaultdict(list)
            for module in sorted((pristine / lib.package_dir).glob("*.py")):
                if module.name in lib.skip_modules:
                    continue
                rel = str(module.relative_to(pristine))
                for m in candidate_mutations(module.read_text(encoding="utf-8"), rel, rng):
                    by_function[(m.file, m.function)].append(m)
            # Round-robin over functions so bugs spread across the library instead of piling up in one.
            keys = sorted(by_function)
            rng.shuffle(keys)
            queue: list[Mutation] = []
            depth = 0
            while len(queue) < max_candidates and any(len(v) > depth for v in by_function.values()):
                queue.extend(by_function[k][depth] for k in keys if len(by_function[k]) > depth)
                depth += 1
            queue = queue[:max_candidates]
            accepted: list[SweTaskSpec] = [p for p in previous if p.library == lib.name][:per_library]
            per_function: dict[tuple[str, str], int] = defaultdict(int)
            for spec in accepted:
                per_function[(spec.mutation.file, spec.mutation.function)] += 1
            tried = {json.dumps(spec.mutation.to_dict(), sort_keys=True) for spec in accepted}
            queue = [m for m in queue if json.dumps(m.to_dict(), sort_keys=True) not in tried]
            lock = threading.Lock()

            def try_one(m: Mutation) -> None:
                with lock:
                    if len(accepted) >= per_library or per_function[(m.file, m.function)] >= max_per_function:
                        return
                spec = _validate_candidate(runner, m, passing, max_failing)
                if spec is None:
                    return
                with lock:
                    if len(accepted) < per_library and per_function[(m.file, m.function)] < max_per_function:
                        per_function[(m.file, m.function)] += 1
                        accepted.append(spec)
                        if progress is not None:
                            with progress.open("a", encoding="utf-8") as fh:
                                fh.write(json.dumps(spec.to_dict(), sort_keys=True) + "\n")
                        log(f"  {spec.id}: {m.kind} in {m.function} -> {len(spec.fail_to_pass)} failing")

            with ThreadPoolExecutor(workers) as executor:
                list(executor.map(try_one, queue))
            specs.extend(sorted(accepted, key=lambda s: s.id))
            log(f"{lib.key}: {len(accepted)} tasks from {len(queue)} candidates")
        finally:
            runner.close()
    return specs


def _validate_candidate(runner: _Runner, m: Mutation, passing: set[str], max_failing: int) -> SweTaskSpec | None:
    lib, pristine = runner.lib, runner.pristine
    try:
        source = (pristine / m.file).read_text(encoding="utf-8")
        buggy = apply_mutation(source, m)
        compile(buggy, m.file, "exec")
    except (TaskError, SyntaxError, ValueError):
        return None
    files = test_files_for(lib, pristine, m.file)
    _, outcomes = runner.run({m.file: buggy}, [], files)
    if not outcomes or any(o == "error" and "::" not in t for t, o in outcomes.items()):
        return None  # collection broke: an import-time crash is not an interesting bug
    failing = sorted(t for t, o in outcomes.items() if o in ("failed", "error") and t in passing)
    if not 1 <= len(failing) <= max_failing:
        return None
    still = sorted(t for t, o in outcomes.items() if o == "passed" and t in passing)
    p2p = random.Random(m.original + m.replacement).sample(still, min(MAX_PASS_TO_PASS, len(still)))
    hidden = sorted({t.split("::")[0] for t in failing})
    output, _ = runner.run({m.file: buggy}, [], [failing[0]])
    visible = [f for f in test_files_for(lib, pristine, "") if f not in hidden]
    _, seen = runner.run({m.file: buggy}, hidden, visible) if visible else ("", {})
    digest = hashlib.sha1(json.dumps(m.to_dict(), sort_keys=True).encode()).hexdigest()[:10]
    return SweTaskSpec(id=f"{lib.name}-{digest}", library=lib.name, version=lib.version, sha256=lib.sha256,
                       mutation=m, fail_to_pass=tuple(failing), pass_to_pass=tuple(sorted(p2p)),
                       hidden_tests=tuple(hidden), visible_tests=tuple(visible),
                       visible_pass=tuple(sorted(t for t, o in seen.items() if o == "passed")),
                       statement=_statement(lib, failing[0], output, len(failing), m),
                       split=_split_for(lib.name, m.file, m.function))


def verify_tasks(specs: Sequence[SweTaskSpec], *, log: Callable[[str], None] = print) -> list[tuple[str, str]]:
    """Rebuild each task from the cached sdist: F2P must fail on the buggy tree and pass on the pristine one."""
    problems: list[tuple[str, str]] = []
    by_library: dict[str, list[SweTaskSpec]] = defaultdict(list)
    for spec in specs:
        by_library[spec.library].append(spec)
    for name, group in by_library.items():
        runner = _Runner(name)
        try:
            for spec in group:
                if spec.version != runner.lib.version or spec.sha256 != runner.lib.sha256:
                    problems.append((spec.id, f"pinned {runner.lib.key}, task wants {spec.version}"))
                    continue
                ids = [*spec.fail_to_pass, *spec.pass_to_pass]
                _, buggy = runner.run(spec.buggy_files(runner.pristine), [], ids)
                _, clean = runner.run({}, [], ids)
                if any(buggy.get(t) == "passed" for t in spec.fail_to_pass):
                    problems.append((spec.id, "a FAIL_TO_PASS test passes on the buggy tree"))
                elif any(clean.get(t) != "passed" for t in ids):
                    problems.append((spec.id, "a test fails on the pristine tree"))
                elif any(buggy.get(t) != "passed" for t in spec.pass_to_pass):
                    problems.append((spec.id, "a PASS_TO_PASS test fails on the buggy tree"))
                else:
                    log(f"  {spec.id}: ok")
        finally:
            runner.close()
    return problems


def write_specs(specs: Sequence[SweTaskSpec], path: Path | str = DATA_FILE) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s.to_dict(), sort_keys=True) + "\n" for s in specs), encoding="utf-8")
    return path
