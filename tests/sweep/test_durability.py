"""Harness durability: a sweep killed with SIGKILL resumes without losing a finished task, and
damaged result files are reported and never used."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from collsim.cli import main
from collsim.sweep import SweepError, load_spec, read_points, run_sweep

SLOW_SPEC = {  # six DES tasks, ~0.2-5 s each: long enough to be killed between two of them
    "name": "killed",
    "topologies": ["dgx-h100"],
    "nodes": [8, 16],
    "collectives": ["all_reduce", "all_gather", "alltoall"],
    "algorithms": ["all"],
    "sizes": {"min": "1K", "max": "64M", "factor": 64},
    "engines": ["des"],
}


def _collsim() -> list[str]:
    script = Path(sys.executable).parent / "collsim"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from collsim.cli import main; main()"]


def _recorded(res: Path) -> dict[str, dict]:
    try:
        return json.loads((res / "manifest.json").read_text())["points"]
    except (OSError, ValueError, KeyError):
        return {}


def test_sigkill_mid_sweep_loses_no_finished_task(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SLOW_SPEC))
    spec = load_spec(spec_path)
    res = tmp_path / "res"
    proc = subprocess.Popen(
        [*_collsim(), "sweep", str(spec_path), "-o", str(res), "-j", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _recorded(res) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up, no finally: as the OOM killer does
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != -signal.SIGKILL:
        pytest.skip("the sweep finished before it could be killed (machine too fast)")
    kept = _recorded(res)
    assert 1 <= len(kept) < len(spec.tasks), "killed after the first task, before the last"
    parts = {key: (res / entry["file"]).read_bytes() for key, entry in kept.items()}

    out = subprocess.run(
        [*_collsim(), "sweep", str(spec_path), "-o", str(res), "-j", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert f"{len(spec.tasks) - len(kept)} tasks computed, {len(kept)} reused" in out.stdout
    after = _recorded(res)
    assert set(after) == {t.key for t in spec.tasks}
    for key, data in parts.items():  # what finished before the kill is kept as it was
        assert after[key] == kept[key] and (res / after[key]["file"]).read_bytes() == data
    assert len(read_points(res)) == spec.n_points
    assert not list(res.rglob(".*.tmp"))


def _session(sid: int) -> list[int]:
    """Processes still alive in session ``sid`` (the sweep started its own)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid:
                    alive.append(int(entry.name))
    return alive


def test_sigterm_stops_a_parallel_sweep_keeping_its_tasks_and_no_worker(tmp_path):
    """Slurm's scancel sends SIGTERM: the sweep stops as on Ctrl-C (finished tasks merged into
    points.csv) and leaves no worker process running."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SLOW_SPEC))
    res = tmp_path / "res"
    proc = subprocess.Popen(
        [*_collsim(), "sweep", str(spec_path), "-o", str(res), "-j", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _recorded(res) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if proc.poll() is not None:
            pytest.skip("the sweep finished before it could be stopped (machine too fast)")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        time.sleep(0.5)  # let terminated workers be reaped
        leftover = _session(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err
    assert leftover == [], "a worker outlived the sweep"
    assert (res / "points.csv").exists() and read_points(res)


@pytest.fixture
def finished(spec_file, tmp_path):
    spec = load_spec(spec_file(nodes=[1]))
    run_sweep(spec, tmp_path / "res", jobs=1)
    return spec, tmp_path / "res"


def test_truncated_part_is_reported_and_recomputed(finished, spec_file, capsys):
    spec, res = finished
    good = (res / "points.csv").read_bytes()
    part = sorted((res / "parts").glob("*.csv"))[0]
    part.write_bytes(part.read_bytes()[:50])  # cut off, as by a full disk
    (res / "parts" / f".{part.name}.x1y2.tmp").write_text("half a wri")  # killed mid-write
    out = run_sweep(spec, res, jobs=1)
    assert out.computed_tasks == 1
    assert any(f"{part}: truncated or changed" in p for p in out.problems)
    assert any("temporary file of an interrupted write" in p for p in out.problems)
    assert (res / "points.csv").read_bytes() == good
    part.write_bytes(part.read_bytes()[:50])
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(spec_file(nodes=[1])), "-o", str(res), "-j", "1"])
    assert info.value.code == 0
    err = capsys.readouterr().err
    assert f"# warning: {part}: truncated or changed" in err
    assert (res / "points.csv").read_bytes() == good
    assert run_sweep(spec, res, jobs=1).problems == ()  # and the next run finds nothing wrong


def test_truncated_points_file_is_refused(finished, capsys):
    _spec, res = finished
    text = (res / "points.csv").read_text()
    (res / "points.csv").write_text(text[: len(text) - 40])  # last row cut in the middle
    n_lines = text.count("\n")
    with pytest.raises(SweepError, match="truncated") as info:
        read_points(res)
    assert info.value.field == f"line {n_lines}"  # the cut-off last line
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(res), "-o", str(res / "report")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "points.csv" in err and "truncated" in err


@pytest.mark.parametrize("cell", ["", "nan", "inf", "-3", "fast"])
def test_points_row_without_its_result_is_refused(finished, capsys, cell):
    """A row that claims no error yet holds no usable time (a hand edit, a file damaged in place
    with its line ends intact) is refused by name, not reported as '0 could not be computed'."""
    import csv
    import io

    _spec, res = finished
    rows = list(csv.DictReader(io.StringIO((res / "points.csv").read_text())))
    victim = next(i for i, r in enumerate(rows) if r["kind"] == "collective" and not r["error"])
    rows[victim]["time_us"] = cell
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (res / "points.csv").write_text(out.getvalue())
    with pytest.raises(SweepError, match="damaged") as info:
        read_points(res)
    assert info.value.field == f"line {victim + 2}, time_us"
    assert info.value.value == cell
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(res), "-o", str(res / "report")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "points.csv" in err and "time_us" in err


def test_points_row_of_unknown_kind_is_refused(finished):
    _spec, res = finished
    text = (res / "points.csv").read_text()
    head, first, rest = text.split("\n", 2)
    (res / "points.csv").write_text("\n".join([head, "bogus" + first[first.index(",") :], rest]))
    with pytest.raises(SweepError, match="unknown row kind") as info:
        read_points(res)
    assert info.value.field == "line 2, kind" and info.value.value == "bogus"


def test_truncated_manifest_is_an_error_not_a_fresh_start(finished, spec_file):
    spec, res = finished
    manifest = res / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:30])
    with pytest.raises(SweepError, match="unreadable manifest"):
        run_sweep(spec, res, jobs=1)


def test_workers_end_with_a_killed_sweep(tmp_path):
    """SIGKILL leaves the parent no chance to terminate its pool: the workers, blocked on their
    queue, lived on as orphans until killed by hand. They now end with it."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SLOW_SPEC))
    proc = subprocess.Popen(
        [*_collsim(), "sweep", str(spec_path), "-o", str(tmp_path / "res"), "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2 and proc.poll() is None:
            out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)],
                                 capture_output=True, text=True, check=False)  # fmt: skip
            workers = [int(p) for p in out.stdout.split()]
            time.sleep(0.05)
        if len(workers) < 2:
            pytest.skip("the pool did not start in time")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        alive = workers
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            time.sleep(0.05)
        assert not alive, f"workers {alive} outlived the sweep"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
