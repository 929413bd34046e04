"""The result store: atomic records, resume, and what an interrupted run leaves behind."""

from __future__ import annotations

import json

import pytest

from collsim.calibration import read_log
from collsim.calibration.store import ResultStore, point_key
from collsim.calibration.writer import row_from_times
from collsim.errors import CalibrationError

IDENTITY = {"runner": "torch", "ranks": 4, "dtype": "float"}


def _row(size: int):
    return row_from_times(
        "all_reduce", 4, size, "float", oop_time_s=None, ip_time_s=1e-5 + size / 1e9, ip_wrong=0
    )


def _filled(tmp_path, sizes=(1024, 2048, 4096)):
    store = ResultStore(tmp_path, IDENTITY)
    store.set_preamble("all_reduce", ["# Collective test starting: all_reduce_perf"])
    for size in sizes:
        store.record_point("all_reduce", _row(size))
    return store


def test_points_are_recorded_and_render_a_readable_log(tmp_path):
    store = _filled(tmp_path)
    assert all(store.done(point_key("all_reduce", s)) for s in (1024, 2048, 4096))
    assert not store.done(point_key("all_reduce", 8192))
    log = read_log(tmp_path / "logs" / "all_reduce.txt", ranks=4)
    assert [r.size_bytes for r in log.rows] == [1024, 2048, 4096] and log.anomalies == ()
    reopened = ResultStore(tmp_path, IDENTITY)  # a rerun sees the same state
    assert reopened.problems() == []
    assert [r.size_bytes for r in reopened.rows("all_reduce")] == [1024, 2048, 4096]
    assert not list(tmp_path.rglob("*.tmp"))


def test_settle_brings_a_lagging_log_up_to_the_recorded_points(tmp_path):
    """A process killed between keeping a point and re-rendering the log leaves the log behind."""
    store = _filled(tmp_path, sizes=(1024, 2048))
    lagging = (tmp_path / "logs" / "all_reduce.txt").read_text()
    store.record_point("all_reduce", _row(4096))
    (tmp_path / "logs" / "all_reduce.txt").write_text(lagging)  # as if killed before the render
    assert len(read_log(tmp_path / "logs" / "all_reduce.txt", ranks=4).rows) == 2
    settled = ResultStore(tmp_path, {}).settle()
    assert settled == [tmp_path / "logs" / "all_reduce.txt"]
    log = read_log(settled[0], ranks=4)
    assert [r.size_bytes for r in log.rows] == [1024, 2048, 4096]


def test_truncated_result_file_is_detected_not_used(tmp_path):
    _filled(tmp_path)
    damaged = tmp_path / "points" / "all_reduce" / "2048.json"
    damaged.write_bytes(damaged.read_bytes()[:40])  # as if cut off by a crash or a full disk
    store = ResultStore(tmp_path, IDENTITY)
    problems = store.problems()
    assert len(problems) == 1 and "2048.json: truncated or changed" in problems[0]
    assert not store.done(point_key("all_reduce", 2048))
    assert [r.size_bytes for r in store.rows("all_reduce")] == [1024, 4096]
    store.record_point("all_reduce", _row(2048))  # measured again
    assert ResultStore(tmp_path, IDENTITY).problems() == []


def test_kill_leftovers_are_reported_and_ignored(tmp_path):
    store = _filled(tmp_path, sizes=(1024,))
    folder = tmp_path / "points" / "all_reduce"
    (folder / ".2048.json.abc123.tmp").write_text('{"collective": "all_re')  # killed mid-write
    unrecorded = folder / "4096.json"  # written, killed before the manifest was updated
    unrecorded.write_text(json.dumps({"collective": "all_reduce", "row": {}}))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "all_gather.partial").write_text("# nThread 1 nGpus 1\n")
    problems = ResultStore(tmp_path, IDENTITY).problems()
    assert any(".2048.json.abc123.tmp: temporary file" in p for p in problems)
    assert any("4096.json: not in the manifest" in p for p in problems)
    assert any("all_gather.partial: output of a run that did not finish" in p for p in problems)
    store = ResultStore(tmp_path, IDENTITY)
    store.clean()
    assert not list(tmp_path.rglob(".*.tmp"))
    assert store.done(point_key("all_reduce", 1024)) and not store.done("all_reduce/4096")


def test_a_different_run_is_refused(tmp_path):
    _filled(tmp_path)
    with pytest.raises(CalibrationError, match="ranks=4, this run has 8; use another --out"):
        ResultStore(tmp_path, {**IDENTITY, "ranks": 8})
    (tmp_path / "manifest.json").write_text("{ not json")
    with pytest.raises(CalibrationError, match="unreadable manifest"):
        ResultStore(tmp_path, IDENTITY)


@pytest.mark.parametrize(
    "edit",
    [{"points": {"x": 5}}, {"points": [1, 2]}, {"points": {"x": {"file": 3, "sha256": "ab"}}},
     {"preambles": []}, {"preambles": {"all_reduce": "# one line"}}],
)  # fmt: skip
def test_a_hand_edited_manifest_entry_is_a_one_line_error(tmp_path, edit):
    """``{"points": {"x": 5}}`` was a TypeError traceback on the next run, ``"preambles": []``
    an AttributeError when the log was rendered."""
    _filled(tmp_path, sizes=(1024,))
    manifest = tmp_path / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc.update(edit)
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match="manifest entry") as err:
        ResultStore(tmp_path, IDENTITY)
    assert err.value.field == "points"
