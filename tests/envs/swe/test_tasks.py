"""SWE task data without tells, and libraries declared by users.

The checks here read the shipped task file and the real library sources (pinned sdists, cached after one
download): a bug's diff must not show *how* it was made (re-quoted strings, re-flowed lines, a lone ``pass``,
``not x is y``), and a statement must describe the symptom, not the place.
"""

from __future__ import annotations

import ast
import collections
import difflib
import functools
import io
import json
import re
import textwrap
import tokenize
from pathlib import Path

import pytest
from agentgym.tasks.swe import libraries
from agentgym.tasks.swe.builder import (
    SweTaskSpec,
    build_tasks,
    load_specs,
    verify_tasks,
)
from agentgym.tasks.swe.libraries import (
    Library,
    fetch_library,
    get_library,
    library_from_dict,
)
from agentgym.tasks.swe.mutations import Mutation, apply_mutation, candidate_mutations

from agentgym.errors import ConfigError

_LAYOUT = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}


@functools.lru_cache(maxsize=32)  # each library file is the original of many tasks
def _tokens(text: str) -> list[tokenize.TokenInfo]:
    return [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.ENDMARKER]


def _gap(prev: tokenize.TokenInfo, tok: tokenize.TokenInfo) -> tuple[int, int]:
    """The whitespace between two tokens, as (line breaks, columns)."""
    lines = tok.start[0] - prev.end[0]
    return lines, tok.start[1] - (prev.end[1] if lines == 0 else 0)


def _around_the_change(before: list[tokenize.TokenInfo],
                       after: list[tokenize.TokenInfo]) -> tuple[list[tokenize.TokenInfo], list[tokenize.TokenInfo]]:
    """Both token lists cut to the differing middle plus one token of context (a whole-file diff is slow)."""
    head = 0
    while head < min(len(before), len(after)) and before[head][1:3] == after[head][1:3]:
        head += 1
    tail = 0
    while (tail < min(len(before), len(after)) - head - 1 and before[-1 - tail].string == after[-1 - tail].string
           and _gap(before[-2 - tail], before[-1 - tail]) == _gap(after[-2 - tail], after[-1 - tail])):
        tail += 1
    start = max(head - 1, 0)
    return before[start:len(before) - tail + 1], after[start:len(after) - tail + 1]


@functools.lru_cache(maxsize=32)  # each library file is the original of many tasks
def _bare_not_compares(source: str) -> int:
    """How many ``not a <op> b`` (no parentheses) the module has: ast.unparse writes them, people rarely do.
    (The text after each ``not`` is read from the node's line: ``ast.get_source_segment`` re-splits the whole
    file per call, which made this check most of the test's time.)"""
    lines = source.encode("utf-8").splitlines(keepends=True)
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Compare):
            after = b"".join(lines[node.lineno - 1:node.lineno + 1])[node.col_offset:].decode("utf-8", "replace")
            count += not re.match(r"not\s*\(", after)
    return count


