"""Ingest: the ZeroMQ receiver, its frame decoders, and the JSONL importer."""
