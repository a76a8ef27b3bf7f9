"""CPU cost of each telemetry source, per sample and per hour at its interval.

    python bench/telemetry_cost.py [--samples 40] [--interval 10]

Each source is sampled ``--samples`` times the way the sampler thread does it (``sample()``,
then the record made, written to a JSONL file and queued: ``Monitor._sample``), timing the CPU
of this thread plus that of child processes (``npu-smi`` runs in its own). The baseline is the
same path for a source that returns two constant values: the fixed cost of a telemetry record.
Printed: the median CPU per sample, its ratio to the baseline, and the CPU per hour (and share
of one core) at ``--interval`` seconds (npu: at least its 10 s floor).

``npu`` runs against the stand-in ``npu-smi`` of the tests (tests/fixtures/npu_smi, a shell
script printing recorded output): a real one reads the driver and costs more per call, so the
figure is the agent's side of it (process start, pipes, parsing). ``gpu`` is measured where
NVML starts (an NVIDIA driver), else reported as not measured. ``memory`` reads nothing
without a framework using device memory: its cost there is the check alone.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwatch.agent.monitor import Monitor
from rankwatch.agent.sources import BUILTIN, Context, Source, SourceError
from rankwatch.agent.sources.base import NPU_MIN_INTERVAL_S

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "npu_smi"


class Constant:
    name = "baseline"
    interval_s = 10.0

    def sample(self, now: float) -> dict[str, float]:
        return {"a": 1.0, "b": 2.0}


def cpu_now() -> float:
    """This thread's CPU time plus that of finished child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


def measure(mon: Monitor, source: Source, samples: int) -> list[float]:
    """CPU seconds per sample (sample + record + JSONL + queue), one entry per sample."""
    out = []
    for _ in range(samples + 2):  # the first two: imports, reference points
        started = cpu_now()
        got = source.sample(time.time())
        mon._sample(source.name, got, time.time())
        out.append(cpu_now() - started)
        mon._queue.clear()  # type: ignore[union-attr]  # nobody drains it here
    return out[2:]


def stand_in_npu_smi(folder: Path) -> None:
    """Put the tests' stand-in npu-smi first on PATH (910 layout, card 0)."""
    tool = folder / "npu-smi"
    shutil.copy(FIXTURES / "standin.sh", tool)
    tool.chmod(0o755)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ['PATH']}"
    os.environ["NPU_SMI_DIR"] = str(FIXTURES / "910")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="telemetry-cost-"))
    if shutil.which("npu-smi") is None:
        stand_in_npu_smi(tmp)
    # an address nobody listens on: records are queued as for a live aggregator
    mon = Monitor(run="cost", log_dir=tmp / "logs", addr="127.0.0.1:9", telemetry="off")
    ctx = Context(tmp / "logs", tmp, dict(os.environ))
    sources: dict[str, Callable[[], Source]] = {"baseline": Constant}
    sources.update({name: (lambda f=f: f(args.interval, ctx)) for name, f in BUILTIN.items()})
    results: dict[str, Any] = {}
    for name, make in sources.items():
        try:
            results[name] = statistics.median(measure(mon, make(), args.samples))
        except SourceError as exc:
            results[name] = str(exc)
    mon.close()
    base = results["baseline"]
    print(f"{'source':<9} {'CPU/sample':>11} {'x baseline':>11} {'CPU/hour':>10} {'of a core':>10}")
    for name, value in results.items():
        if isinstance(value, str):
            print(f"{name:<9} not measured: {value}")
            continue
        interval = max(args.interval, NPU_MIN_INTERVAL_S) if name == "npu" else args.interval
        per_hour = value * 3600 / interval
        print(
            f"{name:<9} {value * 1e6:>9.0f} us {value / base:>10.1f}x {per_hour:>8.2f} s "
            f"{per_hour / 3600 * 100:>9.4f}%"
        )
    print(f"({args.samples} samples each, medians; interval {args.interval:g} s; "
          f"python {sys.version.split()[0]})")  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
