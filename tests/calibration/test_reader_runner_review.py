"""Review fixes in the nccl-tests readers and the calibration runner.

Each test failed on the code before its fix: wrongly typed ``-J`` JSON header fields crashed the
reader or were misread, a number with NCCL INFO output glued to it was lost from its row, a run cut
short with exit status 0 was recorded as done, ``--timeout inf`` overflowed, and some messages
said what was not so.
"""

from __future__ import annotations

import copy
import json
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from collsim.calibration import read_log
from collsim.calibration._text import Scanner
from collsim.calibration.dataset import DATA_DIR
from collsim.cli import cli
from collsim.errors import CalibrationError
from tests.calibration.conftest import DEVICES, FOOTER, HEADER, ROWS, standard_log

SAMPLE = DATA_DIR / "logs" / "h100-snellius-ib-2n-all_reduce-1.txt"  # 8 ranks, 8 B .. 8 GiB


def _result(size: int, time_us: float) -> dict:
    """One all_reduce result on 4 ranks as nccl-tests writes it (busbw = algbw x 1.5)."""
    alg = round(size / time_us / 1e3, 6)
    group = {"time": time_us, "alg_bw": alg, "bus_bw": alg * 1.5, "nwrong": 0.0}
    return {"size": size, "count": size // 4, "type": "float", "redop": "sum",
            "root": "    -1", "out_of_place": group, "in_place": dict(group),
            "actual_iterations": 20, "experiment_name": ""}  # fmt: skip


# The shape nccl-tests' src/util.cu writes (one device entry per process, booleans as strings).
DOC = {
    "version": 1,
    "start_time": "2025-06-01 12:00:00",
    "args": ["./build/all_reduce_perf", "-b", "1K", "-e", "4K", "-g", "4", "-J", "run.json"],
    "env": ["PATH=/usr/bin", "NCCL_ALGO=Ring"],
    "nccl_version": 22703,
    "config": {
        "nthreads": 1,
        "ngpus": 4,
        "minimum_bytes": 1024,
        "maximum_bytes": 4096,
        "step_factor": 2,
        "warmup_iters": 5,
        "iterations": 20,
        "aggregated_iterations": 1,
        "validation": 1,
        "graph": 0,
        "blocking_collectives": "false",
        "parallel_init": "false",
        "devices": [
            {
                "rank": 0,
                "group": 0,
                "pid": 4242,
                "hostname": "nodeA",
                "device": 0,
                "device_hex": "0000:04:00",
                "device_info": "NVIDIA H100 80GB HBM3",
            }
        ],
    },
    "results": [_result(1024, 10.24), _result(2048, 10.24), _result(4096, 20.48)],
    "out_of_bounds": {"count": 0, "okay": "true"},
    "average_bus_bandwidth": {"bandwidth": 0.2, "okay": "unchecked"},
    "errors": [],
    "end_time": "2025-06-01 12:00:05",
}


def _doc(path: str, value: object) -> dict:
    """DOC with the field at dotted ``path`` (``config.devices``) set to ``value``."""
    doc = copy.deepcopy(DOC)
    *outer, last = path.split(".")
    target = doc
    for key in outer:
        target = target[key]
    target[last] = value
    return doc


def test_the_reference_document_reads_cleanly(write):
    log = read_log(write(json.dumps(DOC), "run.json"))
    assert (log.collective, log.ranks, log.nodes, log.gpus_per_thread) == ("all_reduce", 4, 1, 4)
    assert (log.nccl_version, log.nccl_env, log.avg_busbw) == ("2.27.3", {"NCCL_ALGO": "Ring"}, 0.2)
    assert log.anomalies == () and log.notes == ()


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        ("config", [1, 2], "config", "not a JSON object"),
        ("config.devices", [1, 2], r"config\.devices\[0\]", "not a device object"),
        ("config.devices", "nodeA", r"config\.devices", "not a list of device objects"),
        ("config.ngpus", "x", r"config\.ngpus", "not a whole number"),
        ("config.ngpus", "\u00b2", r"config\.ngpus", "not a whole number"),  # '2' superscript
        ("config.ngpus", 1e30, r"config\.ngpus", "must be <= 2147483647"),
        ("config.nthreads", 0, r"config\.nthreads", "must be >= 1"),
        ("nccl_version", "two", "nccl_version", "not an NCCL version code"),
        ("nccl_version", [2, 27], "nccl_version", "not an NCCL version code"),
        ("average_bus_bandwidth", 4.3, "average_bus_bandwidth", "not a JSON object"),
        ("average_bus_bandwidth", {"bandwidth": "fast"}, r"average_bus_bandwidth\.bandwidth",
         "not a number"),
        ("args", "all_reduce_perf -b 8", "args", "not a list of command-line words"),
        ("env", "NCCL_ALGO=Ring", "env", "not a list of NAME=value"),
        ("env", [1], r"env\[0\]", "not a string"),
        ("out_of_bounds", {"count": "3x"}, r"out_of_bounds\.count", "not a whole number"),
        ("out_of_bounds", {"count": 3, "okay": "true"}, r"out_of_bounds\.okay", "says OK for 3"),
        ("out_of_bounds", {"count": 0, "okay": "maybe"}, r"out_of_bounds\.okay", "not true or"),
    ],
)  # fmt: skip
def test_a_wrongly_typed_header_field_is_an_error_naming_it(write, path, value, field, message):
    """These crashed with AttributeError/ValueError/TypeError tracebacks, or were misread (a
    string ``args`` made the collective its first character; a string ``env`` was ignored)."""
    file = write(json.dumps(_doc(path, value)), "bad.json")
    with pytest.raises(CalibrationError, match=rf"bad\.json: field '{field}': {message}"):
        read_log(file)


