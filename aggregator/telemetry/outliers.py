"""Cross-rank outliers and fault flags on hardware telemetry. Pure: records in, findings out,
no clock (time is the records' own).

Telemetry is time-indexed: every rank samples at its own phase, so values are aligned to time
buckets of the sampling interval (a run's interval is learned from its first two samples of one
rank and source; ``interval_s`` until then) and a bucket is scored across the ranks that
reported in it once the run's newest sample is past its end. A bucket is scored with the robust
z of the divergence detector (``divergence.robust``): median and MAD across the ranks, the
scale floored by the metric's own floor; a rank is an outlier when its z passes
``z_threshold`` *and* it is a real effect in the metric's unit (``metrics.TelemetryMetric``:
8 °C hotter, clock below 85 % of the median, ...), so many cards in close agreement do not
make a fraction of a degree a fault. ``confirm_buckets`` outlier buckets in a row flag it,
``clear_buckets`` clean ones clear it.

Flags that need no peers: any increase of an uncorrectable ECC counter (held ``ecc_hold_s``),
health not OK, clock slowdown reasons set for ``throttle_samples`` samples in a row.

When most cards of one host are flagged by one rule on one metric, they are one finding about
the node (``hw_node``): a node-level fault reads as one node, not eight cards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
from rankwatch.aggregator.divergence.config import DivergenceConfig, MetricRule
from rankwatch.aggregator.divergence.robust import robust_scale
from rankwatch.aggregator.telemetry import metrics as tm
from rankwatch.aggregator.telemetry.cards import Card, outlier_words, power_words, where

MIN_INTERVAL_S = 1.0  # learned intervals are clamped to this range
MAX_INTERVAL_S = 600.0
_DIVERGENCE = DivergenceConfig()


class TelemetryLike(Protocol):
    """What the watch reads of a telemetry record (``records.TelemetryRecord``)."""

    @property
    def run(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def time(self) -> float: ...
    @property
    def host(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def values(self) -> Mapping[str, float]: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class HardwareConfig:
    """The ``[telemetry]`` TOML table; see docs/telemetry.md for the defaults' reasons."""

    interval_s: float = 10.0  # bucket width until a run's own sampling interval is seen
    z_threshold: float = 4.0
    confirm_buckets: int = 3
    clear_buckets: int = 3
    min_ranks: int = 4  # fewer cards in a bucket: no peers to compare with
    ecc_hold_s: float = 600.0  # an ECC increase stays flagged this long (record time)
    throttle_samples: int = 2
    node_fraction: float = 0.75  # this share of a host's cards flagged together: the node
    node_min_ranks: int = 2
    open_buckets: int = 6  # buckets held per (run, metric) waiting to be scored

    def __post_init__(self) -> None:
        checks = {
            "interval_s": MIN_INTERVAL_S <= self.interval_s <= MAX_INTERVAL_S,
            "z_threshold": self.z_threshold > 0,
            "confirm_buckets": self.confirm_buckets >= 1,
            "clear_buckets": self.clear_buckets >= 1,
            "min_ranks": self.min_ranks >= 3,
            "ecc_hold_s": self.ecc_hold_s > 0,
            "throttle_samples": self.throttle_samples >= 1,
            "node_fraction": 0 < self.node_fraction <= 1,
            "node_min_ranks": self.node_min_ranks >= 2,
            "open_buckets": self.open_buckets >= 2,
        }
        for name, ok in checks.items():
            if not ok:
                value = getattr(self, name)
                raise ValueError(f"telemetry setting {name}={value!r} is out of range")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> HardwareConfig:
        known = {f.name: str(f.type) for f in fields(cls)}
        kw: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise ValueError(f"unknown telemetry setting {key!r}; known: {sorted(known)}")
            ints = known[key] == "int"
            if type(value) not in ((int,) if ints else (int, float)):
                want = "an integer" if ints else "a number"
                raise ValueError(f"telemetry setting {key!r} must be {want}, got {value!r}")
            kw[key] = value
        return cls(**kw)


@dataclass(frozen=True)
class Finding:
    """One hardware condition, as the alert engine takes it (``AlertEngine.evaluate``)."""

    rule: str  # metrics.RULES
    run: str
    rank: int | None  # None: a node (``ranks`` and ``host`` say which)
    metric: str  # the telemetry metric; "<metric>@<host>" for a node
    value: float | None
    message: str
    since_time: float  # record time the condition began
    ranks: tuple[int, ...] = ()
    host: str = ""


