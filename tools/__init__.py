"""Tools shared by environments (sandbox, shell, retrievers, browser)."""
