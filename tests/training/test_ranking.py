"""Spearman rank correlation, layout groups and the leave-one-source-out calibration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collsim.training.ranking import layout_groups, ranks, spearman
from collsim.training.reference import (
    Predictor,
    calibrate_on_runs,
    leave_one_source_out,
    load_runs,
    to_reference,
)


def test_ranks_share_ties():
    assert list(ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]


def test_spearman_hand_computed():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ranks (1, 2, 3, 4) vs (1, 3, 2, 4): 1 - 6 x 2 / (4 x 15) = 0.8.
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # With ties: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): the Pearson r of the ranks.
    a, b = np.array([1, 2.5, 2.5, 4]), np.array([1, 2, 3, 4])
    assert spearman([1, 5, 5, 9], [1, 2, 3, 4]) == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_groups_need_three_configurations_and_merge_repeats():
    rows = [
        {"g": "A", "c": "x", "measured_s": 1.0, "predicted_s": 1.1},
        {"g": "A", "c": "x", "measured_s": 3.0, "predicted_s": 1.1},  # a repeat: mean 2.0
        {"g": "A", "c": "y", "measured_s": 3.0, "predicted_s": 3.0},
        {"g": "A", "c": "z", "measured_s": 1.5, "predicted_s": 0.5},
        {"g": "B", "c": "x", "measured_s": 1.0, "predicted_s": 1.0},
        {"g": "B", "c": "y", "measured_s": 2.0, "predicted_s": 2.0},
    ]
    groups = layout_groups(rows, lambda r: r["g"], lambda r: r["c"])
    assert [g.key for g in groups] == ["A"]
    (a,) = groups
    assert a.labels == ["x", "y", "z"] and a.measured_s == [2.0, 3.0, 1.5]
    assert a.rho == pytest.approx(1.0)


SMALL = [
    "korthikanti2022-t4-22B-layer-baseline-no-recompute",
    "korthikanti2022-t4-22B-layer-selective-recompute",
    "bridge-25.11-dgx-h100-llama3-8b-8gpu-fp8-cs",
    "bridge-25.11-dgx-b200-llama3-8b-8gpu-fp8-csfp8-mx",
]


def test_leave_one_source_out_fits_without_the_left_out_source(tmp_path):
    raw = {r["id"]: r for r in load_runs()}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([raw[i] for i in SMALL]))
    out = leave_one_source_out(path=path)
    assert set(out) == {"korthikanti2022", "megatron-bridge-perf"}
    pred = Predictor()
    bridge = [to_reference(raw[i]) for i in SMALL[2:]]
    layers = [to_reference(raw[i]) for i in SMALL[:2]]
    # Korthikanti's runs left out: the efficiency is the one fitted on the Bridge runs alone.
    eff, errors = out["korthikanti2022"]
    assert eff == pytest.approx(calibrate_on_runs(pred, bridge))
    assert eff != pytest.approx(calibrate_on_runs(pred, layers), rel=1e-3)
    assert len(errors) == 2
    expected = [(pred.predict(r, eff) - r.measured_s) / r.measured_s for r in layers]
    assert errors == pytest.approx(expected)
