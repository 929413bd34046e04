"""Issue 28's targets and the scale series, on made-up results: the report's target table is
computed from the numbers, and a target without evidence is a MISS."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from collsim.calibration.dataset import DatasetEntry, load_index
from collsim.calibration.report import Report
from collsim.calibration.report_jobs import RunStats
from collsim.calibration.report_text import busbw_lines, series_lines, target_lines, targets_of
from collsim.calibration.scale_series import series_of
from collsim.calibration.targets import busbw_error, busbw_share, issue_targets, series_rows


def entry(name: str, nodes: int, collective: str = "all_reduce", topology: str = "polaris",
          source: str = "github.com/a/b : x.md") -> DatasetEntry:  # fmt: skip
    return DatasetEntry(Path(f"logs/{name}"), collective, None, 4, nodes, 4 * nodes, None, None,
                        None, source, "", topology, "exact", {})  # fmt: skip


ENTRIES = [
    entry("sys-2n-all_reduce-1.txt", 2),
    entry("sys-8n-all_reduce-1.txt", 8),
    entry("sys-256n-all_reduce-1.txt", 256),
    entry("sys-540n-all_reduce-1.txt", 540),
    entry("sys-2n-alltoall-1.txt", 2, "alltoall"),
    entry("sys-32n-alltoall-1.txt", 32, "alltoall"),
    entry("big-18n-all_reduce-1.txt", 18, topology="nvl"),
    entry("big-32n-all_reduce-1.txt", 32, topology="nvl"),
    entry("one-1n-all_reduce-1.txt", 1, topology="h"),  # one scale: no series
    # the same topology and collective from another source is another system
    entry("other-4n-all_reduce-1.txt", 4, source="github.com/c/d : y.md"),
]


def test_series_group_by_topology_collective_and_source_and_split_at_8_nodes():
    found = {s.name: s for s in series_of(ENTRIES)}
    assert sorted(found) == ["big all_reduce", "sys all_reduce", "sys alltoall"]
    ar = found["sys all_reduce"]
    assert ar.nodes_of(ar.fit_on) == [2, 8] and ar.nodes_of(ar.predict) == [256, 540]
    assert ar.in_target and not ar.note
    big = found["big all_reduce"]  # no log at <= 8 nodes: fitted at 18, outside the target
    assert big.nodes_of(big.fit_on) == [18] and big.nodes_of(big.predict) == [32]
    assert not big.in_target and "no log is at 8 nodes or fewer" in big.note


def test_series_outside_the_predicted_range_are_shown_beside_the_target():
    found = series_of([entry("s-1n-all_reduce-1.txt", 1), entry("s-9n-all_reduce-1.txt", 9)])
    assert not found[0].in_target and "outside 16-540" in found[0].note


def test_the_bundled_dataset_has_five_target_series():
    found = series_of(load_index())
    assert sorted(s.name for s in found if s.in_target) == [
        "a100-polaris-slingshot all_gather", "a100-polaris-slingshot all_reduce",
        "a100-polaris-slingshot alltoall", "gb300-oci-nvl72-roce8x400 all_reduce",
        "gb300-oci-nvl72-roce8x400 alltoall",
    ]  # fmt: skip


SERIES = series_of(ENTRIES)
UNCAL = {e.name: 0.30 for e in ENTRIES}


def targets(cross_scale, in_sample=None, cross_collective=None, busbw=None):
    mape = {"uncalibrated": UNCAL, "cross_scale": cross_scale,
            "in_sample": {"a": 0.04, "b": 0.05, "c": 0.09} if in_sample is None else in_sample,
            "cross_collective": ({"a": 0.07, "b": 0.12} if cross_collective is None
                                 else cross_collective)}  # fmt: skip
    rows = issue_targets(mape, SERIES, busbw if busbw is not None else {"x": 0.1})
    return {r.name.split(" (")[0]: r for r in rows}


def test_targets_are_computed_from_the_results():
    # Target series: sys all_reduce (256n 0.05, 540n 0.09) and sys alltoall (32n 0.25).
    got = targets({"sys-256n-all_reduce-1.txt": 0.05, "sys-540n-all_reduce-1.txt": 0.09,
                   "sys-32n-alltoall-1.txt": 0.25, "big-32n-all_reduce-1.txt": 0.9})  # fmt: skip
    med = got["cross-scale median MAPE"]
    assert med.value == pytest.approx(0.09) and med.over == 3 and med.passed  # big: not counted
    worst = got["cross-scale worst series"]
    assert worst.value == pytest.approx(0.25) and worst.over == 2 and not worst.passed
    assert got["in-sample median MAPE"].value == pytest.approx(0.05)
    assert got["in-sample median MAPE"].passed  # <= 5%: met at the limit
    cc = got["cross-collective median MAPE"]
    assert cc.value == pytest.approx(0.095) and not cc.passed and cc.verdict == "MISS"


def test_a_target_series_without_a_result_is_a_miss():
    got = targets({"sys-256n-all_reduce-1.txt": 0.05, "sys-540n-all_reduce-1.txt": 0.05})
    assert not got["cross-scale median MAPE"].passed  # the alltoall log has no result
    assert not got["cross-scale worst series"].passed
    rows = series_rows(SERIES, UNCAL, {"sys-256n-all_reduce-1.txt": 0.05})
    ar = next(r for r in rows if r.series.name == "sys all_reduce")
    assert ar.missing == ("sys-540n-all_reduce-1.txt",) and ar.passed is False
    big = next(r for r in rows if r.series.name == "big all_reduce")
    assert big.passed is None  # outside the target


def test_nothing_to_measure_is_a_miss_not_a_pass():
    got = targets({}, in_sample={}, cross_collective={}, busbw={})
    assert all(not r.passed and r.verdict == "MISS" for r in got.values())
    assert got["in-sample median MAPE"].value is None


def test_busbw_share_counts_logs_within_15_percent():
    share = busbw_share({"a": 0.05, "b": 0.15, "c": 0.30, "d": 0.10, "e": 0.01})
    assert share.value == pytest.approx(0.8) and share.passed and share.over == 5
    assert not busbw_share({"a": 0.05, "c": 0.30}).passed
    # The mean over rows >= 256 MiB; smaller rows do not count.
    pts = [(1024, 10.0, 100.0), (256 * 1024**2, 100.0, 90.0), (1024**3, 100.0, 130.0)]
    assert busbw_error(pts) == pytest.approx(0.2)
    assert busbw_error(pts[:1]) is None


def fake_report():
    uncal = [SimpleNamespace(file="sys-2n-all_reduce-1.txt",
                             points=[SimpleNamespace(bytes=2**30, measured_busbw_gbps=10.0,
                                                     predicted_busbw_gbps=12.0)]),
             SimpleNamespace(file="sys-540n-all_reduce-1.txt",
                             points=[SimpleNamespace(bytes=2**30, measured_busbw_gbps=10.0,
                                                     predicted_busbw_gbps=10.5)])]  # fmt: skip

    rep = SimpleNamespace(
        mape={"uncalibrated": UNCAL, "cross_scale": {"sys-256n-all_reduce-1.txt": 0.03,
                                                     "sys-540n-all_reduce-1.txt": 0.05,
                                                     "sys-32n-alltoall-1.txt": 0.074},
              "in_sample": {"a": 0.02}, "cross_collective": {"a": 0.2}},
        series=SERIES, nodes={e.name: e.nodes for e in ENTRIES}, exact=set(),
        validations={"uncalibrated": SimpleNamespace(logs=uncal)}, stats=RunStats(),
        unfitted={"big-all_reduce (cross_scale)": "5 measured rows cannot determine 7"},
        left_out=[],
    )  # fmt: skip
    rep.multi_node_busbw_errors = lambda: Report.multi_node_busbw_errors(rep)
    return rep


def test_the_report_tables_print_what_the_targets_compute():
    rep = fake_report()
    rows = targets_of(rep)
    assert [r.verdict for r in rows] == ["PASS", "PASS", "MISS", "PASS", "MISS"]
    text = "\n".join(target_lines(rep))
    assert (
        "| cross-scale median MAPE (logs of the target's series) | 3 | 5.0% | <= 10% | **PASS** |"
        in text
    )
    assert "| 2 | 50.0% | >= 80% | **MISS** |" in text  # 2n: 20% off, 540n: 5% off
    series = "\n".join(series_lines(rep))
    assert "| sys all_reduce | polaris | 2, 8 | 256, 540 | 30.0 | 4.0 | 20 | **PASS** |" in series
    assert "| big all_reduce | nvl | 18 | 32 | 30.0 | -- | -- | -- |" in series
    assert "no cross-scale result for big-32n-all_reduce-1 (5 measured rows cannot" in series
    busbw = "\n".join(busbw_lines(rep))
    assert "| sys-540n-all_reduce-1 | 540 | approximate | 5.0 | yes |" in busbw
    # A changed number changes the verdict: nothing is written by hand.
    rep.mape["cross_scale"]["sys-32n-alltoall-1.txt"] = 0.31
    assert "| sys alltoall | polaris | 2 | 32 | 30.0 | 31.0 | 20 | **MISS** |" in "\n".join(
        series_lines(rep)
    )
