"""A card's state in words and rows: where it is, how it compares with its peers, the note an
incident carries about it, the status lines of the hottest, slowest and most loaded cards, and
the rank table's hardware columns. Pure: reads a ``HardwareWatch``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankwatch.aggregator.telemetry import metrics as tm

if TYPE_CHECKING:
    from rankwatch.aggregator.telemetry.outliers import HardwareWatch

NOTE_CLOCK_RATIO = 0.95  # a clock below this share of its peers' is worth a word in a note
NOTE_TEMP_GAP_C = 5.0  # ... a card this much hotter than its peers too
LEADER_Z = 3.0  # status names a leader only this far from its peers
SIMILAR_POWER = 0.9  # a slow clock at this share of the peers' power or more: "similar power"


@dataclass
class Card:
    """The latest telemetry of one rank: its card and its host, all sources merged."""

    host: str = ""
    device: str = ""
    time: float = 0.0
    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


def where(card: Card) -> str:
    """ "gpu:5 on node3", "node3", "unknown host"."""
    host = card.host or "unknown host"
    return f"{card.device} on {host}" if card.device else host


def show(m: tm.TelemetryMetric, value: float) -> str:
    """A value in its unit for people: 94 °C, 1.2 GiB, 71 %."""
    if not math.isfinite(value):
        return str(value)
    if m.unit in ("B", "B/s"):
        for size, word in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.3g} {word}{m.unit[1:]}"
        return f"{value:.0f} {m.unit}"
    unit = f" {m.unit}" if m.unit else ""
    return f"{value:.4g}{unit}"


def outlier_words(m: tm.TelemetryMetric, value: float, median: float, n: int) -> str:
    """ "GPU temperature 94 °C, 28 °C above the median of 1024 cards (66 °C)"."""
    peers = f"the median of {n} cards ({show(m, median)})" if n else "its peers"
    if m.direction == "low" and median > 0:
        return f"{m.title} {show(m, value)}, {value / median:.0%} of {peers}"
    return f"{m.title} {show(m, value)}, {show(m, value - median)} above {peers}"


def power_words(watch: HardwareWatch, run: str, rank: int) -> str:
    """ ", at similar power (98% of its peers')" for a slow clock: the card draws what the others
    draw and does less with it; ", at 65% of its peers' power" when it draws less too."""
    power = watch.card(run, rank).values.get(tm.POWER)
    peers = watch.peers.get((run, tm.POWER))
    if power is None or peers is None or not peers.median > 0 or not math.isfinite(power):
        return ""
    share = power / peers.median
    if share >= SIMILAR_POWER:
        return f", at similar power ({share:.0%} of its peers')"
    return f", at {share:.0%} of its peers' power"


def card_note(watch: HardwareWatch, run: str, rank: int) -> str | None:
    """What an incident on ``rank`` says about its card: "card 5 (gpu:5 on node0) at 94 °C
    (peers 66 °C), SM clock 71 % of its peers', thermal slowdown"; None when the card has no
    telemetry or nothing about it stands out."""
    card = watch.cards.get(run, {}).get(rank)
    if card is None:
        return None
    parts: list[str] = []
    for name in ("gpu/temp_c", "npu/temp_c"):
        value, peers = card.values.get(name), watch.peers.get((run, name))
        if value is not None and peers is not None and value - peers.median >= NOTE_TEMP_GAP_C:
            parts.append(f"at {value:.0f} °C (peers {peers.median:.0f} °C)")
    clock, peers = card.values.get(tm.CLOCK), watch.peers.get((run, tm.CLOCK))
    if (
        clock is not None
        and peers is not None
        and peers.median > 0
        and (clock / peers.median <= NOTE_CLOCK_RATIO)
    ):
        parts.append(f"SM clock {clock / peers.median:.0%} of its peers'"
                     + power_words(watch, run, rank))  # fmt: skip
    for (frun, name, frank), _ in watch.flags.items():
        if (frun, frank) == (run, rank) and tm.BY_NAME[name].rule == "hw_load":
            m = tm.BY_NAME[name]
            parts.append(f"{m.title} {show(m, card.values.get(name, math.nan))}")
    reasons = watch.throttle_reasons(run, rank)
    if reasons:
        parts.append(f"{', '.join(r.replace('_', ' ') for r in reasons)} slowdown")
    for name in tm.ECC_COUNTERS:
        held = watch.ecc.get((run, rank, name))
        if held is not None:
            parts.append(f"uncorrectable ECC +{held[2]:g}")
    if card.values.get(tm.HEALTH_OK) == 0.0:
        parts.append(f"health {card.labels.get(tm.HEALTH_LABEL) or 'not OK'}")
    if not parts:
        return None
    return f"card {rank} ({where(card)}) " + ", ".join(parts)


def leaders(watch: HardwareWatch, run: str) -> list[dict[str, Any]]:
    """The card furthest from its peers on each scored metric the run has (the hottest, the
    slowest-clocked, the most loaded), when it is ``LEADER_Z`` away or flagged; most extreme
    first."""
    out = []
    for m in tm.SCORED:
        peers = watch.peers.get((run, m.name))
        if peers is None or not peers.z:
            continue
        sign = 1.0 if m.direction == "high" else -1.0
        rank, z = max(peers.z.items(), key=lambda kv: sign * kv[1])
        flagged = (run, m.name, rank) in watch.flags
        if sign * z < LEADER_Z and not flagged:
            continue
        card = watch.card(run, rank)
        value = card.values.get(m.name, math.nan)
        word = {"hw_hot": "hottest", "hw_clock": "slowest clock"}.get(m.rule or "", "most loaded")
        out.append({
            "metric": m.name, "rank": rank, "z": z, "value": value, "median": peers.median,
            "n": peers.n, "flagged": flagged, "where": where(card), "word": word,
            "text": outlier_words(m, value, peers.median, peers.n),
        })  # fmt: skip
    return sorted(out, key=lambda d: -abs(d["z"]))


def rank_rows(watch: HardwareWatch, run: str) -> dict[int, dict[str, Any]]:
    """rank -> the rank table's hardware columns (temp, util, mem and mem_total in bytes), its
    host and card, and the hardware rules flagging it."""
    rows: dict[int, dict[str, Any]] = {}
    flagged: dict[int, set[str]] = {}
    for frun, name, rank in watch.flags:
        if frun == run:
            flagged.setdefault(rank, set()).add(name)
    for frun, rank, _name in watch.ecc:
        if frun == run:
            flagged.setdefault(rank, set()).add("ecc")
    for rank, card in watch.cards.get(run, {}).items():
        row: dict[str, Any] = {"host": card.host, "device": card.device, "time": card.time}
        for m in tm.KNOWN:
            if m.column and m.name in card.values and m.column not in row:
                row[m.column] = card.values[m.name]
        total = card.values.get("gpu/mem_total_bytes", card.values.get("npu/hbm_total_bytes"))
        if total is not None:
            row["mem_total"] = total
        if card.values.get(tm.HEALTH_OK) == 0.0:
            flagged.setdefault(rank, set()).add("health")
        if watch.throttle_reasons(run, rank):
            flagged.setdefault(rank, set()).add("throttle")
        row["flags"] = sorted(flagged.get(rank, ()))
        rows[rank] = row
    return rows


def stored_rows(
    latest: dict[int, dict[str, float]], hosts: dict[int, dict[str, str]]
) -> dict[int, dict[str, Any]]:
    """The rank table's hardware columns from stored latest values and hosts (a run no longer
    live)."""
    rows: dict[int, dict[str, Any]] = {}
    for rank, values in latest.items():
        where = hosts.get(rank, {})
        row: dict[str, Any] = {"host": where.get("host", ""), "device": where.get("device", ""),
                               "flags": []}  # fmt: skip
        for m in tm.KNOWN:
            if m.column and m.name in values and m.column not in row:
                row[m.column] = values[m.name]
        rows[rank] = row
    return rows


STATUS_LINES = 6  # hardware lines `rankwatch status` prints per run at most


def status_lines(hw: dict[str, Any]) -> list[str]:
    """`rankwatch status`'s hardware lines of one run (``provider.hardware``'s answer): the
    hottest, slowest-clocked and most loaded cards when they stand out, then the other faults
    (nodes, ECC, health, slowdown reasons); nothing for a run without telemetry."""
    ranks = hw.get("ranks") or {}
    if not ranks:
        return []
    nodes = len(hw.get("nodes") or {})
    head = (f"hardware of {hw.get('run')}: {len(ranks)} cards on {nodes} node(s), sampled every "
            f"{float(hw.get('interval_s') or 0):g} s")  # fmt: skip
    lines: list[str] = []
    told: set[tuple[str, Any]] = set()
    words: set[str] = set()
    for lead in hw.get("leaders") or []:
        if lead["word"] in words:
            continue
        words.add(lead["word"])
        mark = " [flagged]" if lead["flagged"] else ""
        lines.append(f"  {lead['word']}: rank {lead['rank']} ({lead['where']}): {lead['text']}"
                     f", z {lead['z']:.1f}{mark}")  # fmt: skip
        told.add((lead["metric"], lead["rank"]))
    for f in hw.get("findings") or []:
        if (f.get("metric"), f.get("rank")) not in told:
            lines.append(f"  {f['rule']}: {f['message']}")
    if len(lines) > STATUS_LINES:
        lines = [*lines[:STATUS_LINES], f"  ... and {len(lines) - STATUS_LINES} more (the page)"]
    return [head, *(lines or ["  every card is in line with its peers"])]


def nodes_of(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``ranks`` and ``nodes`` (host -> its ranks, in rank order) of rank rows."""
    nodes: dict[str, list[int]] = {}
    for rank, row in sorted(rows.items()):
        nodes.setdefault(row.get("host") or "", []).append(rank)
    return {"ranks": rows, "nodes": nodes}


def hardware_view(watch: HardwareWatch, findings: list[Any], run: str) -> dict[str, Any]:
    """The provider's ``hardware(run)``: ``ranks`` (rank -> host, device, temp/util/mem(_total),
    flags), ``nodes`` (host -> its ranks), ``findings`` (the hardware conditions holding now),
    ``leaders`` (the hottest, slowest, most loaded cards), ``outliers`` (metric -> ranks flagged
    on it), ``z`` (metric -> rank -> z of the last scored bucket), ``interval_s``."""
    outliers: dict[str, list[int]] = {}
    for frun, name, rank in watch.flags:
        if frun == run:
            outliers.setdefault(name, []).append(rank)
    return {
        "run": run, "interval_s": watch.width(run), **nodes_of(rank_rows(watch, run)),
        "findings": [dataclasses.asdict(f) for f in findings if f.run == run],
        "leaders": leaders(watch, run), "outliers": {k: sorted(v) for k, v in outliers.items()},
        "z": {name: dict(p.z) for (prun, name), p in watch.peers.items() if prun == run},
    }  # fmt: skip
