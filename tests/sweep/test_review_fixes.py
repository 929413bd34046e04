"""Fixes from an exploratory review of sweeps and reports: a folder left before the first task
resumes, explicit graphs sweep, another build's results are not mixed in, one sweep per folder,
the report's fastest layout fits in memory, and measured files match as users write them."""

from __future__ import annotations

import fcntl
import json

import pytest

from collsim.report.sweep_report import write_report
from collsim.sweep import SweepError, load_spec, run_sweep
from collsim.sweep.runner import code_version

ONE = {"name": "one", "topologies": ["dgx-h100"], "nodes": [1], "collectives": ["all_reduce"],
       "algorithms": ["ring", "tree"], "sizes": [1048576], "engines": ["analytic"]}  # fmt: skip


def test_a_folder_left_before_the_first_task_resumes(spec_file, tmp_path):
    """Ctrl-C before any task finished left spec.json and points.csv but no manifest; the rerun
    it advised then refused the folder."""
    out = tmp_path / "res"
    out.mkdir()
    (out / "spec.json").write_text("{}")
    (out / "points.csv").write_text("kind,topology\n")
    done = run_sweep(load_spec(spec_file(ONE)), out, jobs=1)
    assert done.computed_tasks == 1 and done.points == 2
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SweepError, match="not a sweep results directory"):
        run_sweep(load_spec(spec_file(ONE)), tmp_path / "other", jobs=1)


def test_explicit_graphs_sweep(spec_file, tmp_path):
    spec = load_spec(spec_file({**ONE, "topologies": ["a100-pcie-fabric-2gpu"], "nodes": None}))
    done = run_sweep(spec, tmp_path / "res", jobs=1)
    assert done.computed_tasks == 1 and done.points == 2
    rows = (tmp_path / "res" / "points.csv").read_text()
    assert "an explicit graph" not in rows


def test_results_of_another_build_are_not_mixed_in(spec_file, tmp_path):
    out = tmp_path / "res"
    run_sweep(load_spec(spec_file(ONE)), out, jobs=1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["identity"]["collsim"] == code_version()
    manifest["identity"]["collsim"] = "0.0.1+older"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SweepError, match="another collsim build"):
        run_sweep(load_spec(spec_file(ONE)), out, jobs=1)


def test_one_sweep_per_folder_at_a_time(spec_file, tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    with (out / ".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running sweep holds it
        with pytest.raises(SweepError, match="another sweep is writing"):
            run_sweep(load_spec(spec_file(ONE)), out, jobs=1)


def test_the_report_recommends_only_layouts_that_fit(spec_file, tmp_path):
    """gpt-1.3b on two 40 GB A100s: without ZeRO its Adam state does not fit; the report named
    that layout fastest."""
    spec = {
        "name": "fit",
        "topologies": ["a100-pcie-2gpu"],
        "engines": ["analytic"],
        "steps": {"workloads": ["gpt-1.3b-ddp"], "layouts": [{"zero": 0}, {"tp": 2}]},
    }
    run_sweep(load_spec(spec_file(spec)), tmp_path / "res", jobs=1)
    rows = (tmp_path / "res" / "points.csv").read_text().splitlines()
    assert any(",false," in r for r in rows) and any(",true," in r for r in rows)
    write_report(tmp_path / "res", tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "layout tp2" in md and "do not fit in memory left out" in md


def test_measured_rows_match_as_users_write_them(spec_file, tmp_path):
    """A spreadsheet's byte-order mark, 1048576.0 for 1048576, and no algorithm column: the last
    compares with the tuner's pick only (it was every algorithm's prediction at once)."""
    run_sweep(load_spec(spec_file({**ONE, "algorithms": ["ring", "tree", "auto"]})),
              tmp_path / "res", jobs=1)  # fmt: skip
    measured = tmp_path / "m.csv"
    measured.write_bytes(
        "\ufeffcollective,size_bytes,time_us,nodes\nall_reduce,1048576.0,20,1.0\n".encode()
    )
    write_report(tmp_path / "res", tmp_path / "rep", measured=str(measured))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "1 matched points" in md
    header_only = tmp_path / "h.csv"
    header_only.write_text("collective,size_bytes,time_us\n")
    from collsim.errors import CollsimError

    with pytest.raises(CollsimError, match="only a header"):
        write_report(tmp_path / "res", tmp_path / "rep2", measured=str(header_only))
    assert not (tmp_path / "rep2" / "report.md").exists()
    assert not list((tmp_path / "rep2").glob("*.png"))  # refused before any plot


def test_the_report_names_the_sweep_from_its_points_file_and_refuses_no_points(spec_file, tmp_path):
    from collsim.errors import CollsimError

    run_sweep(load_spec(spec_file(ONE)), tmp_path / "res", jobs=1)
    write_report(tmp_path / "res" / "points.csv", tmp_path / "rep")
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# Sweep report: one")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "points.csv").write_text(
        (tmp_path / "res" / "points.csv").read_text().split("\n")[0] + "\n"
    )
    with pytest.raises(CollsimError, match="no points"):
        write_report(empty, tmp_path / "rep2")
