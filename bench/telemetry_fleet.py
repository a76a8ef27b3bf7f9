"""Hardware outliers at scale: a fleet of cards with injected faults (a hot card, a throttled
card, an ECC burst, a whole node slow) through the hardware watch; prints which cards and nodes
it named, the false flags per 10^6 rank-samples on clean telemetry, and the watch's cost per
rank-sample against building the same records (the baseline, measured in the same run).

    python bench/telemetry_fleet.py --ranks 1024 --samples 60 --clean-samples 600

Also the generator of the fleet's telemetry for tests/bench/test_telemetry_fleet.py.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rankwatch.agent.wire.records import TelemetryRecord
from rankwatch.aggregator.telemetry.outliers import Finding, HardwareConfig, HardwareWatch

INTERVAL_S = 10.0
PER_HOST = 8
START = 1_700_000_000.0


@dataclass(frozen=True)
class Fault:
    kind: str  # hot | throttle | ecc | node
    target: int  # a rank, or a host index for "node"
    at: int  # first sample it shows in


DEFAULT_FAULTS = (Fault("hot", 77, 5), Fault("throttle", 300, 5), Fault("ecc", 513, 8),
                  Fault("node", 90, 5))  # fmt: skip


def parse_faults(text: str) -> tuple[Fault, ...]:
    """``hot:77@5,throttle:300@5,ecc:513@8,node:90@5`` (node: a host index)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, rest = part.partition(":")
        target, _, at = rest.partition("@")
        if kind not in ("hot", "throttle", "ecc", "node"):
            raise ValueError(f"fault {part!r}: kind must be hot, throttle, ecc or node")
        out.append(Fault(kind, int(target), int(at or 0)))
    return tuple(out)


class Fleet:
    """Cards with their own steady offsets (a slot nearer the fan runs cooler) and noise."""

    def __init__(self, ranks: int, faults: Sequence[Fault] = (), seed: int = 0) -> None:
        self.ranks = ranks
        self.faults = tuple(faults)
        self.rnd = random.Random(seed)
        self.offset = [self.rnd.uniform(-4.0, 4.0) for _ in range(ranks)]
        self.phase = [self.rnd.uniform(0, INTERVAL_S) for _ in range(ranks)]
        self.seq = [0] * ranks
        self.ecc = [0.0] * ranks

    def host(self, rank: int) -> str:
        return f"node{rank // PER_HOST:03d}"

    def sample(self, i: int) -> list[TelemetryRecord]:
        g = self.rnd.gauss
        out = []
        active = [f for f in self.faults if i >= f.at]
        for rank in range(self.ranks):
            v = {
                "gpu/temp_c": 66.0 + self.offset[rank] + g(0, 1.2),
                "gpu/sm_clock_mhz": 1980.0 + g(0, 8),
                "gpu/util_pct": min(100.0, 95.0 + g(0, 2)),
                "gpu/mem_used_bytes": 61e9 + g(0, 3e8),
                "gpu/mem_total_bytes": 80e9,
                "gpu/power_w": 640.0 + g(0, 20),
                "gpu/throttle_mask": 0.0,
                "gpu/ecc_uncorrected_total": self.ecc[rank],
            }
            labels: dict[str, str] = {}
            for f in active:
                if f.kind == "hot" and f.target == rank:
                    v["gpu/temp_c"] = 93.0 + g(0, 1)
                elif f.kind == "throttle" and f.target == rank:
                    v["gpu/throttle_mask"] = float(0x40 | 0x80)
                    v["gpu/sm_clock_mhz"] = 1450.0 + g(0, 10)
                    labels["gpu/throttle"] = "sw_thermal,hw_thermal"
                elif f.kind == "ecc" and f.target == rank and i == f.at:
                    self.ecc[rank] += 12.0
                    v["gpu/ecc_uncorrected_total"] = self.ecc[rank]
                elif f.kind == "node" and rank // PER_HOST == f.target:
                    v["gpu/sm_clock_mhz"] = 1200.0 + g(0, 10)
                    v["gpu/power_w"] = 420.0 + g(0, 10)
            self.seq[rank] += 1
            t = START + i * INTERVAL_S + self.phase[rank]
            card = ("gpu", f"gpu:{rank % PER_HOST}", v, labels)
            out.append(TelemetryRecord("fleet", rank, self.seq[rank], t, self.host(rank),
                                       1000 + rank, *card))  # fmt: skip
        return out


