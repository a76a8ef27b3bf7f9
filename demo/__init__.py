"""rankwatch.demo."""
