"""The `rankwatch status` table: every run and rank a server sees, as text for a terminal.

The console alert sink is ``sinks/console.py``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rankwatch.aggregator.metrics import KNOWN_METRICS, display_order

MAX_METRIC_COLUMNS = 4  # metric columns in the status table, beyond the fixed ones
PREFERRED_METRICS = display_order()  # the known metrics first, as on the dashboard
NAME_WIDTH = 14  # metric column width; longer names are clipped
UNITS = {m.name: m.unit for m in KNOWN_METRICS if m.unit}
# Bigger runs list only the ranks with something to say (not alive, divergent, records missing
# or dropped): 4,096 rows of healthy ranks would scroll the one stalled rank out of sight.
FOLD_RANKS = 64
STATES = ("alive", "stalled", "lost", "crashed", "finished")  # the order of the counts line


def _fmt_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value  # "NaN", "Infinity" as JSON carries them
    if isinstance(value, float):
        return readable(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def readable(value: float) -> str:
    """13,750 rather than 1.375e+04; four significant digits below 1,000, and exponents only
    for the very large or very small (a learning rate of 1e-05)."""
    size = abs(value)
    if size >= 1e15 or 0 < size < 1e-3:
        return f"{value:.3g}"
    if size >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _fmt_age(last_seen: Any, now: float) -> str:
    if not isinstance(last_seen, (int, float)):
        return "-"
    age = max(0.0, now - last_seen)
    if age < 120:
        return f"{age:.0f}s"
    if age < 7200:
        return f"{age / 60:.0f}m"
    return f"{age / 3600:.1f}h"


def _pick_metrics(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    names: set[str] = set()
    for r in ranks:
        names.update((r.get("values") or {}).keys())
    chosen = [m for m in PREFERRED_METRICS if m in names]
    chosen += sorted(names - set(chosen))
    return chosen[:MAX_METRIC_COLUMNS]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def _has_news(r: Mapping[str, Any]) -> bool:
    return bool(
        r.get("state") != "alive" or r.get("divergent") or r.get("gaps") or r.get("dropped")
    )


def _counts(ranks: Sequence[Mapping[str, Any]]) -> str:
    states = Counter(str(r.get("state", "?")) for r in ranks)
    order = [s for s in STATES if s in states] + sorted(set(states) - set(STATES))
    line = "ranks: " + ", ".join(f"{states[s]:,} {s}" for s in order)
    divergent = sum(bool(r.get("divergent")) for r in ranks)
    return line + (f"; {divergent:,} divergent" if divergent else "")


def render_run(run: Mapping[str, Any], now: float, all_ranks: bool = False) -> list[str]:
    ranks = list(run.get("ranks") or [])
    head = (
        f"run {run.get('run')}  [{run.get('state', '?')}]  world size {run.get('world_size', '?')}"
    )
    if run.get("last_step") is not None:
        head += f"  last step {_fmt_value(run.get('last_step'))}"
    if run.get("last_time") is not None:
        head += f"  updated {_fmt_age(run.get('last_time'), now)} ago"
    lines = [head]
    if not ranks:
        return [*lines, "  (no ranks heard from)"]
    lines.append("  " + _counts(ranks))
    everyone = len(ranks)
    if not all_ranks and everyone > FOLD_RANKS:
        ranks = [r for r in ranks if _has_news(r)]
    metrics = _pick_metrics(ranks)
    header = ["rank", "state", "step", "seen", "host", "pid"]
    header += [m[:NAME_WIDTH] + (f" ({UNITS[m]})" if m in UNITS else "") for m in metrics]
    header += ["dropped", "gaps", "divergent"]
    rows = []
    for r in sorted(ranks, key=lambda r: r.get("rank", 0)):
        values = r.get("values") or {}
        z = r.get("z") or {}
        divergent = ", ".join(
            f"{m} (z={_fmt_value(z[m])})" if m in z else str(m) for m in r.get("divergent") or []
        )
        gaps = r.get("gaps") or []
        rows.append(
            [
                str(r.get("rank")),
                str(r.get("state", "?")),
                _fmt_value(r.get("last_step")),
                _fmt_age(r.get("last_seen"), now),
                str(r.get("host") or "-"),
                str(r.get("pid") if r.get("pid") is not None else "-"),
                *(_fmt_value(values.get(m)) for m in metrics),
                _fmt_value(r.get("dropped") or 0),
                str(len(gaps)) if isinstance(gaps, list) else _fmt_value(gaps),
                divergent or "-",
            ]
        )
    if rows:
        lines += ["  " + line for line in _table(header, rows)]
    if len(rows) < everyone:
        lines.append(
            f"  ({everyone - len(rows):,} more ranks alive, not divergent, nothing missing: "
            "not listed; --all lists every rank)"
        )
    for r in ranks:
        if r.get("message") and r.get("state") not in ("alive", None):
            lines.append(f"  rank {r.get('rank')}: {r['message']}")
    for d in run.get("divergences") or []:
        lines.append(
            f"  ! rank {d.get('rank')} {d.get('metric')} {d.get('kind')}"
            f" since step {d.get('since_step')}: {d.get('message', '')}"
        )
    return lines


def render_status(
    snapshot: Mapping[str, Any],
    run: str | None = None,
    now: float | None = None,
    all_ranks: bool = False,
) -> str:
    """The `rankwatch status` text: one block per run, its rank counts by state, one row per
    rank (beyond FOLD_RANKS ranks, per rank with something to say, unless ``all_ranks``)."""
    now = time.time() if now is None else now
    runs = [r for r in snapshot.get("runs") or [] if run is None or r.get("run") == run]
    if not runs:
        return f"no run named {run!r}" if run is not None else "no runs yet"
    blocks = ["\n".join(render_run(r, now, all_ranks)) for r in runs]
    incidents = incident_lines(runs)
    return "\n\n".join([*(["\n".join(incidents)] if incidents else []), *blocks])


def incident_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Open incidents before anything else: one line each, the culprit and the cause first."""
    out = []
    for r in runs:
        for inc in r.get("incidents") or ():
            out.append(f"INCIDENT {inc.get('id')}: {inc.get('summary')}")
            affected = len(inc.get("affected") or ())
            if affected:
                out.append(f"  {affected} rank(s) affected after it; see `rankwatch status --run "
                           f"{r.get('run')}` or the dashboard for the timeline")  # fmt: skip
    return out
