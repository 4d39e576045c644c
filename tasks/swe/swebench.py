"""SWE-bench-format instances brought by the user: a JSONL of instances plus local clones of their repositories.

Each line holds the SWE-bench fields ``instance_id``, ``repo`` (``owner/name``), ``base_commit``, ``patch`` (the gold
fix), ``test_patch`` (the tests that check it), ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (pytest node ids, as a JSON list
or as the JSON *string* of one, as in the published dataset) and ``problem_statement``; other fields are ignored.
The repositories come from a local directory, one git clone per repo, named ``owner__name``, ``owner/name`` or
``name``. Nothing is downloaded: the repo is read at ``base_commit`` from the clone.

An instance becomes a task of ``agentgym/SWE-v1``: the agent gets the tree at ``base_commit`` (no ``test_patch``),
and the submission is graded by the same clean-sandbox grader as every SWE task
(:func:`agentgym.tasks.swe.workspace.grade_code`): its pristine tree is ``base_commit`` plus ``test_patch``, only
``.py`` modules under the package directory are taken from the agent's patch, every test file (``test_patch``'s, the
FAIL_TO_PASS/PASS_TO_PASS files, any test-named module inside the package) and every setting comes from the
pristine tree, FAIL_TO_PASS must pass and PASS_TO_PASS must keep passing.

Where the package lives is inferred from the gold patch (``pkg/...`` or ``src/pkg/...``) unless the record or the
suite names it (``package_dir``, ``test_dir``, ``python_path``). The tests run with agentgym's own Python (the one
with pytest), inside the sandbox, so a repo's third-party dependencies must be importable there.

A suite file points at the data::

    name: my-swebench
    version: 1
    env: agentgym/SWE-v1
    source: swebench
    path: instances.jsonl          # relative to the suite file
    repos: repos                   # holds owner__name/ clones
    layouts:                       # optional, per repo
      owner/name: {package_dir: src/pkg, python_path: src}
    splits:                        # optional; default: every instance in "test"
      test: {repos: [owner/name]}  # or {ids: [...]} or {fraction: 0.2} (a stable hash of the id)
      train: {rest: true}          # everything no other split took
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentgym.errors import TaskError, did_you_mean
from agentgym.suite import Task, TaskSuite
from agentgym.tasks.swe.test_ids import id_kind, needs_test_files
from agentgym.tasks.swe.workspace import RepoLayout, tree_payload

__all__ = ["REQUIRED_FIELDS", "PreparedInstance", "SweBenchInstance", "installed_module_copies", "instance_to_task",
           "load_instances", "parse_patch_paths", "sandbox_config", "swebench_suite", "suite_source"]

REQUIRED_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                   "problem_statement")
LAYOUT_FIELDS = ("package_dir", "test_dir", "python_path")
CACHE_VERSION = "v1"
_TEST_DIR_NAMES = {"tests", "test", "testing"}
_BLOCKED = {"conftest.py", "sitecustomize.py", "usercustomize.py"}
_SPLIT_RULES = ("repos", "ids", "fraction", "rest")
_REPO_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")


def _git_env() -> dict[str, str]:
    """Git on the host, with no user or system configuration (a user's hooks or aliases must not run)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}


def _git(repo: Path | str, *args: str, env: Mapping[str, str] | None = None,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", *args], cwd=str(repo),
                          env={**_git_env(), **(env or {})}, capture_output=True, text=True, input=stdin,
                          timeout=300, check=False)


def parse_patch_paths(patch: str) -> dict[str, str]:
    """The files a unified git diff touches: ``{path: "added" | "deleted" | "modified"}`` (renames: both paths)."""
    found: dict[str, str] = {}
    old = new = None
    status = "modified"

    def flush() -> None:
        if old is None and new is None:
            return
        if status == "renamed":
            found[old] = "deleted"  # type: ignore[index]
            found[new] = "added"  # type: ignore[index]
        elif status == "added" or old is None:
            found[new] = "added"  # type: ignore[index]
        elif status == "deleted" or new is None:
            found[old] = "deleted"
        else:
            found[new] = "modified"

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            flush()
            match = re.match(r"^diff --git a/(.+) b/(.+)$", line)
            old, new = (match.group(1), match.group(2)) if match else (None, None)
            status = "modified"
        elif line.startswith("new file mode"):
            status = "added"
        elif line.startswith("deleted file mode"):
            status = "deleted"
        elif line.startswith("rename from "):
            status, old = "renamed", line[len("rename from "):]
        elif line.startswith("rename to "):
            new = line[len("rename to "):]
        elif line.startswith("--- ") and status == "modified":
            value = line[4:].split("\t")[0]
            old = None if value == "/dev/null" else value[2:] if value.startswith("a/") else old
        elif line.startswith("+++ ") and status == "modified":
            value = line[4:].split("\t")[0]
            new = None if value == "/dev/null" else value[2:] if value.startswith("b/") else new
    flush()
    return {path: kind for path, kind in found.items() if path}


def _is_test_path(rel: str) -> bool:
    """Test modules by the usual conventions: in a tests/test/testing folder, or named test_*.py / *_test.py."""
    parts = rel.split("/")
    name = parts[-1]
    return (any(p in _TEST_DIR_NAMES for p in parts[:-1]) or name in _BLOCKED
            or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))))


