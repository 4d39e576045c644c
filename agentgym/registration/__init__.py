"""Env ids and how they are found: the catalogue of built-in ids and the plugin entry points."""
