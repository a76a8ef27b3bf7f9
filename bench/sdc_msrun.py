"""Silent data corruption in the real 4-rank msrun job: the smallest gradient error flagged.

    python bench/sdc_msrun.py [--eps 1.0,0.5,0.4,0.3,0.2,0.1] [--steps 60] [--fault-step 20]
                              [--within 20] [--keep DIR]

One real ``rankwatch serve``; for the clean run (``--fault none``) and then each EPS, largest
first, one msrun job of ``demo/train_mindspore.py`` (4 CPU ranks, same seed and steps) whose
rank 2 scales its local gradients by 1 + EPS before the all-reduce from ``--fault-step`` on
(``--fault sdc``). The divergences come from serve's live stream (``/api/stream``), as the page
gets them. Per run: flagged or not within ``--within`` steps of the onset, which rank, the delay
(1 = flagged on the first bad step), which metric, and every other flag (false). The clean run
gives the noise: the cross-rank relative spread of ``grad_norm_local`` (1.4826 MAD / median per
step) and the standard deviation of a rank's log ratio to the median of the others, per step and
over ``--within`` steps (what a persistent offset must beat). The smallest EPS is reported
against it. Each job takes about a minute on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rankwatch.aggregator.divergence.config import DEFAULT_RULES, DivergenceConfig
from rankwatch.aggregator.divergence.detector import DivergenceDetector
from rankwatch.aggregator.merge import StepValues
from serve_proc import ServeProc

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "demo" / "train_mindspore.py"
RANKS = 4
FAULT_RANK = 2
METRIC = "grad_norm_local"
JOB_TIMEOUT_S = 400.0
HTTP_READY_S = 60.0
SETTLE_S = 4.0  # after the job: serve's last merge expiry and tick


class Flags:
    """Every new divergence of serve's live stream, by run, in arrival order."""

    def __init__(self, serve: ServeProc) -> None:
        self.by_run: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, args=(serve,), daemon=True).start()

    def _read(self, serve: ServeProc) -> None:
        for event, data in serve.stream(timeout_s=3600.0):
            if event != "feed":
                continue
            for msg in json.loads(data):
                if msg.get("type") == "divergence" and msg.get("state") == "new":
                    with self.lock:
                        self.by_run.setdefault(msg["run"], []).append(msg)

    def of(self, run: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.by_run.get(run, []))


