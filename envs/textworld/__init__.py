"""TextWorld games (cooking and household) generated offline and played through textworld."""
