"""Cross-rank divergence: robust per-step statistics, per-rank evidence, verdicts (pure)."""