@dataclass(frozen=True)
class SweBenchInstance:
    """One validated SWE-bench-format instance, bound to a local clone of its repository.

    Attributes:
        instance_id: The task id.
        repo: ``owner/name``.
        repo_path: Absolute path of the local clone.
        base_commit: The full commit id the agent starts from.
        patch: The gold fix (what the reference solver applies).
        test_patch: Tests added or changed to check the fix; applied only when grading.
        fail_to_pass: Pytest node ids that fail at ``base_commit`` and must pass after the fix.
        pass_to_pass: Pytest node ids that must keep passing.
        problem_statement: What the agent is told.
        layout: Where the package and tests live (what the grader takes from a patch).
    """

    instance_id: str
    repo: str
    repo_path: str
    base_commit: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    problem_statement: str
    layout: RepoLayout
    extra: dict[str, Any] = field(default_factory=dict)

    # What the SWE env reads of a task spec (SweTaskSpec has the same names).
    @property
    def id(self) -> str:
        return self.instance_id

    @property
    def statement(self) -> str:
        return self.problem_statement

    @property
    def visible_tests(self) -> tuple[str, ...]:
        """What ``run_tests`` runs by default: the test directory as the agent's tree has it."""
        return (self.layout.test_dir,)

    @property
    def visible_pass(self) -> tuple[str, ...]:
        """SWE-bench guards PASS_TO_PASS only: no other visible test is measured or guarded."""
        return ()

    @property
    def test_args(self) -> tuple[str, ...]:
        """What the grader hands pytest: the node ids, plus the test modules ``test_patch`` touches when an id is a
        Django id or a bare name (SWE-bench's own harness runs those same files for such repositories)."""
        args = [t for t in (*self.fail_to_pass, *self.pass_to_pass) if not needs_test_files(t)]
        if len(args) < len(self.fail_to_pass) + len(self.pass_to_pass):
            args += [p for p in _patch_test_files(parse_patch_paths(self.test_patch)) if p not in args]
        return tuple(args)

    @property
    def version(self) -> str | None:
        """SWE-bench's ``version`` (the repository release the instance's environment is built for), if given."""
        value = self.extra.get("version")
        return str(value) if value is not None else None

    @property
    def environment_setup_commit(self) -> str | None:
        """SWE-bench's ``environment_setup_commit`` (whose requirements its environment installs), if given."""
        value = self.extra.get("environment_setup_commit")
        return value if isinstance(value, str) else None

    @property
    def hidden_tests(self) -> tuple[str, ...]:
        """Files the ``test_patch`` adds: absent from the agent's tree."""
        return tuple(sorted(p for p, k in parse_patch_paths(self.test_patch).items() if k == "added"))

    def to_metadata(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "repo": self.repo, "repo_path": self.repo_path,
                "base_commit": self.base_commit, "patch": self.patch, "test_patch": self.test_patch,
                "FAIL_TO_PASS": list(self.fail_to_pass), "PASS_TO_PASS": list(self.pass_to_pass),
                "problem_statement": self.problem_statement,
                "layout": {"package_dir": self.layout.package_dir, "test_dir": self.layout.test_dir,
                           "python_path": self.layout.python_path}, **self.extra}

    @classmethod
    def from_metadata(cls, data: Mapping[str, Any]) -> SweBenchInstance:
        """Rebuild from :meth:`to_metadata` (a task's ``metadata["swebench"]``), validating it again."""
        record = {k: v for k, v in data.items() if k not in ("repo_path", "layout")}
        layout = data.get("layout") or {}
        if not isinstance(layout, Mapping):
            raise TaskError("metadata['swebench']['layout'] must be a mapping (package_dir, test_dir, python_path).")
        if not isinstance(data.get("repo_path"), str):
            raise TaskError("metadata['swebench'] needs repo_path (the local clone); build tasks with "
                            "agentgym.tasks.swe.swebench.instance_to_task.")
        return _validate(dict(record, **{k: v for k, v in layout.items() if k in LAYOUT_FIELDS}), Path("."),
                         where=f"SWE-bench task {data.get('instance_id')!r}", defaults={},
                         repo_path=Path(data["repo_path"]))

    def prepare(self) -> PreparedInstance:
        """The trees at ``base_commit`` and with ``test_patch`` applied, extracted once into the cache."""
        return _prepare(self)


