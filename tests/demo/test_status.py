"""The demo's reading of /api/status and /api/alerts answers (pure: answers are passed in)."""

from __future__ import annotations

from typing import Any

from rankwatch.demo.status import Reporter

RUN = "demo-20260101-000000"


def rank_row(rank: int, state: str, message: str = "", last_step: int = 30) -> dict[str, Any]:
    return {"rank": rank, "state": state, "message": message, "last_step": last_step}


def divergence(rank: int, metric: str, since: int, step: int) -> dict[str, Any]:
    return {
        "run": RUN, "metric": metric, "rank": rank, "kind": "outlier", "direction": "high",
        "since_step": since, "step": step, "message": f"rank {rank} {metric} 3.0x the median",
    }  # fmt: skip


def snapshot(ranks: list[dict[str, Any]], divs: list[dict[str, Any]]) -> dict[str, Any]:
    other = {"run": "another", "ranks": [rank_row(0, "crashed", "boom")], "divergences": []}
    entry = {"run": RUN, "state": "running", "last_step": 30, "ranks": ranks, "divergences": divs}
    return {"now": 0.0, "runs": [other, entry]}


def reporter() -> tuple[Reporter, list[str]]:
    said: list[str] = []
    return Reporter("http://127.0.0.1:1", RUN, said.append), said


def test_flags_are_remembered_after_they_resolve() -> None:
    rep, said = reporter()
    alive = [rank_row(r, "alive") for r in range(4)]
    rep.ingest(snapshot(alive, [divergence(2, "loss", 20, 22)]), None)
    rep.ingest(
        snapshot(alive, [divergence(2, "loss", 20, 23), divergence(2, "grad_norm", 20, 21)]), None
    )
    rep.ingest(snapshot(alive, []), None)  # resolved meanwhile
    assert rep.flagged_ranks() == [2]
    assert rep.first_flag_step(2) == 21
    assert len([line for line in said if "FLAG" in line]) == 2  # each reported once
    summary = rep.summary("labels", 2, 20)
    assert summary["flagged"] == [2] and summary["first_flag_step"] == {"2": 21}


def test_alerts_add_flags_and_other_runs_are_ignored() -> None:
    rep, _ = reporter()
    alerts = {
        "firing": [{"run": RUN, "rank": 1, "rule": "stalled", "metric": None, "since_step": 12}],
        "history": [
            {"run": "another", "rank": 3, "rule": "divergence", "metric": "loss"},
            {"run": RUN, "rank": None, "rule": "run_stalled"},  # run-wide: no rank to blame
        ],
    }
    rep.ingest(None, alerts)
    assert rep.flagged_ranks() == [1]
    assert rep.first_flag_step(1) == 12


def test_states_settle_and_summary_names_the_crash() -> None:
    rep, said = reporter()
    rep.ingest(snapshot([rank_row(r, "alive") for r in range(4)], []), None)
    assert not rep.all_settled(4)
    rows = [
        rank_row(0, "lost"),
        rank_row(1, "lost"),
        rank_row(2, "crashed", "RuntimeError: injected fault\nmore"),
        rank_row(3, "lost"),
    ]
    rep.ingest(snapshot(rows, []), None)
    assert rep.all_settled(4)
    assert rep.rank_state(2) == "crashed"
    assert any("rank 2: crashed" in line and "injected fault" in line for line in said)
    lines = rep.summary_lines("crash", 2, 15)
    data = rep.summary("crash", 2, 15)
    assert data["ranks"] == {"0": "lost", "1": "lost", "2": "crashed", "3": "lost"}
    assert "injected fault" in data["messages"]["2"]
    assert any("rank 2 was not flagged, and it is crashed" in line for line in lines)


def test_unanswered_or_malformed_answers_change_nothing() -> None:
    rep, said = reporter()
    for bad in (
        None,
        [],
        {"runs": None},
        {"runs": [None, {"run": RUN, "ranks": [None, {"rank": "x"}]}]},
    ):
        rep.ingest(bad, {"firing": [None, {"run": RUN, "rank": True}]})
    assert rep.flagged_ranks() == [] and rep.states == {} and said == []
    assert not rep.all_settled(1)


