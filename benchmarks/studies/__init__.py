"""Learning studies: one command per comparison of training methods, sized by gradient noise and held-out error.

``python benchmarks/studies/run.py NAME`` (or ``agentgym study NAME``) runs one study from :mod:`catalogue`;
the training itself is the trainers' own loop, driven through ``benchmarks/credit_assignment.py``'s task
definitions, warm start and run configs.
"""
