"""The `rankwatch status` table (pure formatting)."""

from __future__ import annotations

from rankwatch.aggregator.alerts.console import render_status

NOW = 1_700_000_100.0


def rank(r: int, **kw: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "rank": r, "state": "alive", "host": f"node{r}", "pid": 100 + r, "last_step": 120,
        "last_seen": NOW - 1, "message": "", "divergent": [], "z": {"loss": 0.4},
        "values": {"loss": 0.25 + r / 100, "lr": 0.001, "grad_norm": 1.5, "zeta": 3.0,
                   "throughput": 512.0},
        "throughput": 512.0, "dropped": 0, "gaps": [],
    }  # fmt: skip
    entry.update(kw)
    return entry


SNAPSHOT = {
    "now": NOW,
    "runs": [
        {
            "run": "llama-7b",
            "state": "running",
            "world_size": 3,
            "last_time": NOW - 1,
            "last_step": 120,
            "ranks": [
                rank(0),
                rank(2, divergent=["loss"], z={"loss": 8.25}, values={"loss": "NaN"}),
                rank(
                    1,
                    state="lost",
                    last_seen=NOW - 95,
                    message="no record for 95 s",
                    dropped=12,
                    gaps=[[5, 9]],
                ),
            ],
            "divergences": [
                {
                    "rank": 2,
                    "metric": "loss",
                    "kind": "outlier",
                    "since_step": 100,
                    "message": "rank 2 loss 3.1x the median of 3 ranks (z=8.2) since step 100",
                },
            ],
        },
        {"run": "other", "state": "finished", "world_size": 1, "ranks": [], "divergences": []},
    ],
}


def test_status_table_has_a_row_per_rank_and_says_what_is_wrong() -> None:
    text = render_status(SNAPSHOT, now=NOW)
    lines = text.splitlines()
    assert lines[0].startswith("run llama-7b  [running]  world size 3  last step 120")
    assert lines[1] == "  ranks: 2 alive, 1 lost; 1 divergent"
    header = lines[2].split()
    assert header[:6] == ["rank", "state", "step", "seen", "host", "pid"]
    # known first, 4 max, with the table's units
    assert header[6:11] == ["loss", "lr", "throughput", "(samples/s)", "grad_norm"]
    rows = {int(line.split()[0]): line for line in lines[3:6]}
    assert list(rows) == [0, 1, 2]  # sorted by rank
    assert rows[1].split()[1:4] == ["lost", "120", "95s"]
    assert "NaN" in rows[2] and "loss (z=8.25)" in rows[2]
    assert "rank 1: no record for 95 s" in text
    assert "! rank 2 loss outlier since step 100" in text
    assert "run other  [finished]  world size 1\n  (no ranks heard from)" in text


def test_status_filters_by_run_and_reports_none() -> None:
    assert "llama-7b" not in render_status(SNAPSHOT, run="other", now=NOW)
    assert render_status(SNAPSHOT, run="nope", now=NOW) == "no run named 'nope'"
    assert render_status({"runs": []}, now=NOW) == "no runs yet"


def test_a_big_run_lists_only_the_ranks_with_something_to_say() -> None:
    ranks = [rank(r) for r in range(4_096)]
    ranks[17] = rank(17, divergent=["loss"], z={"loss": 6.5})
    ranks[77] = rank(77, state="stalled", message="no new step for 40 s")
    ranks[100] = rank(100, state="lost", message="no record for 30 s")
    ranks[512] = rank(512, gaps=[[3, 4]])  # alive, but records went missing
    ranks[4_000] = rank(4_000, state="finished")
    run = {"run": "big", "state": "running", "world_size": 4_096, "ranks": ranks}
    lines = render_status({"runs": [run]}, now=NOW).splitlines()
    assert lines[1] == "  ranks: 4,093 alive, 1 stalled, 1 lost, 1 finished; 1 divergent"
    assert [int(line.split()[0]) for line in lines[3:8]] == [17, 77, 100, 512, 4_000]
    assert lines[8] == (
        "  (4,091 more ranks alive, not divergent, nothing missing: not listed; "
        "--all lists every rank)"
    )
    assert "  rank 77: no new step for 40 s" in lines
    every = render_status({"runs": [run]}, now=NOW, all_ranks=True).splitlines()
    assert len(every) == 3 + 4_096 + 2  # head, counts, header, the rows, two messages
    # at the fold size every rank is listed anyway
    small = {**run, "ranks": ranks[:64]}
    assert "more ranks" not in render_status({"runs": [small]}, now=NOW)


def test_ranks_that_say_the_same_are_one_line_and_a_summary_counts_every_divergent_rank() -> None:
    # 100 finished ranks of a big run's summary, all divergent after a cascade: one line for
    # what they all say, the divergent counted over every rank, not over those listed
    ranks = [rank(r, state="finished", message="finished (normal)", divergent=["loss"])
             for r in (*range(0, 37), *range(38, 99), 2047)]  # fmt: skip
    ranks.append(rank(37, state="crashed", message="crashed: RuntimeError: NaN loss"))
    run = {"run": "big", "state": "crashed", "world_size": 2048, "ranks": ranks,
           "ranks_summarised": True, "ranks_seen": 2048, "ranks_odd": 2048,
           "rank_states": {"finished": 2047, "crashed": 1}, "ranks_divergent": 2048,
           "divergences": [], "divergences_active": 2048}  # fmt: skip
    lines = render_status({"runs": [run]}, now=NOW).splitlines()
    assert lines[1] == "  ranks: 1 crashed, 2,047 finished; 2,048 divergent"
    assert "  ranks 0-36, 38-98, 2047 (99): finished (normal)" in lines
    assert "  rank 37: RuntimeError: NaN loss" in lines
    assert sum("finished (normal)" in line for line in lines) == 1
    assert lines[-1] == (
        "  ! 2,048 more active divergences, not listed: the earliest to start are above"
    )
    # an older server's entry without the count: the listed ranks' divergences are counted
    older = {k: v for k, v in run.items() if k != "ranks_divergent"}
    assert render_status({"runs": [older]}, now=NOW).splitlines()[1].endswith("; 99 divergent")
