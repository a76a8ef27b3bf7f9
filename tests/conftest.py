"""Suite-wide defaults."""

from __future__ import annotations

import os

# Telemetry is on by default for users; the suite's tests (and the ranks they launch, which
# inherit this) count records and seqs exactly, so they ask for it where they test it.
os.environ.setdefault("RANKWATCH_TELEMETRY", "off")
