"""The `rankwatch status` table: every run and rank a server sees, as text for a terminal.

The console alert sink is ``sinks/console.py``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rankwatch.aggregator.alerts.conds import rank_ranges
from rankwatch.aggregator.feed import message_line
from rankwatch.aggregator.metrics import KNOWN_METRICS, display_order

MAX_METRIC_COLUMNS = 4  # metric columns in the status table, beyond the fixed ones
PREFERRED_METRICS = display_order()  # the known metrics first, as on the dashboard
NAME_WIDTH = 14  # metric column width; longer names are clipped
UNITS = {m.name: m.unit for m in KNOWN_METRICS if m.unit}
# Bigger runs list only the ranks with something to say (not alive, divergent, records missing
# or dropped): 4,096 rows of healthy ranks would scroll the one stalled rank out of sight.
FOLD_RANKS = 64
DIVERGENCES_PRINTED = 16  # active divergences printed per run (a cascade has one per rank)
# the order of the counts line; "unknown": a stored rank whose records stop without a reason
STATES = ("alive", "stalled", "lost", "crashed", "finished", "unknown")


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


def _has_news(r: Mapping[str, Any], usual: str = "alive") -> bool:
    return bool(r.get("state") != usual or r.get("divergent") or r.get("gaps") or r.get("dropped"))


def _counts(
    ranks: Sequence[Mapping[str, Any]],
    counted: Mapping[str, int] | None = None,
    divergent: int | None = None,
) -> str:
    """The counts line: ranks by state (``counted``, a summary's, or those of ``ranks``), and
    how many are divergent (``divergent``: the server's count, of every rank, not only those
    listed)."""
    states = Counter(counted) if counted else Counter(str(r.get("state", "?")) for r in ranks)
    order = [s for s in STATES if s in states] + sorted(set(states) - set(STATES))
    line = "ranks: " + ", ".join(f"{states[s]:,} {s}" for s in order)
    if divergent is None:
        divergent = sum(bool(r.get("divergent")) for r in ranks)
    return line + (f"; {divergent:,} divergent" if divergent else "")


def render_run(run: Mapping[str, Any], now: float, all_ranks: bool = False) -> list[str]:
    ranks = list(run.get("ranks") or [])
    stored = bool(run.get("history"))
    state = f"{run.get('state', '?')}{', stored' if stored else ''}"
    head = f"run {run.get('run')}  [{state}]  world size {run.get('world_size', '?')}"
    if run.get("last_step") is not None:
        head += f"  last step {_fmt_value(run.get('last_step'))}"
    # The records' own time: an imported run's records arrived just now but say when the
    # training wrote them.
    last = run.get("record_time") if run.get("record_time") is not None else run.get("last_time")
    if last is not None:
        head += f"  last record {_fmt_age(last, now)} ago"
    lines = [head]
    silent = run.get("ended_without_event") or 0
    if stored and silent:
        lines.append(
            f"  {silent:,} of {run.get('ranks_seen') or len(ranks):,} ranks sent no end or crash "
            "event: finished, killed or cut off, the store cannot tell"
        )
    if not ranks:
        if stored:
            return [*lines, f"  {run.get('ranks_seen') or 0:,} ranks stored"]
        if run.get("ranks_summarised"):  # a big run with nothing to say about any rank
            return [*lines, "  " + _counts([], run.get("rank_states"), run.get("ranks_divergent")),
                    f"  (every rank alive, not divergent, nothing missing; --run {run.get('run')} "
                    "--all lists every rank)"]  # fmt: skip
        return [*lines, "  (no ranks heard from)"]
    # a stored run's, or a big live run's, counts cover ranks the server did not list
    lines.append("  " + _counts(ranks, run.get("rank_states"), run.get("ranks_divergent")))
    given = len(ranks)  # fewer than ranks_seen: the server listed only some (history.py)
    everyone = max(given, int(run.get("ranks_seen") or 0))
    usual = "finished" if stored else "alive"  # what a rank of a stored / a live run says
    if not all_ranks and everyone > FOLD_RANKS:
        ranks = [r for r in ranks if _has_news(r, usual)]
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
    if run.get("ranks_summarised") and given < everyone:
        more_odd = max(0, int(run.get("ranks_odd") or 0) - given)
        lines.append(
            f"  ({everyone - len(rows):,} more ranks not listed"
            + (f", {more_odd:,} of them not alive, divergent or missing records" if more_odd
               else f": {usual}, not divergent, nothing missing")
            + f"; --run {run.get('run')} --all lists every rank)"
        )  # fmt: skip
    elif given < everyone:
        lines.append(
            f"  ({everyone - len(rows):,} more ranks not listed; --run {run.get('run')} --all "
            "lists every rank)"
        )
    elif len(rows) < everyone:
        lines.append(
            f"  ({everyone - len(rows):,} more ranks {usual}, not divergent, nothing missing: "
            "not listed; --all lists every rank)"
        )
    said: dict[str, list[int]] = {}  # line -> the ranks it is said of, in order
    for r in ranks:
        quiet = ("alive", None, usual, *(("unknown",) if stored else ()))  # said above
        if r.get("message") and r.get("state") not in quiet:
            # the server's one line (an older server's entry has none: cut it here)
            crashed = r.get("state") == "crashed"
            line = r.get("message_line") or message_line(str(r["message"]), crashed)
            said.setdefault(line, []).append(int(r.get("rank") or 0))
    for line, of in said.items():  # 100 ranks "finished (normal)" is one line, not 100
        who = f"rank {of[0]}" if len(of) == 1 else f"ranks {rank_ranges(sorted(of))} ({len(of):,})"
        lines.append(f"  {who}: {line}")
    listed = run.get("divergences") or []
    for d in listed[:DIVERGENCES_PRINTED]:
        lines.append(
            f"  ! rank {d.get('rank')} {d.get('metric')} {d.get('kind')}"
            f" since step {d.get('since_step')}: {d.get('message', '')}"
        )
    more = int(run.get("divergences_active") or len(listed)) - len(listed[:DIVERGENCES_PRINTED])
    if more > 0:
        kinds = run.get("divergences_by_kind") or {}
        in_all = ", ".join(f"{n:,} {kind}" for kind, n in kinds.items())
        lines.append(
            f"  ! {more:,} more active divergences, not listed"
            + (f" ({in_all} in all)" if in_all else "")
            + ": the earliest to start are above"
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


def render_compare(comparison: Mapping[str, Any]) -> str:
    """`rankwatch status --run R --compare [REF]`: per metric, the run's median across ranks
    and the reference's at the same steps (evenly spaced ones, then the last common one)."""
    run, ref = str(comparison.get("run")), str(comparison.get("ref"))
    reason = comparison.get("ref_reason")
    why = "" if reason in (None, "given") else f" ({reason})"
    lines = [f"run {run} vs {ref}{why}: median across ranks at the same step"]
    rows = []
    for m in comparison.get("metrics") or []:
        points = [*(m.get("points") or []), *([m["last"]] if m.get("last") else [])]
        name = str(m.get("metric"))[:NAME_WIDTH]
        if not points:
            rows.append([name, "-", "-", "-", "no common step"])
        for i, p in enumerate(points):
            ratio = p.get("ratio")
            rows.append(
                [
                    name,
                    _fmt_value(p.get("step")) + (" (last)" if i == len(points) - 1 else ""),
                    _fmt_value(p.get("run")),
                    _fmt_value(p.get("ref")),
                    "-" if ratio is None else f"{ratio:.3f}",
                ]
            )
    if rows:
        header = ["metric", "step", run[:24], ref[:24], "ratio"]
        lines += ["  " + line for line in _table(header, rows)]
    else:
        lines.append("  no metric in common")
    for key, whose in (("only_in_run", run), ("only_in_ref", ref)):
        if comparison.get(key):
            lines.append(f"  only {whose} has: {', '.join(map(str, comparison[key]))}")
    return "\n".join(lines)
