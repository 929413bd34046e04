"""Sweeps run locally: one row per point, results kept per task, resumed, Ctrl-C keeps them."""

from __future__ import annotations

import csv

import pytest

from collsim.cli import main
from collsim.sweep import SweepError, load_spec, read_points, run_sweep
from collsim.sweep.tasks import COLUMNS
from collsim.whatif import WhatIf


def test_local_run_one_row_per_point(spec_file, tmp_path):
    spec = load_spec(spec_file())
    out = run_sweep(spec, tmp_path / "res", jobs=2)
    rows = read_points(tmp_path / "res")
    assert out.points == len(rows) == spec.n_points
    assert out.computed_tasks == len(spec.tasks) and not out.interrupted
    with open(tmp_path / "res" / "points.csv", newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    bad = [r for r in rows if r["error"]]
    assert [r["layout"] for r in bad] == ["tp=3", "tp=3"]  # 3 does not divide 8 or 16 GPUs
    assert "does not divide" in bad[0]["error"]
    # the analytic rows are exactly what WhatIf.sweep gives
    from collsim.topology.loader import load_topology

    ring = [r for r in rows if r["nodes"] == "2" and r["collective"] == "all_reduce"
            and r["algorithm"] == "ring"]  # fmt: skip
    ref = WhatIf(load_topology("dgx-h100", nodes=2)).sweep(
        "all_reduce", "ring", [int(r["size_bytes"]) for r in ring], engine="analytic"
    )
    for row, point in zip(ring, ref.points, strict=True):
        assert float(row["time_us"]) == pytest.approx(point.time_s * 1e6, rel=1e-12)
        assert float(row["busbw_gbps"]) == pytest.approx(point.busbw_gbps, rel=1e-12)
        assert 0 < float(row["link_util"]) <= 1


def test_in_process_and_pool_agree_byte_for_byte(spec_file, tmp_path):
    spec = load_spec(spec_file())
    run_sweep(spec, tmp_path / "a", jobs=1)
    run_sweep(spec, tmp_path / "b", jobs=2)
    assert (tmp_path / "a/points.csv").read_bytes() == (tmp_path / "b/points.csv").read_bytes()


def test_rerun_resumes_and_extends(spec_file, tmp_path):
    small = load_spec(spec_file(nodes=[1]))
    first = run_sweep(small, tmp_path / "res", jobs=1)
    again = run_sweep(small, tmp_path / "res", jobs=1)
    assert again.computed_tasks == 0 and again.reused_tasks == first.tasks
    full = load_spec(spec_file())
    more = run_sweep(full, tmp_path / "res", jobs=1)
    assert more.reused_tasks == first.tasks
    assert more.computed_tasks == len(full.tasks) - first.tasks
    run_sweep(full, tmp_path / "fresh", jobs=1)
    assert (tmp_path / "res/points.csv").read_bytes() == (
        tmp_path / "fresh/points.csv"
    ).read_bytes()


def test_interrupt_keeps_finished_tasks_then_resumes(spec_file, tmp_path):
    spec = load_spec(spec_file())
    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 3:  # the start, then two finished tasks
            raise KeyboardInterrupt

    out = run_sweep(spec, tmp_path / "res", jobs=1, progress=progress)
    assert out.interrupted and out.computed_tasks == 2
    kept = read_points(tmp_path / "res")
    assert 0 < len(kept) == out.points < spec.n_points
    resumed = run_sweep(spec, tmp_path / "res", jobs=1)
    assert resumed.reused_tasks == 2 and not resumed.interrupted
    run_sweep(spec, tmp_path / "fresh", jobs=1)
    assert (tmp_path / "res/points.csv").read_bytes() == (
        tmp_path / "fresh/points.csv"
    ).read_bytes()


def test_damaged_part_is_recomputed(spec_file, tmp_path):
    spec = load_spec(spec_file(nodes=[1]))
    run_sweep(spec, tmp_path / "res", jobs=1)
    good = (tmp_path / "res/points.csv").read_bytes()
    part = next((tmp_path / "res/parts").glob("*.csv"))
    part.write_text("truncated")
    out = run_sweep(spec, tmp_path / "res", jobs=1)
    assert out.computed_tasks == 1
    assert (tmp_path / "res/points.csv").read_bytes() == good


def test_cli_sweep_and_bad_spec(spec_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(spec_file()), "-o", str(tmp_path / "res"), "-j", "1"])
    assert info.value.code == 0
    assert "rows in" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(spec_file(collectives=["allreduse"])), "-o", str(tmp_path / "x")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'collectives.0'" in err and "all_reduce" in err


def test_cli_dask_needs_a_scheduler(spec_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(spec_file()), "-o", str(tmp_path / "r"), "--executor", "dask"])
    assert info.value.code == 2
    assert "--scheduler" in capsys.readouterr().err


def test_not_a_results_directory(spec_file, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(SweepError, match="not a sweep results directory"):
        run_sweep(load_spec(spec_file()), tmp_path / "other", jobs=1)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["file.txt"]  # no .lock


def test_another_spec_into_the_same_folder_warns(spec_file, tmp_path, capsys):
    """Running another spec into a results folder used to replace its points.csv silently; now
    it says so (the first spec's parts stay, so rerunning it restores its table). Growing a spec
    (the same tasks and more) replaces nothing and stays quiet."""

    def sweep(**changes: object) -> str:
        with pytest.raises(SystemExit) as info:
            main(["sweep", str(spec_file(**changes)), "-o", str(tmp_path / "res"), "-j", "1"])
        assert info.value.code == 0
        return capsys.readouterr().err

    first = {"nodes": [1], "collectives": ["all_reduce"]}
    assert "not in this spec" not in sweep(**first)
    rows_first = (tmp_path / "res/points.csv").read_bytes()
    assert "not in this spec" not in sweep(nodes=[1])  # grown: all_gather added
    grown = {"min": "1K", "max": "256M", "factor": 8}  # more sizes: new task keys, no row lost
    assert "not in this spec" not in sweep(nodes=[1], sizes=grown)
    err = sweep(nodes=[2], collectives=["all_gather"], algorithms=["ring"], name="other")
    assert "spec 'small') are not in this spec's points.csv" in err and "parts/" in err
    sweep(**first)  # the first spec's table comes back from its parts
    assert (tmp_path / "res/points.csv").read_bytes() == rows_first
