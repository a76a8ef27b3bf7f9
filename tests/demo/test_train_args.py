"""The demo job's options (demo/train_mindspore.py imports MindSpore only inside main)."""

from __future__ import annotations

import pytest
from rankwatch.demo import launcher, simulate, train_mindspore


def test_every_launcher_fault_is_known_to_both_jobs_and_explained() -> None:
    assert launcher.FAULTS == simulate.FAULTS == train_mindspore.FAULTS
    assert set(launcher.WHAT_TO_LOOK_FOR) == set(launcher.FAULTS)


def test_sdc_takes_a_gradient_error_and_refuses_a_factor_of_zero_or_less(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = train_mindspore.parse_args(["--fault", "sdc"])
    assert args.fault == "sdc" and args.sdc_eps == train_mindspore.SDC_EPS == 0.5
    assert train_mindspore.parse_args(["--fault", "sdc", "--sdc-eps", "-0.5"]).sdc_eps == -0.5
    with pytest.raises(SystemExit):
        train_mindspore.parse_args(["--fault", "sdc", "--sdc-eps", "-1"])
    assert "--sdc-eps must be > -1" in capsys.readouterr().err
