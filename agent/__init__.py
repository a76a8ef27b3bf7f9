"""rankwatch.agent."""