@dataclass(frozen=True)
class PreparedInstance:
    """An instance's trees on disk (cache entries, never modified once built).

    Attributes:
        base: The repository at ``base_commit``: the agent's starting tree.
        tested: ``base`` with ``test_patch`` applied: the grader's pristine tree.
        protected: Test files the grader always takes from ``tested``, wherever they live.
    """

    instance: SweBenchInstance
    base: Path
    tested: Path
    protected: tuple[str, ...]

    def agent_tree(self) -> dict[str, str]:
        return tree_payload(self.base)

    def grading_tree(self) -> dict[str, str]:
        return tree_payload(self.tested)

    def baseline_files(self) -> dict[str, str]:
        """The ``base_commit`` text of files the ``test_patch`` modifies (the agent's view of them)."""
        files = {}
        for rel, kind in parse_patch_paths(self.instance.test_patch).items():
            if kind == "modified":
                try:
                    files[rel] = (self.base / rel).read_text(encoding="utf-8")
                except UnicodeDecodeError as exc:
                    raise TaskError(f"{self.instance.instance_id}: test_patch changes the binary file {rel}; only "
                                    "text files can be changed by a test_patch here.") from exc
        return files


def _as_id_list(value: Any, name: str, where: str) -> tuple[str, ...]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list, or as the JSON string of one (the published dataset's form)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: {name} is a string but not JSON ({exc.msg}); give a list of pytest node ids "
                            'or its JSON text, e.g. ["tests/test_x.py::test_y"].') from exc
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise TaskError(f"{where}: {name} must be a list of pytest node ids (strings), got {value!r:.200}.")
    for test_id in value:
        if id_kind(test_id) is None:
            raise TaskError(f"{where}: {name} entry {test_id!r} is not a test id SWE-bench uses: a pytest node id "
                            "(tests/test_x.py::TestA::test_b[param]), a Django id ('test_b (app.tests.TestA)') or a "
                            "bare test name ('test_b').")
    return tuple(value)


def _patch_test_files(paths: Mapping[str, str]) -> list[str]:
    """Test modules a test_patch adds or changes, sorted."""
    return sorted(p for p, kind in paths.items() if kind != "deleted" and p.endswith(".py") and _is_test_path(p)
                  and p.rsplit("/", 1)[-1] not in _BLOCKED)


