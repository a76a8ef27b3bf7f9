"""Alerts: the rules that turn verdicts and rank states into alerts, and the sinks they go to."""
