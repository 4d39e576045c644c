"""SWE task data: pinned real libraries, AST bug injection, validated task specs (``agentgym tasks build swe``)."""