def _find_repo(repos: Path, repo: str, where: str) -> Path:
    owner, _, name = repo.partition("/")
    candidates = [repos / f"{owner}__{name}", repos / owner / name, repos / name] if name else [repos / repo]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    present = sorted(p.name for p in repos.iterdir() if p.is_dir()) if repos.is_dir() else []
    raise TaskError(f"{where}: no local clone of {repo!r} in {repos}; looked for "
                    f"{', '.join(str(c.relative_to(repos)) for c in candidates)}."
                    f"{did_you_mean(candidates[0].name, present)} Clone it there (git clone ... {candidates[0]}); "
                    "nothing is downloaded at run time.")


@functools.lru_cache(maxsize=4096)
def _resolve_commit(repo_path: str, commit: str) -> str | None:
    found = _git(repo_path, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    return found.stdout.strip() if found.returncode == 0 else None


def _infer_layout(patch_paths: Iterable[str], test_paths: Iterable[str], given: Mapping[str, Any],
                  where: str) -> RepoLayout:
    source = sorted(p for p in patch_paths if p.endswith(".py") and not _is_test_path(p))
    package_dir, python_path = given.get("package_dir"), given.get("python_path")
    if package_dir is None:
        tops = set()
        for rel in source:
            parts = rel.split("/")
            if len(parts) > 2 and parts[0] == "src":
                tops.add("src/" + parts[1])
            elif len(parts) > 1:
                tops.add(parts[0])
            else:
                tops.add("")
        if len(tops) != 1 or "" in tops:
            raise TaskError(f"{where}: cannot tell the package directory from the gold patch (it changes "
                            f"{source or 'no .py module'}); set package_dir (e.g. 'src/pkg') for this repo in the "
                            "suite's layouts or in the record.")
        package_dir = tops.pop()
        if python_path is None:
            python_path = "src" if package_dir.startswith("src/") else "."
    test_dir = given.get("test_dir")
    if test_dir is None:
        folders = [posixpath.dirname(p) for p in test_paths if posixpath.dirname(p)]
        test_dir = posixpath.commonpath(folders) if folders else "tests"
        if not test_dir or package_dir == test_dir or package_dir.startswith(test_dir + "/"):
            test_dir = "tests"
    for label, value in (("package_dir", package_dir), ("test_dir", test_dir), ("python_path", python_path or ".")):
        if not isinstance(value, str) or not value or value.startswith("/") or ".." in value.split("/"):
            raise TaskError(f"{where}: {label} must be a relative path inside the repository, got {value!r}.")
    package_dir, test_dir = package_dir.strip("/"), test_dir.strip("/")
    if package_dir == test_dir or package_dir.startswith(test_dir + "/"):
        raise TaskError(f"{where}: test_dir {test_dir!r} contains package_dir {package_dir!r}, so nothing could be "
                        "graded; name the tests' own folder as test_dir.")
    return RepoLayout(key="", package_dir=package_dir, test_dir=test_dir, python_path=python_path or ".")


def _validate(record: Mapping[str, Any], repos: Path, *, where: str, defaults: Mapping[str, Any],
              repo_path: Path | None = None) -> SweBenchInstance:
    if not isinstance(record, Mapping):
        raise TaskError(f"{where}: an instance must be a JSON object with {', '.join(REQUIRED_FIELDS)}.")
    missing = [k for k in REQUIRED_FIELDS if k not in record]
    if missing:
        raise TaskError(f"{where}: missing field(s) {missing}; a SWE-bench instance needs "
                        f"{', '.join(REQUIRED_FIELDS)}.")
    for key in ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise TaskError(f"{where}: {key} must be a non-empty string, got {record[key]!r:.100}.")
    where = f"{where} ({record['instance_id']})"
    repo = record["repo"].strip()
    if not _REPO_NAME.match(repo):
        raise TaskError(f"{where}: repo must look like 'owner/name', got {repo!r}.")
    f2p = _as_id_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = _as_id_list(record["PASS_TO_PASS"], "PASS_TO_PASS", where)
    if not f2p:
        raise TaskError(f"{where}: FAIL_TO_PASS is empty; an instance needs at least one test the fix makes pass.")
    if set(f2p) & set(p2p):
        raise TaskError(f"{where}: {sorted(set(f2p) & set(p2p))[:3]} are in both FAIL_TO_PASS and PASS_TO_PASS.")
    gold, tests = parse_patch_paths(record["patch"]), parse_patch_paths(record["test_patch"])
    if not gold:
        raise TaskError(f"{where}: patch is not a git diff (no 'diff --git' header); give the gold fix as "
                        "`git diff` prints it.")
    if not tests:
        raise TaskError(f"{where}: test_patch is not a git diff (no 'diff --git' header).")
    if any(kind == "deleted" for kind in tests.values()):
        raise TaskError(f"{where}: test_patch deletes {[p for p, k in tests.items() if k == 'deleted']}; the grader "
                        "can only add or change test files.")
    given = {**defaults, **{k: record[k] for k in LAYOUT_FIELDS if k in record}}
    layout = _infer_layout(gold, tests, given, where)
    test_files = {t.split("::")[0] for t in (*f2p, *p2p) if "::" in t}
    unplaced = [t for t in (*f2p, *p2p) if needs_test_files(t)]
    if unplaced and not _patch_test_files(tests):
        raise TaskError(f"{where}: {unplaced[0]!r} names no test file and test_patch changes no test module to run it "
                        "from; give pytest node ids (file.py::test_name) or a test_patch that touches the tests.")
    protected = set(tests) | test_files
    for rel in gold:
        ok = (rel.startswith(layout.package_dir + "/") and rel.endswith(".py") and not _is_test_path(rel)
              and rel not in protected and not rel.startswith(layout.test_dir + "/"))
        if not ok:
            raise TaskError(f"{where}: the gold patch changes {rel}, which the grader never takes from a patch (only "
                            f".py modules under package_dir {layout.package_dir!r}, not tests); fix package_dir or "
                            "drop the instance.")
    path = repo_path if repo_path is not None else _find_repo(repos, repo, where)
    if not (path / ".git").exists() or _git(path, "rev-parse", "--git-dir").returncode != 0:
        raise TaskError(f"{where}: {path} is not a git repository; the repos folder must hold git clones.")
    commit = _resolve_commit(str(path), record["base_commit"].strip())
    if commit is None:
        raise TaskError(f"{where}: base_commit {record['base_commit']!r} is not a commit of {path}; fetch it into the "
                        "clone (git fetch origin COMMIT) or fix the instance.")
    layout = replace(layout, key=f"{repo}@{commit[:12]}")
    extra = {k: v for k, v in record.items() if k not in (*REQUIRED_FIELDS, *LAYOUT_FIELDS, "repo_path")
             and isinstance(v, (str, int, float, bool))}
    setup_commit = extra.get("environment_setup_commit")
    if isinstance(setup_commit, str) and setup_commit.strip():
        # SWE-bench builds an instance's environment from this commit's requirements; here it must at least be
        # a commit of the clone, so a record for another fork of the repository is caught at load.
        resolved = _resolve_commit(str(path), setup_commit.strip())
        if resolved is None:
            raise TaskError(f"{where}: environment_setup_commit {setup_commit!r} is not a commit of {path}; fetch it "
                            "into the clone (git fetch origin COMMIT) or drop the field.")
        extra["environment_setup_commit"] = resolved
    return SweBenchInstance(instance_id=record["instance_id"].strip(), repo=repo, repo_path=str(path),
                            base_commit=commit, patch=record["patch"], test_patch=record["test_patch"],
                            fail_to_pass=f2p, pass_to_pass=p2p, problem_statement=record["problem_statement"],
                            layout=layout, extra=extra)


def load_instances(path: Path | str, repos: Path | str, *,
                   layouts: Mapping[str, Mapping[str, Any]] | None = None) -> list[SweBenchInstance]:
    """Read and validate every instance of a SWE-bench-format JSONL file against local clones in ``repos``.

    Args:
        path: The JSONL file (one instance per line; blank lines skipped).
        repos: Folder of git clones, one per repo: ``owner__name``, ``owner/name`` or ``name``.
        layouts: Optional ``{repo: {package_dir, test_dir, python_path}}`` overriding what is inferred.
    """
    path, repos = Path(path), Path(repos)
    if not path.is_file():
        raise TaskError(f"SWE-bench instance file {path} does not exist.")
    if not repos.is_dir():
        raise TaskError(f"The repos folder {repos} does not exist; it must hold a git clone of each instance's repo.")
    layouts = dict(layouts or {})
    for repo, layout in layouts.items():
        unknown = set(layout or {}) - set(LAYOUT_FIELDS)
        if unknown:
            raise TaskError(f"layouts[{repo!r}] has unknown key(s) {sorted(unknown)}; use {', '.join(LAYOUT_FIELDS)}.")
    instances: list[SweBenchInstance] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{where}: not valid JSON ({exc.msg}); each line must be one instance object.") from exc
            repo = record.get("repo") if isinstance(record, dict) else None
            instance = _validate(record, repos, where=where, defaults=layouts.get(repo, {}) if repo else {})
            if instance.instance_id in seen:
                raise TaskError(f"{where}: instance_id {instance.instance_id!r} appears twice.")
            seen.add(instance.instance_id)
            instances.append(instance)
    unused = set(layouts) - {i.repo for i in instances}
    if unused:
        raise TaskError(f"layouts name repo(s) {sorted(unused)} that no instance uses; check the spelling "
                        "(owner/name).")
    return instances


def instance_to_task(instance: SweBenchInstance) -> Task:
    """A task of ``agentgym/SWE-v1`` (the env recognises ``metadata["swebench"]``)."""
    return Task(id=instance.instance_id, prompt=instance.problem_statement, answer=None,
                metadata={"swebench": instance.to_metadata(), "repo": instance.repo})


def _fraction_of(instance_id: str) -> float:
    return int(hashlib.sha1(instance_id.encode()).hexdigest()[:8], 16) / 0x100000000


def _split(instances: Sequence[SweBenchInstance], rules: Mapping[str, Any] | None,
           where: str) -> dict[str, tuple[Task, ...]]:
    """Apply the split rules (see the module docstring) in order; ``rest`` takes what is left at the end."""
    if not rules:
        return {"test": tuple(instance_to_task(i) for i in instances)}
    if not isinstance(rules, Mapping):
        raise TaskError(f"{where}: splits must map a split name to a rule ({{repos: [...]}}, {{ids: [...]}}, "
                        "{fraction: 0.2} or {rest: true}).")
    taken: dict[str, str] = {}
    chosen: dict[str, list[SweBenchInstance]] = {name: [] for name in rules}
    rest = [name for name, rule in rules.items() if isinstance(rule, Mapping) and rule.get("rest")]
    if len(rest) > 1:
        raise TaskError(f"{where}: only one split may take the rest, got {rest}.")
    known_ids, known_repos = {i.instance_id for i in instances}, {i.repo for i in instances}
    for name, rule in rules.items():
        if not isinstance(rule, Mapping) or len(rule) != 1 or next(iter(rule)) not in _SPLIT_RULES:
            raise TaskError(f"{where}: split {name!r} needs exactly one rule of repos, ids, fraction or rest; "
                            f"got {rule!r}.")
        kind, value = next(iter(rule.items()))
        if kind == "rest":
            continue
        if kind in ("repos", "ids"):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TaskError(f"{where}: split {name!r}: {kind} must be a list of strings.")
            unknown = sorted(set(value) - (known_repos if kind == "repos" else known_ids))
            if unknown:
                pool = known_repos if kind == "repos" else known_ids
                raise TaskError(f"{where}: split {name!r} names {kind[:-1]}(s) {unknown[:5]} not in the instances."
                                f"{did_you_mean(unknown[0], pool)}")
            matches = [i for i in instances if (i.repo if kind == "repos" else i.instance_id) in value]
        else:
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise TaskError(f"{where}: split {name!r}: fraction must be in (0, 1], got {value!r}.")
            matches = [i for i in instances if _fraction_of(i.instance_id) < value]
        for instance in matches:
            if instance.instance_id in taken:
                if kind == "fraction":
                    continue
                raise TaskError(f"{where}: {instance.instance_id} is in both split {taken[instance.instance_id]!r} "
                                f"and {name!r}.")
            taken[instance.instance_id] = name
            chosen[name].append(instance)
    if rest:
        chosen[rest[0]] = [i for i in instances if i.instance_id not in taken]
    return {name: tuple(instance_to_task(i) for i in group) for name, group in chosen.items()}


def swebench_suite(path: Path | str, repos: Path | str, *, name: str | None = None, version: int = 1,
                   splits: Mapping[str, Any] | None = None, layouts: Mapping[str, Mapping[str, Any]] | None = None,
                   env_kwargs: Mapping[str, Any] | None = None, seed: int = 0) -> TaskSuite:
    """A suite of ``agentgym/SWE-v1`` tasks from a SWE-bench-format JSONL and local clones (the Python API)."""
    instances = load_instances(path, repos, layouts=layouts)
    return TaskSuite(name=name or Path(path).stem, version=version, env_id="agentgym/SWE-v1", seed=seed,
                     splits=_split(instances, splits, str(path)), env_kwargs=dict(env_kwargs or {}),
                     description=f"SWE-bench-format instances from {path}")


def suite_source(spec: Mapping[str, Any], base_dir: Path) -> dict[str, tuple[Task, ...]]:
    """The ``source: swebench`` loader of suite files: ``path``, ``repos``, ``layouts`` and ``splits`` keys."""
    unknown = set(spec) - {"path", "repos", "layouts", "splits"}
    if unknown:
        raise TaskError(f"A 'source: swebench' suite takes path, repos, layouts and splits; unknown: "
                        f"{sorted(unknown)}.")
    for key in ("path", "repos"):
        if not isinstance(spec.get(key), str):
            raise TaskError(f"A 'source: swebench' suite needs '{key}:' (relative to the suite file).")
    instances = load_instances(base_dir / spec["path"], base_dir / spec["repos"], layouts=spec.get("layouts"))
    return _split(instances, spec.get("splits"), str(base_dir / spec["path"]))


# ---- trees on disk ------------------------------------------------------------------------------------------------

def _checkout(instance: SweBenchInstance, target: Path) -> None:
    """The clone's tree at ``base_commit`` into ``target``, through a private index (the clone is left untouched)."""
    with tempfile.TemporaryDirectory(prefix="agentgym-index-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        for args in (("read-tree", instance.base_commit),
                     ("checkout-index", "-a", "-f", f"--prefix={target}/")):
            done = _git(instance.repo_path, *args, env=env)
            if done.returncode != 0:
                raise TaskError(f"{instance.instance_id}: git {args[0]} failed in {instance.repo_path}: "
                                f"{done.stderr.strip()[-300:]}")
    target.mkdir(exist_ok=True)


def _apply(instance: SweBenchInstance, tree: Path, patch: str, what: str, *, check_only: bool = False) -> None:
    """``git apply`` outside any repository (a ceiling at the tree's parent stops git from finding one above)."""
    args = ["apply", "--whitespace=nowarn", *(["--check"] if check_only else []), "-"]
    done = _git(tree, *args, env={"GIT_CEILING_DIRECTORIES": str(tree.parent)}, stdin=patch)
    if done.returncode != 0:
        raise TaskError(f"{instance.instance_id}: the {what} does not apply at base_commit "
                        f"{instance.base_commit[:12]}: {done.stderr.strip()[-400:]}")


def _prepare(instance: SweBenchInstance) -> PreparedInstance:
    from agentgym.utils import cache

    # A commit id names its whole tree, so the entry is shared by every clone (and every run) of the same instance.
    key = hashlib.sha256("\0".join([instance.base_commit, instance.test_patch, instance.patch]).encode()).hexdigest()[:24]
    entry = cache.cache_root() / "swebench" / CACHE_VERSION / key

    def build(tmp: Path) -> None:
        _checkout(instance, tmp / "base")
        _apply(instance, tmp / "base", instance.patch, "gold patch", check_only=True)
        shutil.copytree(tmp / "base", tmp / "tested", symlinks=True)
        _apply(instance, tmp / "tested", instance.test_patch, "test_patch")

    cache.build_once(entry, build)
    base, tested = entry / "base", entry / "tested"
    for test_id in (t for t in (*instance.fail_to_pass, *instance.pass_to_pass) if not needs_test_files(t)):
        test_file = test_id.split("::")[0]
        if not (tested / test_file).is_file():
            raise TaskError(f"{instance.instance_id}: test {test_id!r} names {test_file}, which is not in the repo at "
                            "base_commit with the test_patch applied.")
    layout = instance.layout
    protected = set(parse_patch_paths(instance.test_patch)) | {t.split("::")[0] for t in
                                                              (*instance.fail_to_pass, *instance.pass_to_pass)
                                                              if not needs_test_files(t)}
    package = tested / layout.package_dir
    if not package.is_dir():
        raise TaskError(f"{instance.instance_id}: package_dir {layout.package_dir!r} is not a folder of the repo at "
                        "base_commit; fix it in the suite's layouts.")
    protected |= {str(p.relative_to(tested)) for p in package.rglob("*.py")
                  if _is_test_path(str(p.relative_to(tested)))}
    return PreparedInstance(instance=instance, base=base, tested=tested, protected=tuple(sorted(protected)))


def sandbox_config(instance: SweBenchInstance, backend: str) -> Any:
    """Sandbox settings for an instance's episodes: no mounts (the tree is sent), the SWE limits, the base image.

    The work dir must hold the repository and its patches, so its size grows with the tree (to a power of two).
    """
    from agentgym.tasks.swe.images import BASE_IMAGE
    from agentgym.tools.sandbox import SandboxConfig, SandboxLimits

    prepared = instance.prepare()
    size = sum(p.stat().st_size for p in prepared.tested.rglob("*") if p.is_file() and not p.is_symlink())
    workdir = 256 << 20
    while workdir < 4 * size:
        workdir *= 2
    limits = SandboxLimits(wall_timeout_s=120.0, cpu_timeout_s=120.0, memory_bytes=max(2048 << 20, 2 * workdir),
                           workdir_bytes=workdir, file_size_bytes=64 << 20, pids=128, episode_cpu_s=3600)
    return SandboxConfig(backend=backend, limits=limits, preload=(), mounts=(), docker_image=BASE_IMAGE,
                         max_workers=16,
                         hidden_paths=installed_module_copies(posixpath.basename(instance.layout.package_dir)))


def installed_module_copies(name: str) -> tuple[str, ...]:
    """Where the host's Python has its own copy of the top-level module ``name`` (found without importing it).

    The host's site-packages are mounted read-only into every sandbox, so an installed copy of the package an
    agent must fix would hand it the upstream source; the sandbox shows these paths empty instead.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ()
    if spec is None:
        return ()
    if spec.submodule_search_locations:
        return tuple(sorted(os.path.realpath(p) for p in spec.submodule_search_locations))
    return (os.path.realpath(spec.origin),) if spec.origin and os.path.exists(spec.origin) else ()
