"""Every GPU telemetry field on this machine, then a short torch job watched by rankwatch.

    python bench/gpu_telemetry.py [--seconds 20] [--interval 1]

1. For every GPU NVML sees: each field the gpu source reads (``sources.gpu.read_fields``), with
   the fields the GPU does not support named.
2. A torch job (matrix products on ``cuda:0``, one ``log()`` per step) with a real ``Monitor``
   (``telemetry="host,gpu,memory"`` every ``--interval`` s) sending to a real receiver in this
   process (``aggregator.ingest.receiver.Receiver`` on 127.0.0.1, port 0); printed: the
   telemetry records it decoded, per source, and the last one of each in full, beside the
   step count and the records the receiver refused (none expected).

Without nvidia-ml-py, an NVIDIA driver or a CUDA build of torch it says which is missing and
exits 0 (``--device cpu`` then still runs the job, without GPU values: a dry run of step 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def nvml_or_reason() -> tuple[Any, str]:
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install rankwatch[gpu])"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML did not start: {exc}"
    return pynvml, ""


def every_field(nvml: Any) -> None:
    from rankwatch.agent.sources.gpu import read_fields

    count = nvml.nvmlDeviceGetCount()
    print(f"NVML: driver {nvml.nvmlSystemGetDriverVersion()}, {count} GPU(s)")
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        skip: set[str] = set()
        values, labels = read_fields(nvml, handle, skip)
        print(f"gpu:{index} {nvml.nvmlDeviceGetName(handle)}")
        for key, value in values.items():
            print(f"    gpu/{key:<24} {value:,.6g}")
        for key, text in labels.items():
            print(f"    gpu/{key:<24} {text!r}")
        if skip:
            print(f"    not supported here: {', '.join(sorted(skip))}")


def torch_job(seconds: float, interval: float, where: str) -> int:
    try:
        import torch
    except ImportError:
        print("torch is not installed: no job run")
        return 0
    if where.startswith("cuda") and not torch.cuda.is_available():
        print("torch has no CUDA device (a CPU build?): no job run")
        return 0
    from rankwatch.agent.monitor import Monitor
    from rankwatch.agent.wire import records
    from rankwatch.aggregator.ingest.receiver import Receiver

    receiver = Receiver("127.0.0.1", 0)
    got: list[records.Record] = []
    device = torch.device(where)
    a = torch.randn(4096 if where.startswith("cuda") else 256, 4096, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(
            run="gpu-telemetry", rank=0, world_size=1, addr=f"tcp://127.0.0.1:{receiver.port}",
            log_dir=Path(tmp), telemetry=f"host,gpu,memory,{interval}s",
        )  # fmt: skip
        started, step = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            step += 1
            b = a @ a.T
            loss = (b.float().mean() / 4096).item()
            mon.log(step, loss=loss)
            got.extend(records.unblock(receiver.recv(0)))
        mon.close()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            got.extend(records.unblock(receiver.recv(100)))
    receiver.close()
    tele = [r for r in got if isinstance(r, records.TelemetryRecord)]
    steps = sum(isinstance(r, records.StepRecord) for r in got)
    print(f"\ntorch job: {step} steps logged in {seconds:g} s; the receiver decoded {steps} step")
    print(f"records and {len(tele)} telemetry records; refused: {receiver.counters()['reasons']}")
    for source in sorted({r.source for r in tele}):
        mine = [r for r in tele if r.source == source]
        last = mine[-1]
        print(f"  {source}: {len(mine)} records, device {last.device!r}; last:")
        print("    " + json.dumps({"values": dict(last.values), "labels": dict(last.labels)}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument(
        "--device", default="cuda:0", help="the job's torch device ('cpu': a dry run of the job)"
    )
    args = ap.parse_args()
    nvml, reason = nvml_or_reason()
    if nvml is None:
        print(f"no NVIDIA GPU to read here: {reason}")
        if args.device == "cpu":
            return torch_job(args.seconds, args.interval, "cpu")
        return 0
    every_field(nvml)
    nvml.nvmlShutdown()
    return torch_job(args.seconds, args.interval, args.device)


if __name__ == "__main__":
    sys.exit(main())