def test_sensible_header_variants_are_read(write):
    """A version string is a version; a bandwidth written as a string is a number (it was kept
    as a string, and ``calibrate read`` then failed to print it); an out-of-bounds count without
    ``okay`` is judged by its count, as nccl-tests does (3 values were reported "OK")."""
    log = read_log(write(json.dumps(_doc("nccl_version", "2.27.3")), "v.json"))
    assert log.nccl_version == "2.27.3"
    path = write(json.dumps(_doc("average_bus_bandwidth", {"bandwidth": "4.3"})), "bw.json")
    assert read_log(path).avg_busbw == 4.3
    result = CliRunner().invoke(cli, ["calibrate", "read", str(path)])
    assert result.exit_code == 0 and "# Avg bus bandwidth    : 4.3" in result.output
    nan = read_log(write(json.dumps(_doc("average_bus_bandwidth", {"bandwidth": "nan"})), "n.json"))
    assert nan.avg_busbw is None and any("'nan'" in n for n in nan.notes)
    oob = read_log(write(json.dumps(_doc("out_of_bounds", {"count": 3})), "oob.json"))
    assert any("3 out-of-bounds values (FAILED)" in a for a in oob.anomalies)


def test_a_bad_header_is_one_line_exit_2_on_the_command_line(write):
    path = write(json.dumps(_doc("config.ngpus", "x")), "run.json")
    result = CliRunner().invoke(cli, ["calibrate", "read", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        f"collsim: error: {path}: field 'config.ngpus': not a whole number (value: 'x')"
    ]


# --- NCCL INFO output glued to a row's number --------------------------------------------------

INFO = "node1:1001:1050 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"


def _glued(after: str) -> list[str]:
    """ROWS with row 2 broken right after its out-of-place ``after`` value by a glued INFO line."""
    cut = ROWS[1].index(after) + len(after)
    return [ROWS[0], ROWS[1][:cut] + INFO, ROWS[1][cut:], ROWS[2]]


@pytest.mark.parametrize("after", ["0.15      0", "0.10    0.15", "-1"])
def test_a_number_with_info_glued_on_stays_in_its_row(write, after):
    """``... 0node1:...`` took ``0node1`` for the host: the #wrong (or busbw) value was lost, the
    row never completed and the file was refused. Glued after the root (-1) it already worked."""
    text = standard_log(_glued(after))
    log = read_log(write(text))
    assert [r.size_bytes for r in log.rows] == [1024, 2048, 4096] and log.anomalies == ()
    row = log.rows[1]
    assert (row.oop_busbw_gbps, row.oop_wrong, row.ip_time_us, row.ip_wrong) == (0.15, 0, 20.48, 0)
    (section,) = Scanner("log.txt").scan(text)
    assert ("node1", "1001", "0") in section.info_hosts


def test_a_host_starting_with_a_digit_keeps_it_where_no_row_needs_it(write):
    """Only a row that still lacks values takes a glued number back: after a complete row, and on
    a line of its own, ``7node`` is the host's name."""
    rows = [ROWS[0] + " 7node:77:1 [0] NCCL INFO x", "7node:77:2 [1] NCCL INFO y", *ROWS[1:]]
    (section,) = Scanner("log.txt").scan(standard_log(rows))
    assert {("7node", "77", "0"), ("7node", "77", "1")} <= section.info_hosts
    assert len(section.rows) == 3


def test_an_incomplete_row_not_at_the_end_is_not_called_the_files_end(write):
    """The error said "file ends inside it" for a row that nothing after it completed; and a
    whole row after a row cut past its text columns was taken for noise, and dropped. Since
    issue 26 such a row is left out with a note saying where and why, and the rows that did
    complete are read; a log with no complete row is an error naming the row, as before."""
    for cut in (60, 66):  # in the out-of-place time; after it
        text = standard_log([ROWS[0], ROWS[1][:cut] + INFO, *ROWS[2:]])  # ROWS[2]: a row of its own
        log = read_log(write(text))
        assert [r.size_bytes for r in log.rows] == [1024, 4096] and log.incomplete_rows == (15,)
        assert "line 15 left out: line 16 is a whole row of its own ('2048 " in log.notes[0]
    start = f"# Collective test starting: all_reduce_perf\n{DEVICES}#\n{HEADER}"
    for first in ([], [ROWS[0]]):  # no complete row: an error; one: it is read
        text = start + "\n".join([*first, ROWS[1][:60] + INFO])
        cases = {
            "incomplete.txt": (
                text + "\njob epilogue: done\n",
                "result row incomplete: no numbers",
            ),
            "summary.txt": (text + "\n" + FOOTER, "result row is cut short \\(its table ends"),
            "ends.txt": (text + "\n\n", "result row is cut short \\(file ends"),
            # a killed run: the row, an INFO line, more of the row, an INFO line, then the end
            "killed.txt": (
                text
                + f"\nnodeA:11:98 [0] NCCL INFO z\n{ROWS[1][60:70]}\nnodeA:11:97 [0] NCCL INFO w\n",
                "result row is cut short \\(file ends",
            ),
        }
        line = 13 + len(first)
        for name, (body, message) in cases.items():
            if not first:
                with pytest.raises(CalibrationError, match=rf"line {line}': {message}"):
                    read_log(write(body, name))
                continue
            log = read_log(write(body, name))
            assert [r.size_bytes for r in log.rows] == [1024] and log.incomplete_rows == (line,)


# --- the nccl-tests runner ---------------------------------------------------------------------


def _fake(folder: Path, name: str, body: str) -> Path:
    """An nccl-tests stand-in: a shell script (see tests/calibration/test_runners.py)."""
    folder.mkdir(exist_ok=True)
    script = folder / f"{name}_perf"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _run(bins: Path, out: Path, *more: str):
    args = ["calibrate", "run", "--nprocs", "8", "-c", "all_reduce", "-e", "8G",
            "--binary-dir", str(bins), "--out", str(out), *more]  # fmt: skip
    return CliRunner().invoke(cli, args)


@pytest.mark.parametrize(
    ("body", "why"),
    [  # the real log replayed up to its 10th row, then exit 0; or whole but for its summary
        (f"awk '/^ *[0-9]+ +[0-9]+ /{{n++}} {{print}} n==10{{exit}}' {SAMPLE}\n",
         "its rows stop at 4096 B of the 8589934592 B asked for and it has no 'Avg bus"),
        (f"grep -v 'Avg bus bandwidth' {SAMPLE}\n", "it has no 'Avg bus bandwidth' line"),
        # a row lost in mid-table: the reader leaves it out (issue 26), the run lacks it
        (f"awk '/^ *[0-9]+ +[0-9]+ /{{n++}} n==10&&!d{{print substr($0,1,40);d=1;next}} "
         f"{{print}}' {SAMPLE}\n", "its result row(s) at line(s) "),
    ],
)  # fmt: skip
def test_a_table_cut_short_is_not_recorded_as_done(tmp_path, body, why):
    """The binary exited 0 with a partial table: it was recorded, and a rerun skipped it."""
    bins, out = _fake(tmp_path / "bin", "all_reduce", body), tmp_path / "res"
    result = _run(bins, out)
    assert result.exit_code == 2
    aside = out / "run" / "all_reduce.interrupted-1.txt"
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"collsim: error: {aside}: field 'rows': all_reduce exited 0 but {why}")
    assert "cut short, not recorded (a rerun measures all_reduce again)" in result.output
    assert aside.exists() and not (out / "logs" / "all_reduce.txt").exists()
    again = _run(_fake(bins, "all_reduce", f"cat {SAMPLE}\n"), out)  # fixed: a whole table
    assert again.exit_code == 0, again.output
    assert "done in an earlier run" not in again.output
    assert (out / "logs" / "all_reduce.txt").exists()


