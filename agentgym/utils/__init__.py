"""Utilities every layer may use: caches, progress display, images, procfs, lazy attributes, deprecation."""
