"""False alarms of the divergence detector by world size: why the CUSUM limit grows with the ranks.

    python bench/false_alarms.py [--ranks 1024] [--steps 2000] [--seeds 2]

Every rank is one more chance of a false flag, so at one limit a run of 4,096 ranks raises 512x
as many false alarms as a run of 8. ``DivergenceConfig.grown_limit`` adds ``evidence_per_doubling``
to the limit per doubling of the ranks past ``evidence_ranks`` (8). This prints:

* a rank's false-flag rate on clean noise by limit: from the CUSUM's in-control run length
  (a Markov chain over the evidence, Brook & Evans 1972: z-scores N(0, 1), allowance 1.5, a
  step adding at most limit / 2), next to the real ``DivergenceDetector`` on ``--ranks`` ranks of
  gaussian noise at the limits where flags are frequent enough to count (3, 3.5, 4);
* per world size, the limit and the false alarms a run raises per hour at 5 steps/s and 6
  scored metrics, at one limit for every size (4.5, the baseline) and at the grown limit.

The model leaves out the ratio gate (a rank must also be 5 % away from the median), so it is the
rate of a metric whose noise is 5 % or more; quieter metrics raise fewer.
"""

from __future__ import annotations

import argparse

from divergence_cost import steps_of
from rankwatch.aggregator.divergence.budget import cusum_flag_rate
from rankwatch.aggregator.divergence.config import DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector

STEPS_PER_S = 5.0
METRICS = 6
WORLDS = (8, 64, 512, 1_024, 4_096)
MEASURED_LIMITS = (3.0, 3.5, 4.0)


def flag_rate(limit: float, allowance: float, confirm_steps: int) -> float:
    """False flags per rank-step, both directions, of the CUSUM on N(0, 1) z-scores (the
    detector's own model, ``budget.cusum_flag_rate``)."""
    return cusum_flag_rate(limit, allowance, confirm_steps)


def measured_rate(limit: float, ranks: int, steps: int, seeds: int) -> tuple[int, int]:
    """New divergences of the real detector on divergence_cost.py's clean noise (5 %
    gaussian, the same seeds): (flags, rank-steps)."""
    config = DivergenceConfig(evidence_limit=limit, evidence_per_doubling=0)
    flags = 0
    for seed in range(seeds):
        det = DivergenceDetector(config)
        for sv in steps_of(ranks, steps, seed=1_000 + seed):
            flags += len(det.update(sv).new)
    return flags, ranks * steps * seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1_024, help="ranks of the measured rows")
    ap.add_argument("--steps", type=int, default=2_000)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    cfg = DivergenceConfig()
    allowance, confirm = cfg.z_allowance, cfg.confirm_steps
    rate = {}
    print(
        "false flags per million rank-steps of clean noise (both directions), by CUSUM limit; "
        f"measured: {args.ranks:,} ranks x {args.steps:,} steps x {args.seeds} seeds"
    )
    print(f"{'limit':>6} {'model':>10} {'measured':>18}")
    for limit in sorted({*MEASURED_LIMITS, *(cfg.grown_limit(n) for n in WORLDS)}):
        rate[limit] = flag_rate(limit, allowance, confirm)
        line = f"{limit:6.2f} {rate[limit] * 1e6:10.4f}"
        if limit in MEASURED_LIMITS:
            flags, rank_steps = measured_rate(limit, args.ranks, args.steps, args.seeds)
            line += f" {flags / rank_steps * 1e6:10.4f} ({flags} flags)"
        print(line)
    per_hour = STEPS_PER_S * METRICS * 3600
    print(f"\nfalse alarms per run-hour at {STEPS_PER_S:g} steps/s x {METRICS} metrics "
          f"(model): one limit {cfg.evidence_limit:g} at every size (baseline) vs the limit "
          "grown with the ranks")  # fmt: skip
    print(f"{'ranks':>6} {'limit':>6} {'one limit':>10} {'grown':>8} {'ratio':>7}")
    base = rate[cfg.evidence_limit]
    for n in WORLDS:
        limit = cfg.grown_limit(n)
        flat, grown = base * n * per_hour, rate[limit] * n * per_hour
        print(f"{n:6,} {limit:6.2f} {flat:10.3f} {grown:8.3f} {grown / flat:7.3f}")


if __name__ == "__main__":
    main()
