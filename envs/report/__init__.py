"""Open-ended reports on the local search corpus, scored by a rubric (facts checked against the corpus, plus a
judge for completeness when one is given)."""
