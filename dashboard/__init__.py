"""rankwatch.dashboard."""