def test_a_run_nccl_tests_shortened_for_memory_is_whole(tmp_path):
    """nccl-tests lowers -e to what the GPUs hold ("Reducing maxBytes to N due to memory
    limitation") and exits 0 after its last size up to N: a whole run, recorded (it was refused
    as cut short on every rerun). This bundled log asked for 16 GiB and stopped at 8 GiB."""
    from collsim.calibration.dataset import DATA_DIR

    shortened = DATA_DIR / "logs" / "a100pcie-extgpu-2gpu-all_reduce-1.txt"
    assert "Reducing maxBytes to 12703629312" in shortened.read_text()
    bins, out = _fake(tmp_path / "bin", "all_reduce", f"cat {shortened}\n"), tmp_path / "res"
    result = _run(bins, out, "--nprocs", "2", "-e", "16G")
    assert result.exit_code == 0, result.output
    assert (out / "logs" / "all_reduce.txt").exists()
    cut = _fake(bins, "all_reduce", f"awk '/^ *[0-9]+ +[0-9]+ /{{n++}} {{print}} n==10{{exit}}' "
                                    f"{shortened}\n")  # fmt: skip
    result = _run(cut, tmp_path / "res2", "--nprocs", "2", "-e", "16G")
    assert result.exit_code == 2 and "of the 8589934592 B asked for" in result.output


