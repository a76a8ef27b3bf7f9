"""The embedded store (DuckDB behind a narrow interface), its write buffer, rollups, export."""
