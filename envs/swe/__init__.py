"""SWE environment family: fix real bugs in real libraries."""
