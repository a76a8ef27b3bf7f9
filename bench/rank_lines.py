"""Rank entries with a one-line crash message: 4,096 crashed ranks, each with its own copy of a
MindSpore kernel error (32 lines, ~500 characters), built as the rank table is: the first build
cuts every message (``one_line``), later builds find them cut. Against the same entries with no
``message_line`` (``rank_entry`` minus the line), same run.

    python bench/rank_lines.py [--ranks 4096] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rankwatch.aggregator import feed
from rankwatch.aggregator.feed import rank_entry
from rankwatch.aggregator.health import RankHealth, RankState

FIXTURE = (
    Path(__file__).parents[1] / "tests" / "fixtures" / "crashes" / "mindspore_allreduce_kernel.txt"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    text = FIXTURE.read_text().split("RuntimeError: ", 1)[1]
    health = [
        RankHealth("job", r, RankState.CRASHED, f"n{r // 8}", r, args.ranks, 19, 0.0, 0.0,
                   f"crashed: builtins.RuntimeError: {text} rank {r} at step 19", 0, 0.1, 0.0,
                   None, 0.0)
        for r in range(args.ranks)
    ]  # fmt: skip

    def build() -> float:
        t = time.perf_counter()
        for h in health:
            rank_entry(h, {"loss": 1.0}, {}, [], [])
        return time.perf_counter() - t

    first = build()
    later = min(build() for _ in range(args.repeat))
    line = feed.message_line
    feed.message_line = lambda message, crashed=False: ""  # the entry without the cut
    try:
        base = min(build() for _ in range(args.repeat))
    finally:
        feed.message_line = line
    print(f"{args.ranks} crashed rank entries: first build {first * 1e3:.0f} ms, later builds "
          f"{later * 1e3:.1f} ms; without message_line {base * 1e3:.1f} ms "
          f"(later / without: {later / base:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
