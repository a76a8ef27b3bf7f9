"""rankwatch.aggregator."""