def test_a_crash_names_its_signal(tmp_path):
    """A binary killed by SIGSEGV was reported as "exit status -11"."""
    from collsim.calibration.runners import failure_reason

    assert failure_reason("", -11) == "killed by signal SIGSEGV (11)"
    assert failure_reason("", 3) == "exit status 3"
    bins = _fake(tmp_path / "bin", "all_reduce", "echo '# nThread 1'\nkill -SEGV $$\n")
    result = _run(bins, tmp_path / "res")
    assert result.exit_code == 2 and "all_reduce failed: killed by signal SIGSEGV" in result.output


def test_a_log_on_one_rank_says_rank(tmp_path):
    one = DEVICES.split("#  Rank  1")[0]  # the device lines of rank 0 alone
    log = tmp_path / "one.txt"
    log.write_text(f"# Collective test starting: all_reduce_perf\n{one}#\n{HEADER}{ROWS[0]}\n")
    bins = _fake(tmp_path / "bin", "all_reduce", f"cat {log}\n")
    result = _run(bins, tmp_path / "res", "--nprocs", "2", "-e", "1K")
    assert (
        result.exit_code == 2 and "all_reduce ran on 1 rank, not the 2 asked for" in result.output
    )


def test_the_hang_message_says_what_a_rerun_does(tmp_path):
    """It said "rerun to resume", but a rerun measures an nccl-tests collective from scratch
    (its output is moved aside); the torch benchmark does resume after its recorded points."""
    from collsim.calibration._process import execute
    from collsim.calibration.runners import Step

    bins = _fake(tmp_path / "bin", "all_reduce", "echo '# nThread 1 nGpus 8'\nexec sleep 30\n")
    result = _run(bins, tmp_path / "res", "--timeout", "0.5")
    assert result.exit_code == 2 and "rerun to resume" not in result.output
    assert "a rerun moves it aside (all_reduce.interrupted-<k>.txt) and measures all_reduce " in (
        result.output
    )
    code = "import time; print('x', flush=True); time.sleep(30)"
    with pytest.raises(CalibrationError, match="the points it completed are kept, and a rerun re"):
        execute(Step([sys.executable, "-c", code], None), tmp_path, "t", 0.5, lambda _: None)


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "9.3e9"])
def test_an_endless_timeout_is_refused_in_one_line(tmp_path, value):
    """``--timeout inf`` overflowed in the silence timer ("timestamp out of range")."""
    from collsim.calibration.runners import MAX_TIMEOUT

    for runner in ("nccl-tests", "torch"):
        args = ["calibrate", "run", "--runner", runner, "--timeout", value, "--dry-run",
                "--out", str(tmp_path / "r")]  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
        assert "field '--timeout': must be" in result.output
    ok = CliRunner().invoke(cli, ["calibrate", "run", "--timeout", f"{MAX_TIMEOUT:.0f}",
                                  "--dry-run", "--out", str(tmp_path / "r")])  # fmt: skip
    assert ok.exit_code == 0, ok.output


def test_settle_brings_a_torch_runs_lagging_log_up_to_date(tmp_path):
    """``_settle`` was decorated as a context manager without a yield (so it never ran); a run
    killed between keeping a point and re-rendering its log leaves the log a row behind, which
    the runner now brings up to date when it ends."""
    from collsim.calibration.runners import RunConfig, _settle
    from tests.calibration.test_store import _filled, _row

    store = _filled(tmp_path, sizes=(1024, 2048))
    log = tmp_path / "logs" / "all_reduce.txt"
    lagging = log.read_text()
    store.record_point("all_reduce", _row(4096))
    log.write_text(lagging)  # as if killed before the render
    assert _settle(RunConfig("nccl-tests", "local", 4, 1, ["all_reduce"], out=tmp_path)) is None
    assert len(read_log(log, ranks=4).rows) == 2  # only a torch run's points are kept apart
    _settle(RunConfig("torch", "local", 4, 1, ["all_reduce"], out=tmp_path))
    assert [r.size_bytes for r in read_log(log, ranks=4).rows] == [1024, 2048, 4096]
