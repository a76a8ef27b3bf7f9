"""One load-generator process: a block of simulated ranks (started by ``bench/loadgen.py``).

    python bench/loadgen_worker.py '<json spec>'

Protocol on stdio, one JSON object per line: the worker prints ``{"t": "ready"}`` once its sockets
exist, reads the wall time of step 1 from stdin, then prints ``{"t": "step", "step", "time",
"sent"}`` after each step and ``{"t": "done", ...}`` (counts, schedule lag) at the end.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from collections import deque
from typing import Any

import msgpack
import zmq
from loadgen import EXTRA_METRICS, METRICS, Fault, Model
from loadgen_cascade import Cascade, Noise
from rankwatch.agent.wire.records import MAX_FRAME_BYTES, frame_groups, version_of

RECORDS_PER_FRAME = 4_000  # shared-socket mode: records per frame before the size check
SNDHWM_FRAMES = 100_000  # generous: backlog shows up at the aggregator, not here
LINGER_MS = 30_000  # at the end, let ZeroMQ deliver what it holds
PID_BASE = 100_000  # simulated pids: PID_BASE + rank


def pack(records: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
    """Frames under MAX_FRAME_BYTES (halving a batch that packs too large), with record counts."""
    if not records:
        return []
    frame = msgpack.packb({"v": version_of(records), "records": records}, use_bin_type=True)
    if len(frame) <= MAX_FRAME_BYTES or len(records) == 1:
        return [(frame, len(records))]
    half = len(records) // 2
    return pack(records[:half]) + pack(records[half:])


class Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.run: str = spec["run"]
        self.world: int = spec["ranks"]
        self.rate: float = spec["rate"]
        self.steps = max(1, round(spec["duration"] * self.rate))
        self.faults = [Fault(**f) for f in spec["faults"]]
        self.model = Model(
            self.world, self.rate, spec["seed"], self.faults, int(spec["ranks_per_node"])
        )
        self.segments: list[tuple[int, int, str]] = [tuple(s) for s in spec["segments"]]
        self.per_rank = spec["sockets"] == "rank"
        self.node_frames = bool(spec.get("node_frames")) and not self.per_rank
        self.metrics = (*METRICS, *EXTRA_METRICS)[: int(spec.get("metrics", len(METRICS)))]
        self.hb_every = max(1, round(spec["heartbeat_s"] * self.rate))  # steps between beats
        self.heartbeat_s = float(spec["heartbeat_s"])
        telemetry_s = float(spec.get("telemetry_s", 0.0))
        # steps between a rank's telemetry samples (0: none)
        self.tele_every = max(1, round(telemetry_s * self.rate)) if telemetry_s > 0 else 0
        self.node = int(spec["ranks_per_node"])
        self.ranks = [r for lo, hi, _ in self.segments for r in range(lo, hi)]
        self.seq = {r: 0 for r in self.ranks}
        self.last_step: dict[int, int | None] = {r: None for r in self.ranks}
        self.hang = {f.rank: f.step for f in self.faults if f.kind == "hang"}
        self.lost = {f.rank: f.step for f in self.faults if f.kind == "lost"}
        self.cascade = Cascade(
            self.world, self.rate, spec["seed"], self.faults, Noise(**spec["noise"])
        )
        self.shuffle = random.Random(f"{spec['seed']}:{spec['index']}:order") if (
            spec["noise"]["shuffle"]
        ) else None  # fmt: skip
        self.over: set[int] = set()  # ranks whose process crashed or was killed
        self.held: dict[int, dict[int, list[dict[str, Any]]]] = {}  # tick -> socket -> records
        self.by_kind = {"step": 0, "event": 0, "heartbeat": 0, "telemetry": 0}
        self.records = self.frames = self.again = 0
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, len(self.ranks) + 64)
        self.socks: dict[int, zmq.Socket[bytes]] = {}  # rank (or segment lo) -> socket
        self.owner: dict[int, int] = {}  # rank -> key in socks
        per_node = spec["sockets"] == "node"
        for lo, hi, addr in self.segments:
            for r in range(lo, hi):  # a node's socket is keyed by its first rank in the segment
                self.owner[r] = (
                    r if self.per_rank else max(lo, r - r % self.node) if per_node else lo
                )
            for key in sorted({self.owner[r] for r in range(lo, hi)}):
                sock = self.ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.SNDHWM, SNDHWM_FRAMES)
                sock.setsockopt(zmq.LINGER, LINGER_MS)
                sock.connect(addr)
                self.socks[key] = sock
        self.pending: dict[int, deque[tuple[bytes, int]]] = {k: deque() for k in self.socks}

    # --- records -------------------------------------------------------------------------

    def _common(self, rank: int, kind: str, now: float) -> dict[str, Any]:
        self.seq[rank] += 1
        self.by_kind[kind] += 1
        now += self.cascade.offset[rank]  # this rank's clock
        return {"kind": kind, "run": self.run, "rank": rank, "seq": self.seq[rank], "time": now}

    def _event(self, rank: int, event: str, step: int | None, info: dict[str, Any], now: float):
        rec = self._common(rank, "event", now)
        rec.update(world_size=self.world, host=self._host(rank), pid=PID_BASE + rank)
        rec.update(event=event, step=step, info=info)
        return rec

    def _host(self, rank: int) -> str:
        return f"node{rank // self.node}"

    def _silent(self, rank: int, step: int) -> bool:
        onset = self.lost.get(rank)
        return onset is not None and step >= onset

    def _telemetry(self, r: int, now: float, values: dict[str, list[float]]) -> list[dict]:
        """A rank's two telemetry records of one sample: its card and its host."""
        out = []
        for source, device in (("gpu", f"gpu:{r % self.node}"), ("host", "")):
            rec = self._common(r, "telemetry", now)
            rec.update(host=self._host(r), pid=PID_BASE + r, source=source, device=device)
            rec["values"] = {k: v[r] for k, v in values.items() if k.startswith(source + "/")}
            rec["labels"] = {}
            if source == "gpu":
                mask = int(rec["values"]["gpu/throttle_mask"])
                rec["labels"]["gpu/throttle"] = "sw_thermal,hw_thermal" if mask else ""
            out.append(rec)
        return out

    def step_records(self, step: int, now: float) -> dict[int, list[dict[str, Any]]]:
        values = self.model.values(step, len(self.metrics))
        lists = {m: values[m].tolist() for m in self.metrics}
        tele: dict[str, list[float]] | None = None
        if self.tele_every:
            tele = {k: v.tolist() for k, v in self.model.telemetry(step).items()}
        out: dict[int, list[dict[str, Any]]] = {}
        cascade = self.cascade
        stepping = cascade.stepping(step)
        for r in self.ranks:
            if self._silent(r, step) or r in self.over:
                continue
            lag = cascade.lagged.get(r)
            if lag:  # sent ``lag`` ticks from now, after that tick's records of the others
                batch = self.held.setdefault(step + lag, {}).setdefault(self.owner[r], [])
            else:
                batch = out.setdefault(self.owner[r], [])
            hung = (r in self.hang and step >= self.hang[r]) or not stepping
            if not hung:
                rec = self._common(r, "step", now)
                rec.update(world_size=self.world, host=self._host(r), pid=PID_BASE + r)
                rec.update(step=step, epoch=0, metrics={m: lists[m][r] for m in self.metrics})
                batch.append(rec)
                self.last_step[r] = step
            if (step + r) % self.hb_every == 0:
                beat = self._common(r, "heartbeat", now)
                beat.update(last_step=self.last_step[r], next_in=self.heartbeat_s, dropped=0)
                stack = cascade.stack(r, step, beat["time"])
                if stack is not None:
                    beat["stack"] = stack
                batch.append(beat)
            if tele is not None and (step + r) % self.tele_every == 0:
                batch.extend(self._telemetry(r, now, tele))
            event = cascade.event(r, step)
            if event is not None:
                kind, at, info = event
                batch.append(self._event(r, kind, at, info, now))
                self.over.add(r)
        for key, recs in self.held.pop(step, {}).items():
            out.setdefault(key, []).extend(recs)
        return out

    # --- sending -------------------------------------------------------------------------

    def send(self, batches: dict[int, list[dict[str, Any]]]) -> None:
        items = list(batches.items())
        if self.shuffle is not None:  # arrival order: ranks' sockets, records in a frame
            self.shuffle.shuffle(items)
            if not self.per_rank:  # each rank's records stay in their order (their seq)
                for _, recs in items:
                    per_rank: dict[int, list[dict[str, Any]]] = {}
                    for rec in recs:
                        per_rank.setdefault(rec["rank"], []).append(rec)
                    groups = list(per_rank.values())
                    self.shuffle.shuffle(groups)
                    recs[:] = [rec for group in groups for rec in group]
        for key, recs in items:
            frames: list[tuple[bytes, int]] = []
            for part in frame_groups(recs):  # telemetry (schema version 2) in frames of its own
                if self.per_rank:
                    frames.append(
                        (msgpack.packb({"v": version_of(part), "records": part}), len(part))
                    )
                elif self.node_frames:
                    for node in self._by_node(part):
                        frames.extend(pack(node))
                else:
                    for i in range(0, len(part), RECORDS_PER_FRAME):
                        frames.extend(pack(part[i : i + RECORDS_PER_FRAME]))
            self.pending[key].extend(frames)
        self.flush()

    def _by_node(self, records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """``records`` split by node, each node's in their order (what its relay batches)."""
        nodes: dict[int, list[dict[str, Any]]] = {}
        for rec in records:
            nodes.setdefault(rec["rank"] // self.node, []).append(rec)
        return list(nodes.values())

    def flush(self) -> bool:
        """Send what is pending; False while some socket is full (zmq.Again)."""
        clear = True
        for key, queue in self.pending.items():
            sock = self.socks[key]
            while queue:
                frame, count = queue[0]
                try:
                    sock.send(frame, zmq.NOBLOCK)
                except zmq.Again:
                    self.again += 1
                    clear = False
                    break
                queue.popleft()
                self.frames += 1
                self.records += count
        return clear

    # --- the schedule --------------------------------------------------------------------

    def run_all(self, start_at: float) -> dict[str, Any]:
        _sleep_until(start_at - 1.0 / self.rate)
        now = time.time()
        info = {"launcher": "loadgen", "simulated": True}
        starts: dict[int, list[dict[str, Any]]] = {}
        for r in self.ranks:
            starts.setdefault(self.owner[r], []).append(self._event(r, "start", None, info, now))
        self.send(starts)
        lags: list[float] = []
        t_begin = time.monotonic()
        for step in range(1, self.steps + 1):
            due = start_at + (step - 1) / self.rate
            _sleep_until(due)
            now = time.time()
            lags.append(max(0.0, now - due) * 1000)
            self.send(self.step_records(step, now))
            _emit({"t": "step", "step": step, "time": now, "sent": self.records})
        now = time.time()
        ends: dict[int, list[dict[str, Any]]] = {}
        for r in self.ranks:
            if not self._silent(r, self.steps + 1) and r not in self.hang and r not in self.over:
                ends.setdefault(self.owner[r], []).append(
                    self._event(r, "end", self.last_step[r], {"reason": "normal"}, now)
                )
        self.send(ends)
        while not self.flush():
            time.sleep(0.01)
        elapsed = time.monotonic() - t_begin
        for sock in self.socks.values():
            sock.close()  # LINGER lets ZeroMQ deliver what it still holds
        self.ctx.term()
        lags.sort()
        return {
            "t": "done",
            "records": self.records,
            "frames": self.frames,
            "by_kind": self.by_kind,
            "again": self.again,
            "lag_p95_ms": lags[int(0.95 * (len(lags) - 1))] if lags else 0.0,
            "lag_median_ms": statistics.median(lags) if lags else 0.0,
            "lag_max_ms": lags[-1] if lags else 0.0,
            "elapsed_s": elapsed,
        }


def _sleep_until(wall: float) -> None:
    left = wall - time.time()
    if left > 0:
        time.sleep(left)


def _emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main() -> int:
    spec = json.loads(sys.argv[1])
    worker = Worker(spec)
    _emit({"t": "ready", "pid": os.getpid()})
    line = sys.stdin.readline()
    start_at = float(line) if line.strip() else time.time()
    if not math.isfinite(start_at):
        raise SystemExit("bad start time")
    _emit(worker.run_all(start_at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
