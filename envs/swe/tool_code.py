"""The code the SWE env's file tools run inside the sandbox (view, str_replace, create), and how its replies
become tool results.

Each snippet first checks that its path stays inside ``/work/repo``; a model mistake is printed as
``ERROR: ...`` and becomes an error observation (:func:`tool_reply`).
"""

from __future__ import annotations

from agentgym.toolset import ToolResult

__all__ = ["CREATE_CODE", "REPLACE_CODE", "VIEW_CODE", "tool_reply"]


def tool_reply(text: str) -> ToolResult:
    """Helper snippets print 'ERROR: ...' for model mistakes; those become error observations."""
    text = text.rstrip("\n")
    if text.startswith("ERROR: "):
        return ToolResult.error("Error: " + text[len("ERROR: "):])
    return ToolResult(text)


_GUARD = '''
import os
_path = {path!r}
_root = os.path.realpath("/work/repo")
_target = os.path.realpath(os.path.join(_root, {path!r}))
_inside = _target == _root or _target.startswith(_root + os.sep)
'''

VIEW_CODE = _GUARD + '''
if not _inside:
    print("ERROR: that path resolves outside the repository (through a symlink).")
elif os.path.isdir(_target):
    _entries = []
    for _dir, _subdirs, _files in os.walk(_target):
        _subdirs[:] = sorted(d for d in _subdirs if not d.startswith(".") and d != "__pycache__")
        _depth = os.path.relpath(_dir, _target).count(os.sep) + (0 if _dir == _target else 1)
        if _depth >= 2:
            _subdirs[:] = []
        for _name in sorted(_files):
            _entries.append(os.path.relpath(os.path.join(_dir, _name), _root))
    print("\\n".join(_entries[:500]) + ("\\n..." if len(_entries) > 500 else ""))
elif not os.path.isfile(_target):
    print("ERROR: no such file or directory: " + _path)
else:
    with open(_target, "rb") as _fh:
        _data = _fh.read(5_000_000)
    if b"\\x00" in _data[:8192]:
        print("ERROR: " + _path + " is a binary file; view shows text files only.")
    else:
        _lines = _data.decode("utf-8", "replace").splitlines()
        _shown = _lines[{start} - 1:{stop}]
        if not _shown:
            print("ERROR: " + _path + " has " + str(len(_lines)) + " lines; start is past the end.")
        else:
            print("\\n".join(f"{{i:6d}}\\t{{t}}" for i, t in enumerate(_shown, {start})))
            if {stop} < len(_lines):
                print("... (" + str(len(_lines)) + " lines in total; view more with start=" + str({stop} + 1) + ")")
'''

REPLACE_CODE = _GUARD + '''
if not _inside:
    print("ERROR: that path resolves outside the repository (through a symlink).")
elif not os.path.isfile(_target):
    print("ERROR: no such file: " + _path + " (create it with create).")
else:
    with open(_target, encoding="utf-8", errors="surrogateescape") as _fh:
        _text = _fh.read()
    _count = _text.count({old!r})
    if _count != 1:
        print("ERROR: 'old' occurs " + str(_count) + " times in " + _path + "; it must occur exactly once. "
              + ("Copy it exactly from view (whitespace matters)." if _count == 0 else "Include more surrounding lines."))
    else:
        with open(_target, "w", encoding="utf-8", errors="surrogateescape") as _fh:
            _fh.write(_text.replace({old!r}, {new!r}, 1))
        print("Replaced 1 occurrence in " + _path + ".")
'''

CREATE_CODE = _GUARD + '''
if not _inside or _target == _root:
    print("ERROR: that path resolves outside the repository or is the repository itself.")
elif os.path.isdir(_target):
    print("ERROR: " + _path + " is a directory.")
else:
    os.makedirs(os.path.dirname(_target), exist_ok=True)
    with open(_target, "w", encoding="utf-8", errors="surrogateescape") as _fh:
        _fh.write({text!r})
    print("Wrote " + _path + " (" + str(len({text!r})) + " characters).")
'''
