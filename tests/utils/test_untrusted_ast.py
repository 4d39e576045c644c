"""Agent text parsed as Python: the caller gets the tree or the error, the log gets no compiler warning."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings

import pytest

from agentgym.utils.untrusted_ast import parse_untrusted


@pytest.mark.parametrize("text", ["1134or 2", "0x1for", "7if 1 else 2"])
def test_agent_text_gives_its_tree_or_error_and_no_syntax_warning(text: str) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        warnings.filterwarnings("ignore", category=SyntaxWarning, module=r"<agent text>\Z")  # what the module installs
        try:
            parse_untrusted(text)
        except SyntaxError:
            pass
    assert not [w for w in seen if issubclass(w.category, SyntaxWarning)]
    with warnings.catch_warnings(record=True) as control:  # the same text under another name does warn
        warnings.simplefilter("always")
        try:
            ast.parse(text, mode="eval")
        except SyntaxError:
            pass
    assert [w for w in control if issubclass(w.category, SyntaxWarning)]


def test_garbage_calls_in_an_env_print_no_compiler_warning() -> None:
    """In a fresh interpreter with warnings shown (pytest's own recorders reset the filters, so not in-process)."""
    code = ("import gymnasium as gym, agentgym\n"
            "env = gym.make('agentgym/Calculator-v0'); env.reset(seed=0)\n"
            "assert env.step('calc(1134or 2)')[0].startswith('Error')\n"
            "assert env.step('answer(0x1for)')[0].startswith('Error')\n"
            "import ast; ast.parse('1or 2', mode='eval')  # the control: user code still warns\n")
    result = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("SyntaxWarning") == 1 and "<unknown>:1" in result.stderr, result.stderr
