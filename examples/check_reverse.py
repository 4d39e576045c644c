"""Prove the example env and suite sound: the env contract (and the reward rule), then every task solvable."""
from agentgym import load_suite
from agentgym.testing import check_agent_env

suite = load_suite("examples/reverse.yaml")  # registers examples/Reverse-v0 from the suite's entry_point
check_agent_env(suite.env_id, env_kwargs=dict(suite.env_kwargs))  # gymnasium's checker, replay, fuzz, rewards
report = suite.validate()  # the reference solver through the real env, on every task of both splits
print(report)
assert report.ok, report