@dataclass
class Peers:
    """The last scored bucket of one (run, metric)."""

    median: float
    n: int
    time: float
    z: dict[int, float]


@dataclass
class _Flag:
    since: float
    value: float
    median: float
    z: float


_NO_STREAK = (0, 0, -math.inf)


class HardwareWatch:
    def __init__(self, config: HardwareConfig | None = None) -> None:
        self.config = config or HardwareConfig()
        self.cards: dict[str, dict[int, Card]] = {}
        self.peers: dict[tuple[str, str], Peers] = {}
        self.flags: dict[tuple[str, str, int], _Flag] = {}
        self._width: dict[str, float] = {}
        self._learned: set[str] = set()
        self._last: dict[tuple[str, int, str], float] = {}  # (run, rank, source) -> time
        self._newest: dict[str, float] = {}
        self._buckets: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
        # the newest scored bucket's samples: a card of it arriving late is scored with them
        self._scored: dict[tuple[str, str], tuple[float, dict[int, float]]] = {}
        # (outlier, clean, the start of the newest bucket counted) in a row, per card
        self._streak: dict[tuple[str, str, int], tuple[int, int, float]] = {}
        self._ecc_last: dict[tuple[str, int, str], float] = {}
        self.ecc: dict[tuple[str, int, str], tuple[float, float, float]] = {}  # since, last, +n
        self._throttle: dict[tuple[str, int], tuple[int, float, int]] = {}  # count, since, mask
        self.rejected = 0  # samples with a non-finite time

    # --- intake ------------------------------------------------------------------------------

    def add(self, records: Iterable[TelemetryLike]) -> None:
        for rec in records:
            if not math.isfinite(rec.time):
                self.rejected += 1
                continue
            self._add(rec)

    def _add(self, rec: TelemetryLike) -> None:
        run, rank, t = rec.run, rec.rank, rec.time
        card = self.cards.setdefault(run, {}).get(rank)
        if card is None:
            card = self.cards[run][rank] = Card()
        if t >= card.time:
            card.time = t
            card.host = rec.host or card.host
            if rec.device and rec.source != "host":
                card.device = rec.device
            card.values.update(rec.values)
            card.labels.update(rec.labels)
        self._newest[run] = max(self._newest.get(run, t), t)
        self._learn(run, rank, rec.source, t)
        width = self._width.get(run, self.config.interval_s)
        b = int(t // width)
        for name, value in rec.values.items():
            if name in tm.BY_NAME:
                self._flags_of(run, rank, name, value, t)
                known = tm.BY_NAME[name]
                if (known.rule is not None or known.peers) and math.isfinite(value):
                    buckets = self._buckets.setdefault((run, name), {})
                    buckets.setdefault(b, {})[rank] = value

    def _learn(self, run: str, rank: int, source: str, t: float) -> None:
        key = (run, rank, source)
        last = self._last.get(key)
        self._last[key] = t
        if run in self._learned or last is None or not t > last:
            return
        self._learned.add(run)
        width = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, round(t - last)))
        if width != self._width.get(run, self.config.interval_s):
            self._width[run] = width
            for store in (self._buckets, self._scored):
                for k in [k for k in store if k[0] == run]:
                    del store[k]  # bucketed at the old width: start again

    def _flags_of(self, run: str, rank: int, name: str, value: float, t: float) -> None:
        if name in tm.ECC_COUNTERS:
            key = (run, rank, name)
            prev = self._ecc_last.get(key)
            if math.isfinite(value):
                self._ecc_last[key] = value
            if prev is not None and value > prev:
                held = self.ecc.get(key)
                since, added = (held[0], held[2]) if held is not None else (t, 0.0)
                self.ecc[key] = (since, t, added + value - prev)
        elif name == tm.THROTTLE_MASK:
            # samples in a row with the same slowdown reasons: a new reason starts again
            mask = int(value) & sum(tm.THROTTLE_BITS) if math.isfinite(value) else 0
            count, since, before = self._throttle.get((run, rank), (0, t, 0))
            same = bool(mask) and mask == before
            self._throttle[(run, rank)] = (
                (count + 1, since, mask) if same else (int(bool(mask)), t, mask)
            )

    # --- scoring -----------------------------------------------------------------------------

    def evaluate(self) -> list[Finding]:
        """Score the buckets that closed since the last call; every condition that holds."""
        for key, buckets in self._buckets.items():
            run = key[0]
            width = self._width.get(run, self.config.interval_s)
            edge = self._newest.get(run, -math.inf) - 0.5 * width
            for b in sorted(buckets):
                if (b + 1) * width <= edge or len(buckets) > self.config.open_buckets:
                    self._score(key, b * width, buckets.pop(b))
        return self._node_level(self._findings())

    def _score(self, key: tuple[str, str], start: float, values: dict[int, float]) -> None:
        cfg = self.config
        before = self._scored.get(key)
        if before is not None and before[0] == start:
            values = {**before[1], **values}  # late cards of the newest scored bucket join it
        if before is None or start >= before[0]:
            self._scored[key] = (start, values)
        if len(values) < cfg.min_ranks:
            return
        run, name = key
        m = tm.BY_NAME[name]
        ranks = np.fromiter(values, np.int64, len(values))
        x = np.fromiter(values.values(), np.float64, len(values))
        median = float(np.median(x))
        mad = float(np.median(np.abs(x - median)))
        rule = MetricRule(m.direction, rel_floor=m.rel_floor, abs_floor=m.abs_floor)
        scale = robust_scale(_DIVERGENCE, rule, len(x), median, mad, 0.0)
        z = (x - median) / scale
        if m.direction != "low":
            bad = (z >= cfg.z_threshold) & (x - median >= m.gap) & (x >= median * m.ratio)
        else:
            bad = (z <= -cfg.z_threshold) & (median - x >= m.gap) & (x <= median * m.ratio)
        rl, zl = ranks.tolist(), z.tolist()
        prev = self.peers.get(key)
        # a bucket of late cards (a rank that connected late) scored after a newer one is not
        # the run's latest view: the leaders stay the newer bucket's; late cards of that same
        # bucket, scored again on their own, leave it to the fuller view
        if prev is None or start > prev.time or (start == prev.time and len(x) >= prev.n):
            self.peers[key] = Peers(median, len(x), start, dict(zip(rl, zl, strict=True)))
        if m.rule is None:
            return  # context only (power): its median, never a flag
        for rank, is_bad, value, zi in zip(rl, bad.tolist(), x.tolist(), zl, strict=True):
            fkey = (run, name, rank)
            outl, clean, counted = self._streak.get(fkey, _NO_STREAK)
            if start <= counted:
                continue  # this card's bucket is counted already (its cards scored again)
            outl, clean = (outl + 1, 0) if is_bad else (0, clean + 1)
            self._streak[fkey] = (outl, clean, start)
            flag = self.flags.get(fkey)
            if flag is not None:
                if clean >= cfg.clear_buckets:
                    del self.flags[fkey]
                elif is_bad:
                    flag.value, flag.median, flag.z = value, median, zi
            elif outl >= cfg.confirm_buckets:
                since = start - (outl - 1) * self._width.get(run, cfg.interval_s)
                self.flags[fkey] = _Flag(since, value, median, zi)

    def _findings(self) -> list[Finding]:
        out: list[Finding] = []
        for (run, name, rank), flag in self.flags.items():
            m = tm.BY_NAME[name]
            assert m.rule is not None
            n = self.peers[(run, name)].n if (run, name) in self.peers else 0
            words = outlier_words(m, flag.value, flag.median, n)
            if name == tm.CLOCK:
                words += power_words(self, run, rank)
            msg = f"rank {rank} ({where(self.card(run, rank))}): {words}"
            out.append(Finding(m.rule, run, rank, name, flag.value, msg, flag.since))
        for (run, rank, name), (since, last, added) in self.ecc.items():
            if self._newest.get(run, last) - last > self.config.ecc_hold_s:
                continue
            total = self._ecc_last.get((run, rank, name), math.nan)
            msg = (f"rank {rank} ({where(self.card(run, rank))}): uncorrectable ECC errors "
                   f"+{added:g} (now {total:g})")  # fmt: skip
            out.append(Finding("hw_ecc", run, rank, name, total, msg, since))
        shared = self._shared_bits()
        for run, cards in self.cards.items():
            for rank, card in cards.items():
                ok = card.values.get(tm.HEALTH_OK)
                if ok is not None and ok == 0.0:
                    word = card.labels.get(tm.HEALTH_LABEL) or "not OK"
                    msg = f"rank {rank} ({where(card)}): health {word}"
                    out.append(Finding("hw_health", run, rank, tm.HEALTH_OK, ok, msg, card.time))
                reasons = self.throttle_reasons(run, rank, shared.get(run, 0))
                if reasons:
                    since = self._throttle[(run, rank)][1]
                    msg = f"rank {rank} ({where(card)}): clock slowdown: {', '.join(reasons)}"
                    mask = card.values.get(tm.THROTTLE_MASK)
                    out.append(Finding("hw_throttle", run, rank, tm.THROTTLE_MASK, mask, msg,
                                       since))  # fmt: skip
        return out

    def throttle_reasons(self, run: str, rank: int, shared: int | None = None) -> list[str]:
        """The slowdown reasons that count for ``rank`` now (confirmed, not shared by most)."""
        count = self._throttle.get((run, rank), (0, 0.0, 0))[0]
        if count < self.config.throttle_samples:
            return []
        card = self.card(run, rank)
        mask = int(card.values.get(tm.THROTTLE_MASK, 0.0) or 0)
        if shared is None:
            shared = self._shared_bits().get(run, 0)
        return tm.throttle_words(mask & ~shared)

    def _shared_bits(self) -> dict[str, int]:
        """Per run: the bits of SHARED_OK_BITS that at least half of its cards have set."""
        out: dict[str, int] = {}
        for run, cards in self.cards.items():
            masks = [int(c.values[tm.THROTTLE_MASK]) for c in cards.values()
                     if math.isfinite(c.values.get(tm.THROTTLE_MASK, math.nan))]  # fmt: skip
            bits = 0
            for bit in tm.THROTTLE_BITS:
                if bit & tm.SHARED_OK_BITS and 2 * sum(1 for m in masks if m & bit) >= len(masks):
                    bits |= bit
            out[run] = bits if masks else 0
        return out

    def _node_level(self, found: list[Finding]) -> list[Finding]:
        cfg = self.config
        groups: dict[tuple[str, str, str, str], list[Finding]] = {}
        for f in found:
            host = self.card(f.run, f.rank).host if f.rank is not None else ""
            if host:
                groups.setdefault((f.run, f.rule, f.metric, host), []).append(f)
        out = list(found)
        for (run, rule, metric, host), members in groups.items():
            on_host = [r for r, c in self.cards.get(run, {}).items() if c.host == host]
            n = len(members)
            if n < cfg.node_min_ranks or n < cfg.node_fraction * len(on_host):
                continue
            if len(on_host) >= len(self.cards.get(run, {})):
                continue  # the whole run is on this host: no node to tell apart
            ranks = tuple(sorted(f.rank for f in members if f.rank is not None))
            gone = set(map(id, members))
            out = [f for f in out if id(f) not in gone]
            first = min(members, key=lambda f: f.since_time)
            what = first.message.split(": ", 1)[-1]
            msg = (f"node {host}: {n} of {len(on_host)} cards ({_span(ranks)}) {rule_words(rule)}"
                   f"; rank {first.rank}: {what}")  # fmt: skip
            out.append(Finding("hw_node", run, None, f"{metric}@{host}", first.value, msg,
                               first.since_time, ranks, host))  # fmt: skip
        return out

    # --- reading -----------------------------------------------------------------------------

    def card(self, run: str, rank: int) -> Card:
        return self.cards.get(run, {}).get(rank) or Card()

    def width(self, run: str) -> float:
        return self._width.get(run, self.config.interval_s)

    def forget(self, run: str) -> None:
        self.cards.pop(run, None)
        self._width.pop(run, None)
        self._newest.pop(run, None)
        self._learned.discard(run)
        stores: tuple[dict[Any, Any], ...] = (
            self.peers, self.flags, self._last, self._buckets, self._scored, self._streak,
            self._ecc_last, self.ecc, self._throttle,
        )  # fmt: skip
        for store in stores:
            for key in [k for k in store if k[0] == run]:
                del store[key]


def rule_words(rule: str) -> str:
    return {
        "hw_hot": "hotter than their peers",
        "hw_clock": "slower-clocked than their peers",
        "hw_load": "more loaded than their peers",
        "hw_ecc": "counting uncorrectable ECC errors",
        "hw_health": "not healthy",
        "hw_throttle": "slowing their clocks down",
    }.get(rule, rule)


def _span(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and ranks[-1] - ranks[0] == len(ranks) - 1:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
