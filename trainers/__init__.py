"""Turn-level RL trainers and their pure algorithm functions."""
