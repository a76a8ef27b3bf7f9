"""Webhooks speak per incident, not per alert: the wired aggregator, every webhook kind, a real
local HTTP server. A NaN that the all-reduce spreads to 64 ranks is two messages per webhook
(opened, resolved), a hang whose 63 peers time out is three (opened, updated when the timeouts
name the culprit, resolved when the job is relaunched); a run-level alert still goes out."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankwatch.agent.wire.records import EventRecord, Heartbeat, StepRecord
from rankwatch.aggregator.actions.policy import parse_spec
from rankwatch.aggregator.alerts.config import AlertConfig
from rankwatch.aggregator.alerts.sinks.base import WebhookKind
from rankwatch.aggregator.alerts.sinks.http import WebhookConfig, WebhookSink
from rankwatch.aggregator.alerts.sinks.registry import register, unregister
from rankwatch.aggregator.alerts.sinks.words import alert_dict, alert_line
from rankwatch.aggregator.incidents.model import IncidentChange
from rankwatch.aggregator.incidents.tracker import IncidentTracker
from rankwatch.aggregator.service import Aggregator, ServeConfig

from tests.aggregator.alerts.sinks.conftest import Capture, fast, wait_for
from tests.aggregator.incidents.builders import T0, crash_text, nan
from tests.aggregator.incidents.scenario import deliver, world

WORLD = 64
PUBLIC = "https://rw.example.org/watch"
PEER_FAILURE = crash_text("mindspore_allreduce_kernel.txt").split("RuntimeError: ", 1)[1]
KINDS = ("json", "slack", "dingtalk", "wecom", "feishu")


class Job:
    """64 ranks fed to a real Aggregator the way the wire would, one tick per second of job
    time; after each tick every webhook has sent what it was given (so messages are counted
    exactly, not coalesced by chance)."""

    def __init__(self, tmp_path: Path, base: str, run: str, **cfg: Any) -> None:
        hooks = [fast(k, f"{base}/{k}", **({"secret": "s"} if k == "dingtalk" else {}))
                 for k in KINDS]  # fmt: skip
        config = ServeConfig(data_dir=tmp_path / "data", console_alerts=False, webhooks=hooks,
                             **cfg)  # fmt: skip
        self.agg = Aggregator(config)
        self.run = run
        self.t0 = time.time() - 300
        self.seq = dict.fromkeys(range(WORLD), 0)

    def _seq(self, rank: int) -> int:
        self.seq[rank] += 1
        return self.seq[rank]

    def step(self, rank: int, step: int, t: float, loss: float = 1.0, pid: int = 0) -> StepRecord:
        return StepRecord(self.run, rank, self._seq(rank), self.t0 + t, WORLD, f"node{rank // 8}",
                          pid or 100 + rank, step, 0, {"loss": loss})  # fmt: skip

    def event(self, rank: int, kind: str, t: float, pid: int = 0, **info: Any) -> EventRecord:
        return EventRecord(self.run, rank, self._seq(rank), self.t0 + t, WORLD, f"node{rank // 8}",
                           pid or 100 + rank, kind, 19, info)  # fmt: skip

    def beat(self, rank: int, t: float) -> Heartbeat:
        return Heartbeat(self.run, rank, self._seq(rank), self.t0 + t, 19, 5.0, 0)

    def feed(self, records: list[Any], t: float) -> None:
        self.agg.add(records, imported=False, now=self.t0 + t)
        self.agg.tick(now=self.t0 + t + 0.5)
        wait_for(lambda: all(s.settled() for s in self.agg.webhooks.sinks))


def texts(capture: Capture, kind: str) -> list[str]:
    """What each message to ``kind`` says, as one string."""
    out = []
    for _, body in capture.bodies(f"/{kind}"):
        if kind == "json":
            out.append(body["title"] + "\n" + body["text"])
        elif kind == "slack":
            out.append(body["text"])
        elif kind == "dingtalk":
            out.append(body["markdown"]["title"] + "\n" + body["markdown"]["text"])
        elif kind == "wecom":
            out.append(body["markdown"]["content"])
        else:
            out.append(body["content"]["text"])
    return out


def test_a_nan_spread_to_64_ranks_is_two_messages_per_webhook(
    tmp_path: Path, server: tuple[str, Capture]
) -> None:
    base, capture = server
    alerts = AlertConfig.from_dict({"thresholds": [{"metric": "loss", "op": ">", "value": 1.5}]})
    job = Job(tmp_path, base, "nanjob", alerts=alerts, public_url=PUBLIC)
    try:
        for s in range(1, 41):  # rank 2 NaN at step 20, every rank 21-24, finite again from 25
            nan = (s == 20, 21 <= s <= 24)
            job.feed(
                [job.step(r, s, s, math.nan if nan[1] or (nan[0] and r == 2) else
                          2.0 / (1 + 0.05 * s) + 0.01 * (r % 7)) for r in range(WORLD)],
                s,
            )  # fmt: skip
        assert job.agg.outlet.cover.covered == 4  # 2 non-finite alerts fired and resolved: not sent
    finally:
        job.agg.stop()
    for kind in KINDS:
        said = texts(capture, kind)
        # threshold firing, threshold resolved (no incident explains a run's median), the
        # incident opened, the incident resolved: nothing per rank, nothing per alert of it
        assert len(said) == 4, (kind, said)
        assert "FIRING" in said[0] and "threshold" in said[0]
        assert "RESOLVED" in said[1] and "threshold" in said[1]
        opened, resolved = said[2], said[3]
        assert "rankwatch [INCIDENT] nanjob: rank 2 non-finite" in opened
        assert "rank 2 (node0, pid 102) went non-finite first (loss at step 20)" in opened
        assert "fault step 20" in opened  # opened at step 20: no other rank was NaN yet
        assert f"{PUBLIC}/#run=nanjob&sel=2&zoom=0-40" in opened
        # the 63 ranks that followed changed the incident, not its culprit: no message then
        assert "rankwatch [RESOLVED] nanjob: rank 2 non-finite" in resolved
        assert "63 ranks followed from step 21" in resolved
        assert "fault step 20; 63 ranks affected after it" in resolved
        assert "resolved 20" in resolved
        assert "NaN at step 21; rank 1" not in opened + resolved  # no per-rank list
        # no policy acted: the message offers the card's buttons and the request itself
        assert "no action taken: checkpoint or stop it with the buttons" in opened
        assert f"'{PUBLIC}/api/run/commands?run=nanjob'" in opened
        assert "no action taken" not in resolved
    ((_, first), *_) = [(p, b) for p, b in capture.bodies("/json") if b["type"] == "incidents"]
    (entry,) = first["incidents"]
    assert entry["change"] == "opened" and entry["incident"]["culprits"] == [2]
    assert entry["link"] == f"{PUBLIC}/#run=nanjob&sel=2&zoom=0-40"
    assert entry["action"]["taken"] is False and entry["action"]["dashboard"] == PUBLIC
    ((_, slack), *_) = [(p, b) for p, b in capture.bodies("/slack") if "INCIDENT" in b["text"]]
    assert f"<{PUBLIC}/#run=nanjob&sel=2&zoom=0-40|open the dashboard" in slack["text"]
    ((_, ding), *_) = [(p, b) for p, b in capture.bodies("/dingtalk") if "INCIDENT" in str(b)]
    assert f"[open the dashboard at this step]({PUBLIC}/#run=nanjob" in ding["markdown"]["text"]


def test_a_policy_stop_is_in_the_opened_message_and_its_outcome_is_one_more(
    tmp_path: Path, server: tuple[str, Capture]
) -> None:
    """The policy decides in the tick the incident opens, so its "opened" message names the
    checkpoint and the stop; these ranks are not connected (no receiver), so nobody answers,
    the held commands are aborted after the ask timeout, and that is one [ACTION] message."""
    base, capture = server
    job = Job(tmp_path, base, "stopjob", policies=parse_spec("stop-on-nan"), public_url=PUBLIC)
    try:
        for s in range(1, 28):  # rank 2 NaN at step 20, every rank from 21
            job.feed([job.step(r, s, s, math.nan if s > 20 or (s == 20 and r == 2) else 1.0)
                      for r in range(WORLD)], s)  # fmt: skip
    finally:
        job.agg.stop()
    for kind in KINDS:
        opened, acted = texts(capture, kind)
        assert "rankwatch [INCIDENT] stopjob: rank 2 non-finite" in opened
        assert "action: checkpoint then stop at step " in opened
        assert "not yet delivered to 64 ranks (policy nonfinite); 0/64 acknowledged" in opened
        assert "rankwatch [ACTION] stopjob: rank 2 non-finite" in acted
        assert "aborted for every rank (checkpoint: 64 no_ack; stop: 64 no_ack)" in acted
    ((_, first), (_, last)) = capture.bodies("/json")
    action = first["incidents"][0]["action"]
    assert action["taken"] is True and [c["cmd"] for c in action["commands"]] == [
        "checkpoint", "stop"]  # fmt: skip
    assert {c["state"] for c in last["incidents"][0]["action"]["commands"]} == {"aborted"}


def test_a_hang_whose_peers_time_out_is_opened_updated_resolved(
    tmp_path: Path, server: tuple[str, Capture]
) -> None:
    base, capture = server
    job = Job(tmp_path, base, "hangjob")  # no public URL: no link
    try:
        for s in range(1, 20):
            job.feed([job.step(r, s, s) for r in range(WORLD)], s)
        for t in range(20, 80):  # rank 2 sleeps in step 20; every agent keeps beating
            recs: list[Any] = [job.beat(r, t) for r in range(WORLD)
                               if (t < 60 or r == 2) and not (r == 2 and t > 61)]  # fmt: skip
            if t == 60:  # the 63 peers fail in AllReduce; the launcher kills rank 2 at 61
                peers = [r for r in range(WORLD) if r != 2]
                recs += [job.event(r, "crash", t, exc_type="builtins.RuntimeError",
                                   message=PEER_FAILURE) for r in peers]  # fmt: skip
            job.feed(recs, t)
        for t in range(80, 84):  # relaunched: new processes, steps again
            recs = [job.event(r, "start", t, pid=5000 + r) for r in range(WORLD)] if t == 80 else []
            job.feed([*recs, *(job.step(r, t - 60, t, pid=5000 + r) for r in range(WORLD))], t)
        assert job.agg.outlet.cover.covered == 8  # stalled, crashed, lost: fired and resolved
    finally:
        job.agg.stop()
    for kind in KINDS:
        said = texts(capture, kind)
        assert len(said) == 3, (kind, said)
        opened, updated, resolved = said
        # 30 s in every rank has stalled at step 19 alike: no stack tells them apart yet
        assert "rankwatch [INCIDENT] hangjob: 64 ranks hung" in opened
        assert "no stacks to tell them apart" in opened
        # the timeouts name the rank they waited for: one update, not 63 crash messages
        assert "rankwatch [UPDATED] hangjob: rank 2 hung" in updated
        assert "rank 2 (node0, pid 102) hung after step 19" in updated
        assert "63 ranks waited or timed out after it" in updated
        assert "was: 64 ranks hung" in updated
        assert "rankwatch [RESOLVED] hangjob: rank 2 hung" in resolved
        assert "Launch kernel" not in opened + updated + resolved  # no peer's stack trace
        assert "http" not in opened + updated + resolved


def nan_changes() -> list[IncidentChange]:
    """opened (ranks 0, 1, 3 first seen), updated (rank 2's earlier record), resolved."""
    t = IncidentTracker()
    deliver(t, world(4))
    changes = t.observe(T0 + 100, divergences=[nan(r, 21) for r in (0, 1, 3)])
    changes += t.observe(T0 + 101, divergences=[nan(2, 20)])
    changes += t.observe(T0 + 150, resolved=[nan(r, 30) for r in range(4)])
    assert [c.change for c in changes] == ["opened", "updated", "resolved"]
    return changes


def test_changes_queued_together_are_one_message_with_the_latest_judgement(
    server: tuple[str, Capture],
) -> None:
    base, capture = server
    sink = WebhookSink(WebhookConfig("json", f"{base}/ok", rate_per_min=120))  # one per 0.5 s
    opened, updated, resolved = nan_changes()
    sink.submit_incident(opened)
    wait_for(lambda: sink.counters["sent"] == 1)
    sink.submit_incident(updated)  # both wait behind the rate limit
    sink.submit_incident(resolved)
    wait_for(sink.settled)
    sink.close()
    first, second = (body for _, body in capture.requests)
    assert first["title"] == "rankwatch [INCIDENT] job: ranks 0, 1, 3 non-finite"
    (entry,) = second["incidents"]  # one incident: one entry, as it ended
    assert entry["change"] == "resolved" and entry["incident"]["culprits"] == [2]
    assert second["title"] == "rankwatch [RESOLVED] job: rank 2 non-finite"
    assert sink.counters["incidents_sent"] == 3 and sink.counters["sent"] == 2


def test_a_kind_without_incident_words_sends_them_as_alerts(server: tuple[str, Capture]) -> None:
    base, capture = server

    def lines(alerts: Sequence[Any]) -> dict[str, Any]:
        return {"lines": [alert_line(alert_dict(a)) for a in alerts]}

    plain = register(WebhookKind("plaintest", lines))
    try:
        sink = WebhookSink(fast("plaintest", f"{base}/plain"))
        sink.submit_incident(nan_changes()[0])
        wait_for(sink.settled)
        sink.close()
    finally:
        unregister(plain.name)
    ((_, body),) = capture.requests
    (line,) = body["lines"]
    assert line.startswith("FIRING [critical] run job: [INCIDENT] job: ranks 0, 1, 3 non-finite: ")
    assert "went non-finite first (loss at step 21)" in line


def test_min_severity_applies_to_incidents_by_cause(server: tuple[str, Capture]) -> None:
    base, capture = server
    sink = WebhookSink(fast("json", f"{base}/ok", min_severity="critical"))
    opened = nan_changes()[0]
    drift = replace(opened, incident=replace(opened.incident, cause="divergence"))
    sink.submit_incident(drift)  # a rank drifting is a warning
    sink.submit_incident(opened)  # non-finite is critical
    wait_for(sink.settled)
    sink.close()
    assert [b["incidents"][0]["incident"]["cause"] for _, b in capture.requests] == ["nonfinite"]
