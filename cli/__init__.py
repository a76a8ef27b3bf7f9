"""rankwatch.cli."""
