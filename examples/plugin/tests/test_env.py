"""The env honours the agentgym contract and its reference solver solves every task of the suite."""

from pathlib import Path

from agentgym import load_suite
from agentgym.testing import check_agent_env

SUITE = Path(__file__).resolve().parents[1] / "say_word" / "suites" / "say-word.yaml"


def test_env_contract() -> None:
    suite = load_suite(str(SUITE))
    check_agent_env(suite.env_id, fuzz_examples=30, env_kwargs=dict(suite.env_kwargs))


def test_suite_is_solvable() -> None:
    report = load_suite(str(SUITE)).validate()
    assert report.ok, report
