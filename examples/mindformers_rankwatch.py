"""Train with MindFormers (on Ascend, MindFormers installed as usual) and rankwatch on every rank.

Two ways, both with the ``RankwatchMonitor`` entry of ``mindformers_rankwatch.yaml`` in the
model's YAML ``callbacks:`` list:

1. This script in place of MindFormers' ``run_mindformer.py`` (it adds the entry if the YAML has
   none)::

       msrun --worker_num=8 --local_worker_num=8 --master_port=8118 --log_dir=msrun_log \\
           --join=True examples/mindformers_rankwatch.py --config path/to/your_model.yaml

2. MindFormers' own ``run_mindformer.py``, with this file as the register module: the entry's
   ``auto_register: mindformers_rankwatch.RankwatchMonitor`` makes MindFormers import this file
   from ``--register_path``::

       msrun ... run_mindformer.py --config your_model.yaml --register_path <rankwatch>/examples

Rank, world size, run name and the aggregator's address come from msrun as for any rankwatch
run (``RANKWATCH_RUN`` / ``RANKWATCH_ADDR`` override them).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rankwatch.agent.mindformers import RankwatchMonitor  # registers it with MindFormers

__all__ = ["RankwatchMonitor"]


def with_rankwatch(callbacks: Any) -> list[Any]:
    """The YAML's callback list with a ``RankwatchMonitor`` entry (added last if missing)."""
    entries = list(callbacks or [])
    if not any(dict(entry).get("type") == "RankwatchMonitor" for entry in entries):
        entries.append({"type": "RankwatchMonitor"})
    return entries


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the model's MindFormers YAML")
    parser.add_argument("--run_mode", default=None, help="train (default: the YAML's) or finetune")
    args = parser.parse_args(argv)

    from mindformers import MindFormerConfig, Trainer, build_context
    from mindformers.tools.register.template import ConfigTemplate
    from mindformers.utils import set_output_path

    # The YAML entry's auto_register (for run_mindformer.py) finds this file here.
    os.environ.setdefault("REGISTER_PATH", str(Path(__file__).resolve().parent))
    config = MindFormerConfig(args.config)
    if args.run_mode is not None:
        config.run_mode = args.run_mode
    config.callbacks = with_rankwatch(config.callbacks)
    config = ConfigTemplate.apply_template(config)  # as run_mindformer.py does
    set_output_path(config.output_dir)
    build_context(config)
    Trainer(config).train()


if __name__ == "__main__":
    main()
