"""The published reference runs load, and a few small ones are predicted within 10%."""

from __future__ import annotations

import pytest

from collsim.analysis.reference import Predictor, load_runs, to_reference
from collsim.analysis.step import DEFAULT_EFFICIENCY


def test_all_runs_become_workloads_with_a_measured_time():
    runs = [to_reference(r) for r in load_runs()]
    assert len(runs) == 40
    assert all(r.measured_s > 0 for r in runs)
    assert sum(r.layer for r in runs) == 5


@pytest.mark.parametrize("run_id", ["korthikanti2022-t5-22B-full", "korthikanti2022-t5-22B-seqsel"])
def test_small_reference_runs_within_ten_percent(run_id):
    run = next(to_reference(r) for r in load_runs() if r["id"] == run_id)
    predicted = Predictor().predict(run, DEFAULT_EFFICIENCY)
    assert predicted == pytest.approx(run.measured_s, rel=0.10)
