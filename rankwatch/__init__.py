"""rankwatch: every rank of a distributed training job on one live chart."""

__version__ = "0.1.0"
