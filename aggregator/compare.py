"""Compare runs: this run's cross-rank median against a reference run's at the same steps
("is this run's loss at step 10k as good as last week's?"). Pure: bands in, comparison out.

The reference by default is the previous run of the same job: run names the agent derives are
``<script stem>-<launch id>`` (agent/identity.py: ``train-1201-2247-3fa2``), so runs of one
script share the stem.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SPACED_STEPS = 3  # evenly spaced common steps compared, besides the last common one
# The launch id of a derived name (identity.py): a launcher job id (which may hold dashes) or a
# UTC stamp, then a hash; or the demo's stamp. Names derived before the stamp lost its year
# (6-hex hashes) are still read.
_LAUNCH_ID = re.compile(r"^.+-(?:[0-9a-f]{4}|[0-9a-f]{6})$")
_STAMPED = re.compile(
    r"^(?P<stem>.+)-(?:(?:\d{4}-\d{4}|launch)-[0-9a-f]{4}|(?:\d{8}-\d{4}|launch)-[0-9a-f]{6}"
    r"|\d{8}-\d{6})$"
)


def job_stems(run: str) -> list[str]:
    """The script stems a derived run name may have, longest first: a stem and a job id may
    both hold dashes (``my-train-1c8e35d8-513-63bf3e``: ``my-train``, or ``my``). Empty for a
    name set by hand, which says nothing about its job."""
    stamped = _STAMPED.match(run)
    if stamped:  # the stamp is unambiguous
        return [stamped["stem"]]
    parts = run.split("-")
    stems = []
    for cut in range(1, len(parts)):
        if _LAUNCH_ID.match("-".join(parts[cut:])):
            stems.append("-".join(parts[:cut]))
    return stems[::-1]


def previous_run(run: str, stored: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The latest run of ``stored`` (``Store.runs()`` rows) of the same job that began before
    ``run`` did, and the job's stem (the longest one they share); None when ``run`` has no job
    name or no earlier sibling."""
    mine = job_stems(run)
    starts = {r["run"]: r.get("first_time") for r in stored}
    began = starts.get(run)
    best: tuple[int, float, str, str] | None = None
    for name, t in starts.items():
        if name == run or not isinstance(t, (int, float)) or (began is not None and t >= began):
            continue
        shared = [s for s in job_stems(name) if s in mine]
        if shared:
            candidate = (len(shared[0]), float(t), name, shared[0])
            best = candidate if best is None or candidate > best else best
    return (best[2], best[3]) if best is not None else None


def _point(step: int, mine: float, ref: float) -> dict[str, Any]:
    ratio = mine / ref if ref != 0 and math.isfinite(ref) else None
    return {"step": step, "run": mine, "ref": ref, "ratio": ratio}


def _medians(band: Mapping[str, np.ndarray]) -> dict[int, float]:
    steps, medians = np.asarray(band["step"]).tolist(), np.asarray(band["median"]).tolist()
    return dict(zip(steps, medians, strict=True))


def compare_medians(
    mine: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """One metric: the medians of both bands (``{"step", "median", ...}`` columns) at the steps
    both have a finite median: the last common step and ``SPACED_STEPS`` evenly spaced ones
    from the first, each with ``ratio`` = this run / reference (None when the reference is 0)."""
    a = _medians(mine)
    b = _medians(ref)
    common = sorted(s for s in a.keys() & b.keys() if math.isfinite(a[s]) and math.isfinite(b[s]))
    out: dict[str, Any] = {"common_steps": len(common), "last": None, "points": []}
    if not common:
        out["run_last_step"] = max(a, default=None)
        out["ref_last_step"] = max(b, default=None)
        return out
    last = common[-1]
    out["last"] = _point(last, a[last], b[last])
    # spaced over the whole common span (the last is reported on its own)
    picks = np.linspace(0, len(common) - 1, SPACED_STEPS + 1)[:-1]
    steps = sorted({common[round(float(i))] for i in picks} - {last})
    out["points"] = [_point(s, a[s], b[s]) for s in steps]
    return out
