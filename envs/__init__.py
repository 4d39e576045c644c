"""Environment families, installed as agentgym.envs."""