def test_messages_are_cut_to_their_gist() -> None:
    rep, said = reporter()
    message = (
        "builtins.RuntimeError: \n----------\n- Kernel error:\n----------\n"
        "Launch kernel failed: AllReduce-op2\n\n----------\n- The Function Call Stack:\n"
    )
    rep.ingest(snapshot([rank_row(0, "crashed", message)], []), None)
    assert said == [
        "  rank 0: crashed at step 30: builtins.RuntimeError: Launch kernel failed: AllReduce-op2"
    ]


def test_the_servers_one_line_is_what_the_demo_says() -> None:
    rep, said = reporter()
    row = rank_row(1, "crashed", "crashed: builtins.RuntimeError: Launch kernel failed\n----\n"
                   "- C++ Call Stack:\nkernel.cc:12 at step 30")  # fmt: skip
    row["message_line"] = "RuntimeError: Launch kernel failed"
    rep.ingest(snapshot([row], []), None)
    assert said == ["  rank 1: crashed at step 30: RuntimeError: Launch kernel failed"]
    assert "  rank 1: RuntimeError: Launch kernel failed" in rep.summary_lines("none", 1, 0)
    assert "C++ Call Stack" in rep.summary("none", 1, 0)["messages"]["1"]  # kept whole


def test_verdict_names_who_went_first_and_what_became_of_the_others() -> None:
    rep, _ = reporter()
    nan = [dict(divergence(2, "loss", 20, 20), kind="nonfinite")]
    nan += [dict(divergence(r, "loss", 21, 21), kind="nonfinite") for r in (0, 1, 3)]
    rep.ingest(snapshot([rank_row(r, "finished") for r in range(4)], nan), None)
    verdict = rep.summary_lines("nan", 2, 20)[-1]
    assert (
        "rank 2 flagged at step 20; it went first, ranks [0, 1, 3] followed from step 21" in verdict
    )

    rep, _ = reporter()
    rows = [rank_row(r, "lost") for r in (0, 1, 3)] + [rank_row(2, "crashed", "boom")]
    alerts = {
        "firing": [
            {"run": RUN, "rank": r, "rule": row["state"], "since_step": 19}
            for r, row in ((row["rank"], row) for row in rows)
        ]
    }
    rep.ingest(snapshot(rows, []), alerts)
    verdict = rep.summary_lines("crash", 2, 20)[-1]
    assert "and it is crashed; the other ranks: rank 0 lost, rank 1 lost, rank 3 lost" in verdict


def test_an_incident_is_one_line_and_the_ranks_it_reached_are_not_said_one_by_one() -> None:
    rep, said = reporter()
    alive = [rank_row(r, "alive") for r in range(4)]
    nan = [
        {**divergence(r, m, 20 if r == 2 else 21, 20 if r == 2 else 21), "kind": "nonfinite"}
        for r in range(4)
        for m in ("loss", "grad_norm_local")
    ]
    incident = {
        "id": f"{RUN}#1", "cause": "nonfinite", "culprits": [2], "affected": [0, 1, 3],
        "summary": "rank 2 (node0, pid 12) went non-finite first (loss at step 20); "
        "3 ranks (0, 1, 3) followed from step 21",
    }  # fmt: skip
    entry = snapshot(alive, nan)
    entry["runs"][1]["incidents"] = [incident]
    rep.ingest(entry, None)
    rep.ingest(entry, None)  # the same incident again: not said again
    assert said == [
        f"  INCIDENT nonfinite: {incident['summary']}",
        "  FLAG rank 2: loss nonfinite since step 20, reported at step 20: rank 2 loss 3.0x the "
        "median",
        "  FLAG rank 2: grad_norm_local nonfinite since step 20, reported at step 20: rank 2 "
        "grad_norm_local 3.0x the median",
    ]
    entry["runs"][1]["incidents"] = [{**incident, "culprits": [1], "affected": [0, 2, 3]}]
    rep.ingest(entry, None)
    assert said[-1].startswith("  INCIDENT UPDATED nonfinite: ")
    lines = rep.summary_lines("nan", 2, 20)
    assert f"  incident nonfinite: {incident['summary']}" in lines
    assert any(line.startswith("  flagged too, as the fault reached them: ranks [0, 2, 3]")
               for line in lines)  # fmt: skip
    assert rep.summary("nan", 2, 20)["flagged"] == [0, 1, 2, 3]  # the data keeps every flag
