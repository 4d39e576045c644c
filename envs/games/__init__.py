"""Small text games for fast learning tests: calculator tool use, guess-the-number, maze."""
