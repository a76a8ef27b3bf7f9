"""examples/lightning_ddp.py with each rank's losses computed a second way, for the e2e test.

The example runs unchanged except that its module's ``training_step`` also computes the loss of
the batch itself (float64 log-softmax of the same weights' logits, no autograd) and keeps it by
the optimizer step it belongs to. Each rank writes ``expected_rank<k>.json`` into
``EXPECT_DIR`` at the end. Lightning starts rank 1 by running this script again.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_ddp.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("lightning_ddp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    example = load_example()
    torch = example.torch
    expected: dict[int, float] = {}
    ranks: list[int] = []

    class Checked(example.Classifier):  # type: ignore[misc,name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            x, y = batch
            with torch.no_grad():
                logp = torch.log_softmax(self.net(x).double(), dim=1)
                own = -logp[torch.arange(len(y)), y].mean()
            expected[self.global_step + 1] = float(own)  # logged at the step it makes
            if not ranks:
                ranks.append(self.global_rank)
            return loss

    example.Classifier = Checked
    example.main()
    out = Path(os.environ["EXPECT_DIR"]) / f"expected_rank{ranks[0]}.json"
    out.write_text(json.dumps(expected), encoding="utf-8")


if __name__ == "__main__":
    main()
