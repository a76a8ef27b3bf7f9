"""The incident hook and the live messages of the service's telemetry part (pure)."""

from __future__ import annotations

import dataclasses

from rankwatch.agent.wire.records import TelemetryRecord
from rankwatch.aggregator.incidents.model import Evidence, Incident, IncidentChange
from rankwatch.aggregator.telemetry.intake import TelemetryIntake


def fleet(intake: TelemetryIntake, samples: int = 6) -> None:
    for i in range(samples):
        for rank in range(32):
            slow = 8 <= rank < 16
            values = {"gpu/sm_clock_mhz": 1100.0 if slow else 1980.0 + rank % 3,
                      "gpu/temp_c": 95.0 if rank == 2 else 60.0 + rank % 4}  # fmt: skip
            intake.take(TelemetryRecord("r", rank, i + 1, 100.0 + 10 * i + rank * 0.1,
                                        f"h{rank // 8}", 1, "gpu", f"gpu:{rank % 8}", values,
                                        {}))  # fmt: skip
        intake.tick()


def incident(culprits: tuple[int, ...], cause: str = "slow") -> Incident:
    first = Evidence(10, 150.0, culprits[0], "step_time high")
    return Incident("r#1", "r", cause, culprits, (), (), (first,), 150.0, 150.0, None, "firing",
                    f"rank {culprits[0]} is slower than the others from step 10", "slower",
                    10, 1)  # fmt: skip


def test_a_slow_node_incident_says_the_node_once_and_a_card_its_state() -> None:
    intake = TelemetryIntake()
    fleet(intake)
    node = intake.annotate(IncidentChange("opened", incident((8, 9, 10))))
    assert node.incident.summary.count("node h1: 8 of 8 cards (ranks 8-15) slower-clocked") == 1
    assert len(node.incident.timeline) == 1  # a node's words are in the summary only
    card = intake.annotate(IncidentChange("opened", dataclasses.replace(incident((2,)), id="r#2")))
    assert card.incident.summary.endswith("; card 2 (gpu:2 on h0) at 95 °C (peers 62 °C)")
    assert card.incident.timeline[-1].what == "card 2 (gpu:2 on h0) at 95 °C (peers 62 °C)"
    # resolved later, when the card has cooled: it still says what the card was doing
    fleet(intake, 1)
    done = intake.annotate(IncidentChange("resolved", dataclasses.replace(incident((2,)),
                                                                          id="r#2")))  # fmt: skip
    assert done.incident.summary == card.incident.summary
    body = intake.annotate_dict({"id": "r#2", "run": "r", "summary": "s", "timeline": []})
    assert body["summary"] == "s; card 2 (gpu:2 on h0) at 95 °C (peers 62 °C)"
    assert body["timeline"][0]["rank"] == 2


def test_a_card_in_line_with_its_peers_adds_nothing_and_messages_come_at_a_low_rate() -> None:
    intake = TelemetryIntake()
    fleet(intake)
    change = IncidentChange("opened", incident((20,)))
    assert intake.annotate(change) is change
    first = intake.feed_messages(1000.0)
    assert [m["type"] for m in first] == ["telemetry"] and len(first[0]["ranks"]) == 32
    assert first[0]["ranks"]["2"]["temp"] == 95.0 and first[0]["ranks"]["2"]["host"] == "h0"
    fleet(intake, 1)
    assert intake.feed_messages(1002.0) == []  # within FEED_EVERY_S
    assert len(intake.feed_messages(1006.0)) == 1
    assert intake.feed_messages(1020.0) == []  # nothing sampled since
    intake.forget("r")
    assert intake.rows("r") == {}