def run_job(
    args: argparse.Namespace, serve: ServeProc, run: str, work: Path, extra: list[str]
) -> int:
    msrun = shutil.which("msrun", path=str(Path(sys.executable).parent)) or "msrun"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        RANKWATCH_RUN=run,
        RANKWATCH_ADDR=f"127.0.0.1:{serve.ingest_port}",
        RANKWATCH_LOG_DIR=str(work / "jsonl"),
        MS_NODE_TIMEOUT="60",
    )
    with socket.socket() as sock:  # a free port for msrun's scheduler
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        msrun, f"--worker_num={RANKS}", f"--local_worker_num={RANKS}", "--master_addr=127.0.0.1",
        f"--master_port={port}", f"--log_dir={work / 'msrun' / run}", "--join=True", str(TRAIN),
        "--steps", str(args.steps), "--fault-rank", str(FAULT_RANK),
        "--fault-step", str(args.fault_step), "--seed", str(args.seed), *extra,
    ]  # fmt: skip
    with open(work / f"{run}.log", "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=JOB_TIMEOUT_S)
        finally:  # msrun's workers are in its process group: none outlives the job
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(serve: ServeProc) -> None:
    deadline = time.monotonic() + HTTP_READY_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            serve.get("/api/status")
            return
        time.sleep(0.25)
    raise SystemExit(f"rankwatch serve did not answer HTTP within {HTTP_READY_S:g} s")


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def read_metrics(path: Path) -> dict[str, dict[int, dict[int, float]]]:
    """metric -> step -> rank -> value from a run's JSONL files."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for file in sorted(path.glob("rank*.jsonl")):
        rank = int(file.stem.removeprefix("rank"))
        for line in file.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("kind") != "step":
                continue
            for name, value in (rec.get("metrics") or {}).items():
                out.setdefault(name, {}).setdefault(int(rec["step"]), {})[rank] = float(value)
    return out


def without_offset_test() -> DivergenceConfig:
    """The detector's defaults with no metric's persistent-offset test: the baseline."""
    rules = {m: replace(rule, offset_steps=None) for m, rule in DEFAULT_RULES.items()}
    return DivergenceConfig(rules=rules)


def replay(
    run: str, series: dict[str, dict[int, dict[int, float]]], cfg: DivergenceConfig
) -> list[dict[str, Any]]:
    """The divergences ``cfg``'s detector raises on the run's records, step by step."""
    detector = DivergenceDetector(cfg)
    out = []
    for metric, steps in sorted(series.items()):
        for step in sorted(steps):
            values = dict(sorted(steps[step].items()))
            sv = StepValues(run, metric, step, values, RANKS, len(values) == RANKS)
            out += [asdict(d) for d in detector.update(sv).new]
    return out


def noise(series: dict[int, dict[int, float]], within: int) -> dict[str, float]:
    """Cross-rank noise of a clean run: the median step's relative spread (1.4826 MAD /
    median), and the standard deviation of a rank's log ratio to the median of the others per
    step and averaged over ``within`` steps (from non-overlapping windows)."""
    spreads, logs = [], {r: [] for r in range(RANKS)}
    for step in sorted(series):
        row = series[step]
        if len(row) != RANKS:
            continue
        vals = list(row.values())
        med = statistics.median(vals)
        spreads.append(1.4826 * statistics.median(abs(v - med) for v in vals) / med)
        for r, v in row.items():
            others = statistics.median(x for q, x in row.items() if q != r)
            logs[r].append(math.log(v / others))
    flat = [x for xs in logs.values() for x in xs]
    means = [
        statistics.fmean(xs[i : i + within])
        for xs in logs.values()
        for i in range(0, len(xs) - within + 1, within)
    ]
    return {
        "spread": statistics.median(spreads),
        "log_sd": statistics.pstdev(flat),
        "log_sd_window": statistics.pstdev(means) if len(means) > 1 else math.nan,
        "windows": len(means),
    }


def verdict(flags: list[dict[str, Any]], args: argparse.Namespace, faulty: bool) -> dict[str, Any]:
    """The first flag of the faulty rank within the window, and every flag that is false."""
    hit, false = None, []
    for f in sorted(flags, key=lambda f: f["step"]):
        ok = faulty and f["rank"] == FAULT_RANK and f["step"] >= args.fault_step
        if ok and hit is None and f["step"] - args.fault_step + 1 <= args.within:
            hit = f
        elif not ok:
            false.append(f)
    return {"hit": hit, "false": false}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", default="1.0,0.5,0.4,0.3,0.2,0.1")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--fault-step", type=int, default=20)
    parser.add_argument("--within", type=int, default=20, help="flagged within this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="keep JSONL and logs here")
    args = parser.parse_args()
    eps_list = sorted({float(e) for e in args.eps.split(",")}, reverse=True)
    if args.steps < args.fault_step + args.within - 1:
        parser.error("--steps must cover --fault-step + --within - 1")
    work = args.keep or Path(tempfile.mkdtemp(prefix="sdc-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tag = time.strftime("%H%M%S")
    rows: list[tuple[str, dict[str, Any], float]] = []
    base_rows: list[tuple[str, dict[str, Any], float]] = []
    baseline = without_offset_test()
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, _on_sigterm)
    with ServeProc(work / "data") as serve:
        wait_http(serve)
        flags = Flags(serve)
        time.sleep(1.0)  # the stream is subscribed before the first job
        jobs = [("none", None)] + [("sdc", e) for e in eps_list]
        clean_series: dict[int, dict[int, float]] = {}
        for fault, eps in jobs:
            run = f"sdc-{tag}-clean" if eps is None else f"sdc-{tag}-eps{eps:g}"
            extra = ["--fault", fault] + ([] if eps is None else ["--sdc-eps", str(eps)])
            started = time.monotonic()
            code = run_job(args, serve, run, work, extra)
            time.sleep(SETTLE_S)
            took = time.monotonic() - started
            if code != 0:
                raise SystemExit(f"msrun failed ({code}) for {run}: see {work / (run + '.log')}")
            series = read_metrics(work / "jsonl" / run)
            if eps is None:
                clean_series = series[METRIC]
            label = "clean" if eps is None else f"{eps:g}"
            rows.append((label, verdict(flags.of(run), args, eps is not None), took))
            print_row(*rows[-1], args, "serve")
            base = verdict(replay(run, series, baseline), args, eps is not None)
            base_rows.append((label, base, 0.0))
            print_row(*base_rows[-1], args, "no offset test")
    fig = noise(clean_series, args.within)
    print_summary(rows, fig, args, "serve (the detector as configured)")
    print_summary(base_rows, fig, args, "baseline: same records, detector without the offset test")
    print(f"{len(rows)} msrun jobs in {time.monotonic() - t0:.0f} s; logs in {work}")


def print_row(
    label: str, result: dict[str, Any], took: float, args: argparse.Namespace, who: str
) -> None:
    hit = result["hit"]
    if hit is None:
        said = "not flagged" if label != "clean" else "clean"
    else:
        delay = hit["step"] - args.fault_step + 1
        said = f"flagged rank {hit['rank']} on {hit['metric']} after {delay} steps"
        said += f" as {hit['kind']} (step {hit['step']}, {hit['rel']:.2f}x the median)"
    false = ", ".join(f"rank {f['rank']} {f['metric']} step {f['step']}" for f in result["false"])
    took_s = f"  [{took:.0f} s]" if took else ""
    print(f"eps {label:>6} {who:>14}: {said}; false flags: {false or 'none'}{took_s}", flush=True)


def print_summary(
    rows: list[tuple[str, dict[str, Any], float]],
    noise_fig: dict[str, float],
    args: argparse.Namespace,
    who: str,
) -> None:
    print(f"-- {who}")
    clean_false = rows[0][1]["false"]
    reliable = [
        float(label) for label, res, _ in rows[1:] if res["hit"] is not None and not res["false"]
    ]
    smallest = None  # the smallest EPS such that it and every larger one were flagged cleanly
    for label, res, _ in rows[1:]:
        if res["hit"] is None or res["false"]:
            break
        smallest = float(label)
    print(
        f"   noise of {METRIC} on the clean run: cross-rank relative spread "
        f"{noise_fig['spread']:.3f} (median step); a rank's log ratio to the others' median: "
        f"sd {noise_fig['log_sd']:.3f} per step, {noise_fig['log_sd_window']:.3f} averaged over "
        f"{args.within} steps ({noise_fig['windows']} windows)"
    )
    print(f"   clean run: {len(clean_false)} false flags")
    if smallest is None:
        print(f"   smallest EPS flagged within {args.within} steps: none of {args.eps}")
    else:
        per_step = math.log1p(smallest) / noise_fig["log_sd"]
        print(
            f"   smallest EPS flagged within {args.within} steps (it and every larger one, no "
            f"false flag): {smallest:g} = {per_step:.2f} x the per-step log-ratio sd "
            f"(flagged at all: {', '.join(f'{e:g}' for e in reliable) or 'none'})"
        )


if __name__ == "__main__":
    main()
