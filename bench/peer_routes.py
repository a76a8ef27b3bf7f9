"""Cost per record of the receiver's per-sender bookkeeping and resend routes (``Peers``) at the
shapes of the largest jobs, beside another revision's ``Peers`` and a bare loop.

    python bench/peer_routes.py [--steps 5] [--repeats 3] [--baseline REV]

Each shape is ``ranks`` ranks of one run sent by connections of ``per`` ranks each, as one
``RanksBlock`` of up to ``frame`` ranks per frame and step (what a node's relay, or a load
generator's process socket, sends): ``Peers.get`` and ``Peers.saw`` per frame, as the receiver
calls them, ``--steps`` steps. CPU ns per record, median of ``--repeats`` fresh ``Peers``. The
bare loop is the least any route table does: a dict lookup per rank of every frame. Printed with
the routes evicted, the ranks capped per connection and the senders retired at the end, which say
whether every rank stayed reachable for a resend. ``--baseline REV``: that revision's
``aggregator/ingest/peers.py`` (``git show``), timed in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

from rankwatch.agent.wire.records import RanksBlock
from rankwatch.aggregator.ingest import peers as this_tree
from revision import module_at

# (ranks, ranks per connection, ranks per frame): relays of 8-card nodes at 4,096 and 100,000
# ranks; the soak's process sockets (2 per load) at both sizes
SHAPES = [(4096, 8, 8), (4096, 2048, 128), (100_000, 8, 8), (100_000, 50_000, 512)]


def frames(ranks: int, per: int, frame: int) -> list[tuple[bytes, list[RanksBlock]]]:
    out = []
    for k, first in enumerate(range(0, ranks, per)):
        blocks = []
        for lo in range(first, min(ranks, first + per), frame):
            rs = list(range(lo, min(first + per, lo + frame)))
            n = len(rs)
            blocks.append(RanksBlock(
                "run", ranks, rs, [1] * n, [0.0] * n, ["node"] * n, [1] * n, [1] * n,
                [None] * n, {"loss": [1.0] * n}, [0] * n,
            ))  # fmt: skip
        out.append((f"conn-{k}".encode(), blocks))
    return out


def timed(module: Any, conns: list[tuple[bytes, list[RanksBlock]]], steps: int) -> tuple:
    counts = {"routes_evicted": 0, "peer_ranks_capped": 0}
    peers = module.Peers(counts)
    n, t = 0, time.process_time()
    for _ in range(steps):
        for identity, blocks in conns:
            for block in blocks:
                peers.saw(identity, peers.get(identity), [block])
                n += len(block)
    cpu = time.process_time() - t
    return cpu / n * 1e9, counts["routes_evicted"], counts["peer_ranks_capped"], len(peers.retired)


def bare(conns: list[tuple[bytes, list[RanksBlock]]], steps: int) -> float:
    routes = {("run", r): identity for identity, blocks in conns for b in blocks for r in b.ranks}
    n, t = 0, time.process_time()
    for _ in range(steps):
        for identity, blocks in conns:
            for block in blocks:
                for rank in block.ranks:
                    if routes.get((block.run, rank)) != identity:
                        raise AssertionError
                n += len(block)
    return (time.process_time() - t) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", help="revision whose peers.py is timed beside this tree's")
    args = ap.parse_args()
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be at least 1")
    versions: list[tuple[str, Any]] = [("this tree", this_tree)]
    if args.baseline:
        try:
            before = module_at(args.baseline, "aggregator/ingest/peers.py")
            versions.insert(0, (args.baseline, before))
        except subprocess.CalledProcessError as exc:
            ap.error(f"--baseline {args.baseline}: {exc.stderr.strip()}")
    print(f"peer_routes: CPU ns per record, median of {args.repeats}, {args.steps} steps each")
    print(f"{'ranks':>7} {'per conn':>8} {'frame':>5} {'version':>10} {'ns/record':>9} "
          f"{'x bare':>7} {'evicted':>8} {'capped':>8} {'retired':>7}")  # fmt: skip
    for ranks, per, frame in SHAPES:
        conns = frames(ranks, per, frame)
        floor = statistics.median(bare(conns, args.steps) for _ in range(args.repeats))
        for name, module in versions:
            runs = [timed(module, conns, args.steps) for _ in range(args.repeats)]
            ns = statistics.median(r[0] for r in runs)
            _, evicted, capped, retired = runs[0]
            print(f"{ranks:>7,} {per:>8,} {frame:>5} {name:>10} {ns:>9.0f} {ns / floor:>6.1f}x "
                  f"{evicted:>8,} {capped:>8,} {retired:>7,}")  # fmt: skip
        print(f"{'':>7} {'':>8} {'':>5} {'bare loop':>10} {floor:>9.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
