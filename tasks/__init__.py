"""Task suites (YAML) and generated task data."""
