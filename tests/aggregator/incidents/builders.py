"""Values as the aggregator's pure parts hand them out, for the incident tests."""

from __future__ import annotations

from pathlib import Path

from rankwatch.aggregator.divergence.types import Divergence
from rankwatch.aggregator.health import RankHealth, RankState
from rankwatch.aggregator.incidents.stacks import Frame, StackSample

RUN = "job"
T0 = 1_700_000_000.0
CRASHES = Path(__file__).parents[2] / "fixtures" / "crashes"


def crash_text(name: str) -> str:
    return (CRASHES / name).read_text()


def health(
    rank: int,
    state: RankState = RankState.ALIVE,
    *,
    world: int = 4,
    step: int | None = 19,
    since: float = T0,
    progress: float = T0,
    message: str = "",
    run: str = RUN,
) -> RankHealth:
    return RankHealth(
        run, rank, state, f"node-{rank // 8}", 1000 + rank, world, step, since, T0 - 60,
        message, 0, 0.1, since, None, progress,
    )  # fmt: skip


def crashed(
    rank: int, text: str, *, world: int = 4, since: float = T0, step: int = 20
) -> RankHealth:
    # health's words for a crash event: "crashed: <exc type>: <str(exc)> at step N"; a whole
    # traceback (an imported stack file) goes in as it is
    exc, _, rest = text.partition(": ")
    if text.startswith("Traceback") or not rest:
        message = f"crashed: {text}"
    else:
        message = f"crashed: builtins.{exc}: {rest} at step {step}"
    return health(rank, RankState.CRASHED, world=world, step=step, since=since, message=message)


def nan(rank: int, step: int, metric: str = "loss", run: str = RUN) -> Divergence:
    return Divergence(
        run, metric, rank, "nonfinite", "high", step, step, float("nan"), 2.3, float("nan"),
        float("nan"), f"rank {rank} {metric} is non-finite", 4,
    )  # fmt: skip


def outlier(rank: int, step: int, metric: str = "loss", kind: str = "outlier") -> Divergence:
    return Divergence(
        RUN, metric, rank, kind, "high", step, step, 9.0, 2.3, 8.1, 3.9, f"rank {rank} {metric}", 4
    )


def stack(
    rank: int, where: str, frames: list[tuple[str, int, str]], *, time: float = T0, step: int = 19
) -> StackSample:
    sig = "sig-" + "|".join(f"{f}:{fn}" for f, _, fn in frames)[:28]
    return StackSample(
        RUN, rank, time, step, where, sig, tuple(Frame(*f) for f in frames), stalled_s=40.0
    )


IN_ALLREDUCE = [
    ("mindspore/common/api.py", 1891, "_exec_pip"),
    ("mindspore/nn/wrap/grad_reducer.py", 310, "AllReduce"),
    ("mindspore/train/model.py", 940, "_train_process"),
    ("job/train.py", 136, "main"),
]
IN_SLEEP = [
    ("job/train.py", 98, "on_train_step_begin"),
    ("mindspore/train/callback/_callback.py", 420, "on_train_step_begin"),
    ("mindspore/train/model.py", 930, "_train_process"),
    ("job/train.py", 136, "main"),
]
