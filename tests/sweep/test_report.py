"""``collsim report``: Markdown + HTML with PNG plots from a sweep's results."""

from __future__ import annotations

import pytest

import collsim.cli.base as cli_base
from collsim.cli import main
from collsim.sweep import load_spec, read_points, run_sweep


def test_report_renders_every_section(spec_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_base, "show_progress", lambda: True)  # as on a terminal
    spec = load_spec(spec_file(engines=["analytic", "des"], sizes=["1K", "64K", "4M"]))
    run_sweep(spec, tmp_path / "res", jobs=1)
    rows = [r for r in read_points(tmp_path / "res") if r["kind"] == "collective"]
    measured = tmp_path / "measured.csv"
    lines = ["collective,size_bytes,time_us,nodes,algorithm"]
    lines += [
        f"{r['collective']},{r['size_bytes']},{float(r['time_us']) * 1.1},{r['nodes']},"
        f"{r['algorithm']}"
        for r in rows
        if r["engine"] == "des" and r["algorithm"] == "ring"
    ]
    measured.write_text("\n".join(lines) + "\n")
    out = tmp_path / "rep"
    with pytest.raises(SystemExit) as info:
        main(["report", str(tmp_path / "res"), "-o", str(out), "--measured", str(measured)])
    assert info.value.code == 0
    assert "report: 100%" in capsys.readouterr().err  # a bar over the five sections
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    for heading in ("Bus bandwidth vs size", "Algorithm crossovers", "Link utilization",
                    "Scaling", "Predicted vs measured"):  # fmt: skip
        assert f"## {heading}" in md and f"<h2>{heading}</h2>" in page
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "predicted-vs-measured.png" in pngs
    assert any(p.startswith("busbw-") for p in pngs) and any(p.startswith("steps-") for p in pngs)
    for name in pngs:
        assert f"({name})" in md and f"src='{name}'" in page
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "median |error| 9.1%" in md  # predictions are measured / 1.1


def test_report_of_nothing_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["report", str(tmp_path), "-o", str(tmp_path / "rep")])
    assert info.value.code == 2
    assert "points.csv" in capsys.readouterr().err


def test_measured_rows_must_be_numbers_and_big_sweeps_say_what_is_not_plotted(
    spec_file, tmp_path, capsys, monkeypatch
):
    """A negative or unreadable measured time used to be skipped without a word; a section
    with more cases than it plots said nothing, and the crossover table held only those."""
    from collsim.report import sweep_report

    spec = load_spec(spec_file(engines=["analytic"], sizes=["1K", "4M"]))
    run_sweep(spec, tmp_path / "res", jobs=1)
    bad = tmp_path / "m.csv"
    bad.write_text("collective,size_bytes,time_us\nall_reduce,1024,-5\n")
    with pytest.raises(SystemExit) as info:
        main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r1"), "--measured", str(bad)])
    assert info.value.code == 2
    assert "field 'time_us': line 2: not a positive number (value: '-5')" in capsys.readouterr().err
    bad.write_text("collective,size_bytes,time_us,nodes\nall_reduce,1024,5,zero\n")
    with pytest.raises(SystemExit) as info:  # was left to "matches no predicted case"
        main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r1"), "--measured", str(bad)])
    assert info.value.code == 2
    assert "field 'nodes': line 2: not a whole number of nodes" in capsys.readouterr().err
    monkeypatch.setattr(sweep_report, "MAX_GROUPS", 1)
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "res"), "-o", str(tmp_path / "r2")])
    md = (tmp_path / "r2" / "report.md").read_text()
    assert "more cases not plotted (the first 1 are" in md


def test_unpicked_measured_rows_say_why_nothing_matched(tmp_path):
    """Rows without an algorithm matched several algorithms' points and were dropped because
    the sweep had no ``auto``: the report said only that nothing matched."""
    from collsim.report.figures import FigureWriter
    from collsim.report.sweep_report import _measured_section

    coll = [{"collective": "all_reduce", "size_bytes": "1024", "bytes": "1024", "error": "",
             "algorithm": a, "time_us": "10", "topology": "t", "nodes": "1"}
            for a in ("ring", "tree")]  # fmt: skip
    measured = [{"collective": "all_reduce", "size_bytes": "1024", "time_us": "12"}]
    blocks = _measured_section(coll, measured, FigureWriter(tmp_path, jobs=1))
    assert "1 measured row(s) name no algorithm" in blocks[-1][1]
    measured[0]["algorithm"] = "ring"
    assert "No measured point" not in str(
        _measured_section(coll, measured, FigureWriter(tmp_path, jobs=1))
    )


def test_measured_rows_that_match_nothing_are_counted(spec_file, tmp_path):
    """A measured row of a collective or size the sweep did not run was dropped unseen."""
    spec = load_spec(spec_file(engines=["analytic"], sizes=["1K"], nodes=[1], steps=None))
    run_sweep(spec, tmp_path / "res", jobs=1)
    measured = tmp_path / "m.csv"
    measured.write_text("collective,size_bytes,time_us,algorithm\nall_reduce,1024,20,ring\n"
                        "bogus,1024,20,ring\nall_reduce,3333,20,ring\n")  # fmt: skip
    out = tmp_path / "rep"
    with pytest.raises(SystemExit) as info:
        main(["report", str(tmp_path / "res"), "-o", str(out), "--measured", str(measured)])
    assert info.value.code == 0
    md = (out / "report.md").read_text()
    assert "1 matched points" in md
    assert "2 measured row(s) match no predicted case (e.g. bogus 1024 B)" in md
