"""Test ids in the three forms SWE-bench's instances use, matched against the pytest node ids the grader reports.

SWE-bench records FAIL_TO_PASS / PASS_TO_PASS as each repository's own harness logs them:

* pytest node ids, parameters included (``tests/test_x.py::TestA::test_b[1-2]``): most repositories;
* Django's unittest ids, ``test_b (app.tests.TestA)`` (Django 5 also ``test_b (app.tests.TestA.test_b)``);
* bare test names, ``test_b`` (sympy's own runner prints only the function name).

The grader always runs pytest and reports node ids, so :func:`resolve_outcome` maps each form onto them: a node id
must match exactly; a Django id matches a node id whose file, as a dotted module path, ends with the id's module and
whose class and function are the id's; a bare name matches a node id whose last part is that name (with or without
parameters). When several node ids match, the test passes only if every one of them passed; none matching counts as
failed, as a missing outcome always does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["id_kind", "needs_test_files", "resolve_outcome"]

_DJANGO = re.compile(r"^(?P<name>[A-Za-z_]\w*) \((?P<path>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)\)$")
_BARE = re.compile(r"^[A-Za-z_]\w*(\[.*\])?$", re.DOTALL)


def id_kind(test_id: str) -> str | None:
    """``"node"``, ``"django"`` or ``"bare"``; None for text that is none of them."""
    if "::" in test_id:
        return "node"
    if _DJANGO.match(test_id):
        return "django"
    if _BARE.match(test_id):
        return "bare"
    return None


def needs_test_files(test_id: str) -> bool:
    """Whether the id names no file, so the grader must be told which test files to run it from."""
    return id_kind(test_id) in ("django", "bare")


def _dotted(path: str) -> str:
    return path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")


def _django_matches(test_id: str, node_ids: list[str]) -> list[str]:
    match = _DJANGO.match(test_id)
    assert match is not None
    name, parts = match.group("name"), match.group("path").split(".")
    if parts[-1] == name and len(parts) >= 3:  # Django 5: "test_b (app.tests.TestA.test_b)"
        parts = parts[:-1]
    module, cls = ".".join(parts[:-1]), parts[-1]
    found = []
    for node in node_ids:
        pieces = node.split("::")
        if len(pieces) < 3 or pieces[-1].split("[")[0] != name or pieces[-2] != cls:
            continue
        dotted = _dotted(pieces[0])
        if dotted == module or dotted.endswith("." + module):
            found.append(node)
    return found


def _bare_matches(test_id: str, node_ids: list[str]) -> list[str]:
    exact = [n for n in node_ids if n.split("::")[-1] == test_id]
    if exact or "[" in test_id:
        return exact
    return [n for n in node_ids if n.split("::")[-1].split("[")[0] == test_id]


def resolve_outcome(test_id: str, outcomes: Mapping[str, str]) -> str | None:
    """The outcome of ``test_id`` among pytest's ``outcomes`` (node id -> outcome); None when nothing matches."""
    if test_id in outcomes:
        return outcomes[test_id]
    kind = id_kind(test_id)
    if kind not in ("django", "bare"):
        return None
    nodes = [n for n in outcomes if "::" in n]
    found = _django_matches(test_id, nodes) if kind == "django" else _bare_matches(test_id, nodes)
    if not found:
        return None
    failed = [outcomes[n] for n in found if outcomes[n] != "passed"]
    return failed[0] if failed else "passed"
