"""What an incident's messages say was done about it (or how to act on it), and when the
ranks' answers make one more message: pure, table-driven."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rankwatch.aggregator.actions.news import ActionNews
from rankwatch.aggregator.actions.words import incident_action
from rankwatch.aggregator.alerts.sinks.words import incident_note
from rankwatch.aggregator.incidents.model import Incident, IncidentChange
from rankwatch.aggregator.incidents.tracker import IncidentTracker

from tests.aggregator.incidents.builders import T0, nan
from tests.aggregator.incidents.scenario import deliver, world

PUBLIC = "https://rw.example.org/watch"


def command(ident: str, cmd: str, states: list[str], *, step: int = 23, sends: int = 1,
            by: str = "policy:nonfinite", incident: str = "job#1") -> dict[str, Any]:  # fmt: skip
    acks = {str(r): {"state": s, "sends": sends, "detail": ""} for r, s in enumerate(states)}
    waiting = {"pending", "sent", "received", "late"} & set(states)
    settled = "done" if {"done"} >= set(states) else "waiting" if waiting else "incomplete"
    return {"id": ident, "run": "job", "cmd": cmd, "ranks": list(range(len(states))), "step": step,
            "by": by, "created": 1.0 if cmd == "checkpoint" else 2.0, "state": settled,
            "acks": acks, "incident": incident}  # fmt: skip


def test_a_policy_stop_in_words_as_the_ranks_answer() -> None:
    table = [
        (["sent"] * 4, "sent to 4 ranks (policy nonfinite); 0/4 acknowledged"),
        (["received", "received", "sent", "received"], "; 3/4 acknowledged"),
        (["done"] * 4, "; 4/4 acknowledged, done"),
    ]
    for states, words in table:
        cmds = [command("c1", "checkpoint", states), command("s1", "stop", states)]
        action = incident_action(cmds, "job", firing=True, public_url=PUBLIC)
        assert action is not None and action["taken"] is True
        assert action["line"].startswith("action: checkpoint then stop at step 23 ")
        assert words in action["line"], (states, action["line"])
        assert [c["cmd"] for c in action["commands"]] == ["checkpoint", "stop"]
    pending = incident_action([command("s1", "stop", ["pending"] * 2, sends=0)], "job", True)
    assert pending is not None and "not yet delivered to 2 ranks" in pending["line"]
    refused = command("s1", "stop", ["aborted", "refused"])
    refused["state"] = "aborted"
    said = incident_action([refused], "job", firing=False)
    assert said is not None
    assert said["line"].endswith("2/2 acknowledged, aborted for every rank (refused rank 1)")
    failed = command("s1", "stop", ["failed"] * 2)
    both = incident_action([command("c1", "checkpoint", ["refused"] * 2), failed], "job", True)
    assert both is not None and both["line"].endswith(
        "incomplete (checkpoint: refused rank 0,1; stop: failed rank 0,1)")  # fmt: skip


def test_nothing_done_offers_the_card_and_the_request_while_it_fires() -> None:
    offer = incident_action([], "a run/1", firing=True, public_url=PUBLIC)
    assert offer is not None and offer["taken"] is False and offer["dashboard"] == PUBLIC
    assert "buttons on the dashboard's incident card" in offer["line"]
    assert f"'{PUBLIC}/api/run/commands?run=a%20run%2F1'" in offer["how"]
    assert "Authorization: Bearer $TOKEN" in offer["how"] and '"cmd": "stop"' in offer["how"]
    bare = incident_action([], "r", firing=True)
    assert bare is not None and bare["how"].startswith("or: POST /api/run/commands?run=r with")
    notified = incident_action([command("n1", "notify", [], by="policy:div")], "r", True)
    assert notified is not None and "no action taken (policy:div: notify)" in notified["line"]
    assert incident_action([], "r", firing=False) is None  # resolved, nothing done: nothing said


def opened_change() -> IncidentChange:
    t = IncidentTracker()
    deliver(t, world(4))
    (opened,) = t.observe(T0 + 100, divergences=[nan(2, 20)])
    return opened


def test_the_message_carries_the_action_and_one_update_when_it_settles() -> None:
    opened = opened_change()
    inc = opened.incident
    held: list[dict[str, Any]] = []
    news = ActionNews()

    def take(changes: list[IncidentChange], changed: list[dict[str, Any]]) -> Any:
        return news.take(changes, changed, lambda run: held, lambda run, i: inc)

    held += [command("c1", "checkpoint", ["sent"] * 4, incident=inc.id),
             command("s1", "stop", ["sent"] * 4, incident=inc.id)]  # fmt: skip
    (carried,), more = take([opened], held)
    assert more == [] and [c["id"] for c in carried.actions] == ["c1", "s1"]
    note = incident_note(carried, PUBLIC)
    assert note.action is not None and note.action["taken"] is True
    assert "action: checkpoint then stop at step 23 sent to 4 ranks" in "\n".join(note.lines)
    held[0] = command("c1", "checkpoint", ["done"] * 4, incident=inc.id)
    assert take([], [held[0]]) == ([], [])  # the stop is still waiting: nothing yet
    held[1] = command("s1", "stop", ["done"] * 4, incident=inc.id)
    _, (update,) = take([], [held[1]])
    assert update.change == "acted" and update.incident is inc
    assert incident_note(update).title == "rankwatch [ACTION] job: rank 2 non-finite"
    assert "4/4 acknowledged, done" in "\n".join(incident_note(update, PUBLIC).lines)
    assert take([], held) == ([], [])  # told once, however often they change again
    assert incident_note(opened, PUBLIC).action["taken"] is False  # type: ignore[index]


def test_an_outcome_queued_with_a_change_rides_on_it() -> None:
    from rankwatch.aggregator.alerts.sinks.words import merge_changes

    opened = opened_change()
    cmds = (command("s1", "stop", ["done"] * 4, incident=opened.incident.id),)
    acted = IncidentChange("acted", opened.incident, None, cmds)
    resolved = IncidentChange("resolved", opened.incident)
    table = [([opened, acted], "opened"), ([acted, acted], "acted"),
             ([acted, resolved], "resolved"), ([resolved, acted], "resolved")]  # fmt: skip
    for queued, kind in table:
        (merged,) = merge_changes(queued)
        assert merged.change == kind and merged.actions == cmds, queued


def test_an_outcome_after_a_restart_of_serve_is_told_once() -> None:
    inc = opened_change().incident
    body = {**inc.as_dict(), "hosts": {"2": ["node2", 7]}}  # as the store keeps it
    other = replace(inc, culprits=(0,), summary="a new incident of the new serve, same id")
    waiting = command("s1", "stop", ["received"] * 4, incident=inc.id)
    told = command("c0", "checkpoint", ["done"] * 4, incident="job#9")  # told before it
    held = [waiting, told]
    news = ActionNews()  # the restarted serve's: its tracker holds neither incident
    news.restore(held, lambda run: [body] if run == "job" else [])

    def take(changed: list[dict[str, Any]], live: Any = None) -> Any:
        return news.take([], changed, lambda run: held, lambda run, i: live)

    assert take([told], live=other) == ([], [])  # a late answer to a settled one: told before
    assert take([waiting]) == ([], [])  # still waiting
    held[0] = command("s1", "stop", ["done"] * 4, incident=inc.id)
    _, (acted,) = take([held[0]], live=other)
    assert acted.change == "acted" and acted.incident == inc  # the stored one, not the new
    assert incident_note(acted).title == "rankwatch [ACTION] job: rank 2 non-finite"
    assert "4/4 acknowledged, done" in "\n".join(incident_note(acted).lines)
    assert take(held, live=other) == ([], [])  # once


def test_an_incident_read_back_from_its_stored_form_is_the_same() -> None:
    inc = opened_change().incident
    assert Incident.from_dict({**inc.as_dict(), "hosts": {}, "notes": []}) == inc
    body = inc.as_dict()  # as stored before timeline groups: no count, no ranks
    old = [{k: v for k, v in e.items() if k not in ("count", "ranks")} for e in body["timeline"]]
    assert Incident.from_dict({**body, "timeline": old}) == inc
    group = replace(inc.timeline[0], count=3, ranks=((0, 1), (3, 3)))
    grouped = replace(inc, timeline=(group, *inc.timeline[1:]))
    assert Incident.from_dict(grouped.as_dict()) == grouped
