"""examples/torch_ddp.py with one fault injected on one rank, for the incident tests.

The example is run unchanged except for its batch function, wrapped to count steps: from step
``FAULT_STEP`` on, rank ``FAULT_RANK`` gets an infinite input (``nan``: its loss is NaN, and
DDP's all-reduce spreads it to every rank's weights, so the others go NaN one step later),
raises (``crash``) or sleeps forever (``hang``). ``GLOO_TIMEOUT_S`` bounds the process group's
collectives so a hang ends in the peers' timeouts within seconds, not torch's default 30 minutes.
Run by torchrun: ``torchrun --nproc-per-node=3 tests/e2e/torch_fault_job.py --steps 40``.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_ddp.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("torch_ddp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    fault = os.environ["FAULT"]
    fault_rank = int(os.environ["FAULT_RANK"])
    fault_step = int(os.environ["FAULT_STEP"])
    timeout = datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "10")))
    rank = int(os.environ["RANK"])
    example = load_example()
    clean_batch = example.batch
    step = 0

    def batch(generator: Any, teacher: Any) -> Any:
        nonlocal step
        step += 1
        x, y = clean_batch(generator, teacher)
        if rank != fault_rank or step < fault_step:
            return x, y
        if fault == "nan":
            x[0, 0] = float("inf")
        elif fault == "crash":
            raise RuntimeError(f"injected fault: rank {rank} crashed at step {step}")
        elif fault == "hang" and step == fault_step:
            print(f"rank {rank}: injected hang at step {step}", flush=True)
            while True:
                time.sleep(3600)
        return x, y

    init = example.dist.init_process_group
    example.batch = batch
    example.dist.init_process_group = lambda backend: init(backend, timeout=timeout)
    example.main()


if __name__ == "__main__":
    main()
