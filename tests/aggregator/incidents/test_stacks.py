"""Grouping stalled ranks' stacks and the words of ``rankwatch stacks``."""

from __future__ import annotations

import pytest
from rankwatch.agent.wire.stacks import FILE_MAX
from rankwatch.aggregator.incidents.stacks import (
    MAX_FRAMES,
    StackSample,
    group_stacks,
    odd_ones_out,
    render_stacks,
    summary_line,
)

from tests.aggregator.incidents.builders import IN_ALLREDUCE, IN_SLEEP, RUN, T0, stack


def hang(n: int, culprit: int) -> list[StackSample]:
    return [
        stack(r, "sleep", IN_SLEEP) if r == culprit else stack(r, "framework", IN_ALLREDUCE)
        for r in range(n)
    ]


def test_the_odd_one_out_is_named() -> None:
    groups = group_stacks(hang(4, 2))
    assert [g.ranks for g in groups] == [(0, 1, 3), (2,)]
    assert summary_line(groups) == (
        "3 ranks (0, 1, 3) in mindspore/.../grad_reducer.py AllReduce; "
        "rank 2 in job/train.py:98 on_train_step_begin"
    )
    assert odd_ones_out(groups) == (2,)


def test_at_4096_ranks_the_list_is_not_spelled_out() -> None:
    groups = group_stacks(hang(4096, 1234))
    assert summary_line(groups).startswith("4095 ranks in mindspore/.../grad_reducer.py AllReduce;")
    assert odd_ones_out(groups) == (1234,)


def test_ranks_given_by_the_caller_group_as_the_samples_say() -> None:
    # out of rank order, with a second odd one whose signature is the culprit's, elsewhere
    samples = [*hang(64, 40)[::-1], stack(70, "user", IN_SLEEP)]
    ranks = [s.rank for s in samples]
    given = group_stacks(samples, one_per_rank=True, ranks=ranks)
    assert given == group_stacks(samples)
    assert [g.ranks[:2] for g in given] == [(0, 1), (40,), (70,)]
    with pytest.raises(ValueError, match="3 ranks for 65 samples"):
        group_stacks(samples, one_per_rank=True, ranks=ranks[:3])


@pytest.mark.parametrize(
    ("wheres", "odd"),
    [
        (["framework", "sleep"], (1,)),  # two ranks: one in the collective, one not
        (["framework"] * 4, ()),  # all in the framework: stacks do not tell
        (["sleep"] * 4, ()),  # nobody in the framework
        (["framework", "framework", "user", "dataloader"], (2, 3)),
        (["framework", "user", "user", "user"], ()),  # more outside than in: no odd ones
    ],
)
def test_odd_ones_out_rules(wheres: list[str], odd: tuple[int, ...]) -> None:
    samples = [
        stack(r, w, IN_ALLREDUCE if w == "framework" else IN_SLEEP) for r, w in enumerate(wheres)
    ]
    assert odd_ones_out(group_stacks(samples)) == odd


def test_only_each_ranks_latest_sample_counts() -> None:
    old = stack(2, "framework", IN_ALLREDUCE, time=T0)
    new = stack(2, "sleep", IN_SLEEP, time=T0 + 5)
    groups = group_stacks([new, old, stack(0, "framework", IN_ALLREDUCE)])
    assert [(g.where, g.ranks) for g in groups] == [("framework", (0,)), ("sleep", (2,))]


def test_render_words() -> None:
    text = render_stacks(RUN, group_stacks(hang(4, 2)), frames=2)
    assert text.splitlines()[:6] == [
        "run job: 4 ranks sampled, 2 distinct stacks",
        "",
        "3 ranks (0, 1, 3) in mindspore/.../grad_reducer.py AllReduce [framework]",
        f"  step 19, stalled 40 s, signature {hang(4, 2)[0].signature}",
        "    mindspore/common/api.py:1891 _exec_pip",
        "    mindspore/nn/wrap/grad_reducer.py:310 AllReduce",
    ]
    assert "    ... 2 more frames" in text
    assert (
        "rank 2 in job/train.py:98 on_train_step_begin [sleep]  <- not where the others are" in text
    )
    assert render_stacks(RUN, []) == "run job: no stack samples (no rank has been stalled)\n"


def test_from_wire_is_checked_and_bounded() -> None:
    raw = {
        "where": "user", "signature": "s" * 500, "step": 3, "time": T0, "stalled_s": 9.5,
        "note": "n" * 900,
        "frames": [["/" + "a" * 3000 + "\x07.py", 7, "f" * 900]] * (MAX_FRAMES + 40),
    }  # fmt: skip
    s = StackSample.from_dict(RUN, 1, raw)
    assert len(s.frames) == MAX_FRAMES and len(s.frames[0].file) == FILE_MAX
    assert len(s.signature) == 32 and len(s.note) == 200
    text = render_stacks(RUN, group_stacks([s]))
    assert "\x07" not in text and "?.py:7" in text


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (["not", "a", "mapping"], "must be a mapping"),
        ({"frames": "x", "where": "user", "time": 1.0}, "frames must be a list"),
        ({"frames": [["a", "7", "f"]], "where": "user", "time": 1.0}, "line must be an integer"),
        ({"frames": [["a", 7]], "where": "user", "time": 1.0}, "bad frame"),
        ({"frames": [], "where": "<script>", "time": 1.0}, "where"),
        ({"frames": [], "where": "user", "time": "now"}, "must be finite numbers"),
        ({"frames": [], "where": "user", "time": 1.0, "stalled_s": float("nan")}, "finite"),
        ({"frames": [], "where": "user", "time": 1.0, "step": 2.5}, "step must be an integer"),
    ],
)
def test_bad_wire_samples_say_what_is_wrong(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StackSample.from_dict(RUN, 0, raw)  # type: ignore[arg-type]