def expected(faults: Iterable[Fault]) -> set[tuple[str, int | str]]:
    """What the watch should name for each fault, and nothing else."""
    out: set[tuple[str, int | str]] = set()
    for f in faults:
        if f.kind == "hot":
            out.add(("hw_hot", f.target))
        elif f.kind == "throttle":
            out |= {("hw_throttle", f.target), ("hw_clock", f.target)}
        elif f.kind == "ecc":
            out.add(("hw_ecc", f.target))
        else:
            out.add(("hw_node", f"node{f.target:03d}"))
    return out


def named(found: Iterable[Finding]) -> set[tuple[str, int | str]]:
    return {(f.rule, f.rank if f.rank is not None else f.host) for f in found}


def run(ranks: int, samples: int, faults: Sequence[Fault], seed: int = 0) -> dict[str, object]:
    """Every finding's (rule, rank or host) named over the run, and the first sample each
    injected fault was named at."""
    fleet = Fleet(ranks, faults, seed)
    watch = HardwareWatch(HardwareConfig())
    seen: set[tuple[str, int | str]] = set()
    onsets = 0
    held: set[tuple[str, int | str]] = set()
    first: dict[tuple[str, int | str], int] = {}
    build = work = 0.0
    for i in range(samples):
        t0 = time.perf_counter()
        recs = fleet.sample(i)
        t1 = time.perf_counter()
        watch.add(recs)
        now = named(watch.evaluate())
        t2 = time.perf_counter()
        build, work = build + t1 - t0, work + t2 - t1
        onsets += len(now - held)
        for key in now - held:
            first.setdefault(key, i)
        held = now
        seen |= now
    return {"named": seen, "onsets": onsets, "first": first, "build_s": build, "watch_s": work}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=60, help="samples with faults (10 s each)")
    ap.add_argument("--clean-samples", type=int, default=300, help="samples of clean telemetry")
    ap.add_argument(
        "--faults", default="", help="default: hot:77@5,throttle:300@5,ecc:513@8,node:90@5"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    faults = parse_faults(args.faults) if args.faults else DEFAULT_FAULTS
    want = expected(faults)
    res = run(args.ranks, args.samples, faults, args.seed)
    got = res["named"]
    assert isinstance(got, set)
    print(f"faults at {args.ranks} ranks, {args.samples} samples: named {sorted(got, key=str)}")
    print(f"  missed: {sorted(want - got, key=str) or 'none'}; "
          f"others named: {sorted(got - want, key=str) or 'none'}")  # fmt: skip
    first = res["first"]
    assert isinstance(first, dict)
    for key in sorted(want & got, key=str):
        print(f"  {key}: named at sample {first[key]}")
    clean = run(args.ranks, args.clean_samples, (), args.seed + 1)
    rank_samples = args.ranks * args.clean_samples
    onsets = clean["onsets"]
    assert isinstance(onsets, int)
    print(f"clean: {onsets} false flags in {rank_samples:,} rank-samples = "
          f"{onsets / rank_samples * 1e6:.2f} per 10^6 rank-samples")  # fmt: skip
    build, work = float(clean["build_s"]), float(clean["watch_s"])  # type: ignore[arg-type]
    print(f"cost: {work / rank_samples * 1e6:.2f} us per rank-sample in the watch, "
          f"{build / rank_samples * 1e6:.2f} us to build the record (baseline): "
          f"ratio {work / build:.2f}")  # fmt: skip
    return 0 if want == got else 1


if __name__ == "__main__":
    raise SystemExit(main())