def mutation_traces(original: str, buggy: str, mutation: Mutation) -> list[str]:
    """How a diff gives away that a tool made it; empty when only the mutated tokens differ."""
    found = set()
    if re.search(r"^\s*pass\s*$", mutation.replacement, re.MULTILINE):
        found.add("a lone `pass` where code was")
    before, after = _around_the_change(_tokens(original), _tokens(buggy))
    matcher = difflib.SequenceMatcher(None, [t.string for t in before], [t.string for t in after], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            if any(t.type == tokenize.COMMENT for t in before[i1:i2]) and mutation.kind != "remove_statement":
                found.add("a comment lost")
            continue
        for k in range(1, i2 - i1):
            pair_a, pair_b = (before[i1 + k - 1], before[i1 + k]), (after[j1 + k - 1], after[j1 + k])
            if {pair_a[0].type, pair_a[1].type} & _LAYOUT:
                continue
            if _gap(*pair_a) != _gap(*pair_b):
                found.add("re-flowed or re-spaced code")
    strings_before = collections.Counter(t.string for t in before if t.type == tokenize.STRING)
    strings_after = collections.Counter(t.string for t in after if t.type == tokenize.STRING)
    if strings_after - strings_before:
        found.add("re-quoted strings")
    if _bare_not_compares(buggy) > _bare_not_compares(original):
        found.add("`not x is y` (or another unparenthesised `not` before a comparison)")
    if mutation.kind == "remove_statement":
        for node in ast.walk(ast.parse(buggy)):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and all(
                    isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                    for s in body or ()) and ast.get_source_segment(buggy, node) not in original:
                found.add("a function left as a stub")
    return sorted(found)


def statement_tells(spec: SweTaskSpec) -> list[str]:
    """Where a statement points at the bug instead of describing it."""
    mutation = spec.mutation
    text = spec.statement.replace(f"A test of {spec.library} {spec.version} fails", "", 1)  # tabulate.tabulate
    found = []
    if re.search(r"[\w/.-]+\.py:\d+", text):
        found.append("a source location (file.py:line)")
    if re.search(rf"(?<![\w/.]){re.escape(mutation.file)}", text) or re.search(
            rf"(?<![\w/.]){re.escape(Path(mutation.file).name)}", text):
        found.append(f"the mutated file {mutation.file}")
    if re.search(rf"(?<!\w){re.escape(mutation.function)}(?!\w)", text):  # `test_naturalsize` is a test's name
        found.append(f"the mutated function {mutation.function}")
    last = mutation.function.split(".")[-1]
    if not last.startswith("__") and len(last) >= 4 and re.search(rf"(?<!\w){re.escape(last)}(?!\w)", text):
        found.append(f"the mutated function's name {last}")
    return found


@pytest.fixture(scope="module")
def specs() -> list[SweTaskSpec]:
    return load_specs()


def test_shipped_task_set_keeps_its_size_and_splits(specs: list[SweTaskSpec]) -> None:
    assert len(specs) >= 200
    assert {s.library for s in specs} == set(libraries.LIBRARIES)
    assert {s.split for s in specs} == {"train", "test"}
    assert len({s.id for s in specs}) == len(specs)


def test_no_shipped_bug_shows_how_it_was_made(specs: list[SweTaskSpec]) -> None:
    bad = {}
    for spec in specs:
        original = (fetch_library(spec.library) / spec.mutation.file).read_text(encoding="utf-8")
        buggy = apply_mutation(original, spec.mutation)
        assert buggy != original, spec.id
        traces = mutation_traces(original, buggy, spec.mutation)
        if traces:
            bad[spec.id] = traces
    assert not bad, f"{len(bad)} tasks: {bad}"


def test_no_statement_points_at_the_bug(specs: list[SweTaskSpec]) -> None:
    bad = {spec.id: statement_tells(spec) for spec in specs if statement_tells(spec)}
    assert not bad, f"{len(bad)} statements: {bad}"
    for spec in specs:  # still something to work with: the failing test and what it reported
        assert re.search(r"fails: `[^`]+`", spec.statement) and "What it reports:" in spec.statement, spec.id
        report = spec.statement.split("```")[1].strip()
        assert len(report) >= 5 and report != "(no message)", (spec.id, report)  # e.g. "KeyError"


def test_the_checkers_catch_the_old_tells() -> None:
    """The two checkers above fail on the kinds of tells the old ast.unparse-based renderer produced."""
    original = 'def f(x, d):\n    if x is None:\n        d.get("a",\n              "b")\n    return x\n'
    old_style = [
        ("invert_condition", "x is None", "not x is None"),
        ("swap_arguments", 'd.get("a",\n              "b")', "d.get('b', 'a')"),
        ("remove_statement", "return x", "pass"),
    ]
    for kind, before, after in old_style:
        start = original.index(before)
        line = original[:start].count("\n") + 1
        col = start - original.rfind("\n", 0, start) - 1
        end = start + len(before)
        m = Mutation(kind, "m.py", "f", line, col, original[:end].count("\n") + 1,
                     end - original.rfind("\n", 0, end) - 1, before, after)
        assert mutation_traces(original, apply_mutation(original, m), m), kind
    spec = load_specs()[0]
    leaky = SweTaskSpec.from_dict({**spec.to_dict(), "statement": f"fails at {spec.mutation.file}:12"})
    assert statement_tells(leaky)


SAMPLE = textwrap.dedent('''\
    def g(x, y, items):
        """Doc."""
        label = "a" + 'b'  # mixed quotes stay as they are
        if not x.ok:
            y = f(x, "a") + 1
        total = (x.size
                 + y)
        while items and x:
            items.pop()
            x = x - 1
        if x in (1, 2):
            return max( x ,y )
        if items is None or total >= 10:
            return label
        return total


    class C:
        def m(self, a):
            if self.ready:
                a = a + 1
            return self.n(a, 'q') if a < 3 else None
    ''')


def test_every_candidate_mutation_is_a_pure_token_edit() -> None:
    mutants = candidate_mutations(SAMPLE, "m.py")
    kinds = collections.Counter(m.kind for m in mutants)
    assert set(kinds) == {"compare_flip", "operator_flip", "off_by_one", "remove_statement", "swap_arguments",
                          "invert_condition", "boolean_flip"}, kinds
    for m in mutants:
        buggy = apply_mutation(SAMPLE, m)
        compile(buggy, "m.py", "exec")
        assert mutation_traces(SAMPLE, buggy, m) == [], (m, buggy)
        assert ("# mixed quotes stay as they are" in buggy) != ("# mixed" in m.original)  # a removed line takes its comment
        if m.kind == "remove_statement":
            assert m.replacement == "" and m.original.endswith("\n"), m  # whole lines go, nothing is left behind
    removed = {m.original.strip() for m in mutants if m.kind == "remove_statement"}
    assert "y = f(x, \"a\") + 1" not in removed  # the only statement of its block: removing it empties the block
    inverted = {(m.original, m.replacement) for m in mutants if m.kind == "invert_condition"}
    assert ("not ", "") in inverted and ("in", "not in") in inverted and ("", "not ") in inverted


def test_spec_reads_lines_without_visible_pass_and_keeps_it_when_given(specs: list[SweTaskSpec]) -> None:
    data = specs[0].to_dict()
    data.pop("visible_pass", None)
    old = SweTaskSpec.from_dict(data)
    assert old.visible_pass is None and "visible_pass" not in old.to_dict()
    new = SweTaskSpec.from_dict({**data, "visible_pass": ["tests/test_x.py::test_a"]})
    assert new.visible_pass == ("tests/test_x.py::test_a",)
    assert SweTaskSpec.from_dict(json.loads(json.dumps(new.to_dict()))) == new


def test_library_declarations_are_checked_with_messages_that_say_the_fix(tmp_path: Path) -> None:
    base = {"name": "more-itertools", "version": "10.7.0", "package_dir": "more_itertools",
            "sha256": "9fddd5403be01a94b204faadcff459ec3568cf110265d3c54323e1e866ad29d3"}
    lib = library_from_dict({**base, "test_requires": ["whatever==0.7"]})
    assert lib.test_requires == ("whatever==0.7",) and lib.test_path == (libraries.DEPS_MOUNT,)
    assert library_from_dict(base).test_path == ()
    with pytest.raises(ConfigError, match="unknown field"):
        library_from_dict({**base, "packagedir": "x"})
    with pytest.raises(ConfigError, match="sha256"):
        library_from_dict({**base, "sha256": "abc"})
    with pytest.raises(ConfigError, match="relative"):
        library_from_dict({**base, "test_dir": "/etc"})
    with pytest.raises(ConfigError, match="already declared"):
        libraries.register_library(Library("toolz", "0.1", "0" * 64, "toolz"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[library]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=r"\[\[library\]\]"):
        libraries.load_library_file(bad)


def test_swe_cache_lives_under_the_one_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE_DIR", str(tmp_path))
    assert libraries.cache_root() == tmp_path / "swe" / libraries.CACHE_VERSION


USER_LIBRARIES = textwrap.dedent('''\
    # What a user writes to add libraries: no code change.
    [[library]]
    name = "funcy"
    version = "2.0"
    sha256 = "3963315d59d41c6f30c04bc910e10ab50a3ac4a225868bfa96feed133df075cb"
    package_dir = "funcy"
    python_path = "."
    test_dir = "tests"
    test_requires = ["whatever==0.7"]   # its tests import `whatever`

    [[library]]
    name = "more-itertools"             # the sdist spells it more_itertools-10.7.0
    version = "10.7.0"
    sha256 = "9fddd5403be01a94b204faadcff459ec3568cf110265d3c54323e1e866ad29d3"
    package_dir = "more_itertools"
    python_path = "."
    test_dir = "tests"
    ''')


@pytest.mark.parametrize("name", ["funcy", pytest.param("more-itertools", marks=pytest.mark.slow)])
def test_a_library_declared_by_a_user_builds_validated_tasks(name: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads go to the normal cache root (sdist, source tree, test deps): a second run fetches nothing."""
    declared = tmp_path / "libraries.toml"
    declared.write_text(USER_LIBRARIES)
    monkeypatch.setenv(libraries.LIBRARY_FILES_ENV, str(declared))
    lib = get_library(name)
    tree = fetch_library(name)
    assert (tree / lib.package_dir / "__init__.py").is_file()
    deps = libraries.test_deps(name)
    assert (deps is not None) == (name == "funcy")
    if deps is not None:
        assert (deps / "whatever.py").is_file() or (deps / "whatever").is_dir()
    specs = build_tasks([name], per_library=1, max_candidates=12, workers=1, log=lambda _: None)
    assert len(specs) == 1
    spec = specs[0]
    assert spec.library == name and spec.fail_to_pass and spec.visible_pass is not None
    original = (tree / spec.mutation.file).read_text(encoding="utf-8")
    assert mutation_traces(original, apply_mutation(original, spec.mutation), spec.mutation) == []
    assert statement_tells(spec) == []
    assert verify_tasks(specs, log=lambda _: None) == []
