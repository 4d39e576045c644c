"""BabyAI levels from ``minigrid`` as a text env (``agentgym/BabyAI-v0``); needs ``agentgym[babyai]``."""
