"""What agentgym reads at import time (entry points in pyproject.toml). Keep this module light: the env module
is named by a string and imported only when the env is made."""

from pathlib import Path


def register() -> list[dict[str, str]]:
    """The env ids of this package (agentgym registers them with Gymnasium)."""
    return [{"id": "say_word/SayWord-v0", "entry_point": "say_word.env:SayWordEnv",
             "description": "SayWord: say the word you are given."}]


def suite_dirs() -> list[Path]:
    """Folders of suite YAML files (agentgym list, load_suite("say-word"))."""
    return [Path(__file__).parent / "suites"]
