"""A fault that spreads to every rank of 1,024, with seeded noise in what arrives when: the
incident names the injected rank alone, with the right cause, every other rank affected.
``bench/incident_cascades.py`` runs many seeds through a real ``serve``; these few run here."""

from __future__ import annotations

import pytest

from tests.aggregator.incidents.cascades import cascade, play, wrong


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scenario", ["nan", "hang", "crash"])
def test_the_injected_rank_is_the_only_culprit(scenario: str, seed: int) -> None:
    c = cascade(scenario, seed)
    tracker, changes = play(c)
    assert wrong(c, tracker) == ""
    (inc,) = tracker.incidents("job")
    assert inc.step is not None and abs(inc.step - c.onset) <= 1, inc.step
    assert [e.rank for e in inc.timeline[:1]] == [c.culprit]  # the culprit's evidence first
    assert [ch.change for ch in changes][:1] == ["opened"]
    if scenario == "hang":  # named by where it is, not only by who did not time out
        assert inc.basis.startswith("stacks:"), inc.basis


def test_the_noise_is_seeded_and_varies() -> None:
    a, b = cascade("hang", 0), cascade("hang", 0)
    assert a == b
    culprits = {cascade("hang", seed).culprit for seed in range(8)}
    onsets = {cascade("crash", seed).onset for seed in range(8)}
    assert len(culprits) > 4 and len(onsets) > 1
