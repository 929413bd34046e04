"""The nccl-tests reader on synthetic logs: every format quirk, every kind of bad input."""

from __future__ import annotations

import json
import re

import pytest

from collsim.calibration import read_log, read_logs
from collsim.calibration.writer import format_rows, row_from_times
from collsim.errors import CalibrationError
from tests.calibration.conftest import DEVICES, FOOTER, HEADER, ROWS, standard_log


def test_standard_log(write):
    log = read_log(write(standard_log()))
    assert (log.collective, log.ranks, log.nodes, log.gpus_per_node) == ("all_reduce", 4, 2, 2)
    assert log.gpu == "NVIDIA H100 80GB HBM3"
    assert log.nccl_version == "2.21.5+cuda12.4"
    assert (log.dtype, log.redop, log.layout) == ("float", "sum", "current")
    assert [r.size_bytes for r in log.rows] == [1024, 2048, 4096]
    row = log.rows[0]
    assert (row.count, row.root, row.oop_time_us, row.oop_algbw_gbps, row.oop_busbw_gbps) == (
        256,
        -1,
        20.48,
        0.05,
        0.08,
    )
    assert (row.ip_time_us, row.ip_wrong, row.line) == (20.48, 0, row.line)
    assert log.avg_busbw == pytest.approx(0.126667)
    assert log.anomalies == () and log.notes == ()
    assert log.gpus_per_thread == 1


def test_a_table_cut_short_says_so(write):
    """The header asks for sizes up to maxBytes; rows that stop a step or more below it are a
    run cut short (a killed job), noted, while nccl-tests' rounding to whole elements is not."""
    assert read_log(write(standard_log())).notes == ()
    cut = read_log(write(standard_log(ROWS[:2]), "cut.txt"))
    assert any("rows stop at 2048 B" in n and "4096" in n for n in cut.notes)
    by_bytes = standard_log().replace("step: 2(factor)", "step: 1000(bytes)")
    assert read_log(write(by_bytes, "bytes.txt")).notes == ()  # 4096 + 1000 > maxBytes


def test_gpus_one_thread_drives_come_from_the_header(write):
    four = standard_log().replace("nThread 1 nGpus 1", "nThread 1 nGpus 4")
    assert read_log(write(four)).gpus_per_thread == 4
    # A log without the parameter line says nothing: one GPU per thread, as launchers run.
    bare = "\n".join(line for line in standard_log().splitlines() if "nThread" not in line)
    assert read_log(write(bare, "bare.txt")).gpus_per_thread == 1
    # ... unless the caller knows, or the command line says (-g of nccl-tests).
    assert read_log(write(bare, "bare.txt"), gpus_per_thread=2).gpus_per_thread == 2
    cmd = "$ ./build/all_reduce_perf -b 1K -e 4K -g 2\n"
    command = bare.replace("# Collective", cmd + "# Collective")
    assert read_log(write(command, "cmd.txt")).gpus_per_thread == 2
    assert read_log(write(four, "four.txt"), gpus_per_thread=2).gpus_per_thread == 4  # log wins


def test_launcher_prefixes_openmpi_and_srun(write):
    text = standard_log()
    tagged = "\n".join(f"[1,0]<stdout>:{line}" for line in text.splitlines())
    labelled = "\n".join(f"  0: {line}" for line in text.splitlines())
    for variant in (tagged, labelled):
        log = read_log(write(variant))
        assert len(log.rows) == 3 and log.ranks == 4 and log.anomalies == ()


def test_prefix_in_mid_line_splits_the_line(write):
    # another rank's tagged INFO output lands in the middle of rank 0's row
    rows = [
        ROWS[0],
        ROWS[1][:52] + "[1,1]<stdout>:node2:2002:2010 [1] NCCL INFO Connected all rings",
        "[1,0]<stdout>:" + ROWS[1][52:],
        ROWS[2],
    ]
    log = read_log(write(standard_log(rows)))
    assert [r.size_bytes for r in log.rows] == [1024, 2048, 4096]
    assert log.rows[1].ip_busbw_gbps == 0.15


def test_info_lines_between_and_inside_rows(write):
    info = "node1:1001:1050 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"
    rows = [
        ROWS[0],
        info,
        ROWS[1][:52] + info,
        info.replace("Channel", "Ring"),
        ROWS[1][52:],
        ROWS[2],
        "node2:2001:2001 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0",
    ]
    log = read_log(write(standard_log(rows)))
    assert [r.size_bytes for r in log.rows] == [1024, 2048, 4096]
    assert log.rows[1].oop_time_us == 20.48 and log.rows[1].ip_busbw_gbps == 0.15
    assert log.nccl_env == {"NCCL_IB_HCA": "mlx5_0"}
    assert any("split by NCCL INFO" in n for n in log.notes)


def test_stripped_hash_markers(write):
    text = "\n".join(line.lstrip("#") for line in standard_log().splitlines())
    log = read_log(write(text))
    assert (log.ranks, log.nodes, len(log.rows)) == (4, 2, 3)


def test_legacy_layout_without_root_and_error_column(write):
    text = (
        "# nThread 1 nGpus 4 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 "
        "validation: 1\n#\n# Using devices\n"
        + "".join(
            f"#   Rank  {r} Pid 4242 on localhost device  {r} [0x00] Tesla V100-SXM2-32GB\n"
            for r in range(4)
        )
        + "#       size         count    type   redop     time   algbw   busbw  error     time"
        "   algbw   busbw  error\n"
        "        1024           256   float     sum    20.48    0.05    0.08  5e-07    20.48    "
        "0.05    0.08  5e-07\n"
        "        2048           512   float     sum    20.48    0.10    0.15  2e-03    20.48    "
        "0.10    0.15  1e-07\n" + FOOTER
    )
    log = read_log(write(text), collective="all_reduce")
    assert (log.layout, log.ranks, log.nodes, log.rows[0].root) == ("legacy", 4, 1, None)
    assert log.rows[0].oop_wrong == 5e-07  # a maximum deviation, below float's 1e-5: fine
    assert len(log.anomalies) == 1 and "max error = 0.002" in log.anomalies[0]


def test_legacy_blank_redop_column(write):
    # legacy alltoall: the header has 'redop', the rows leave it blank
    text = (
        "#       size         count    type   redop     time   algbw   busbw  error     time   "
        "algbw   busbw  error\n"
        "        1024           128   float             10.24    0.10    0.05    N/A    10.24    "
        "0.10    0.05    N/A\n"
    )
    log = read_log(write(text, "x-alltoall.txt"), ranks=2)
    assert (log.collective, log.redop, log.rows[0].oop_wrong) == ("alltoall", None, None)
    assert any("file name" in n for n in log.notes)


def test_json_output(write):
    doc = {
        "version": 2,
        "args": ["./build/all_gather_perf", "-b", "1K"],
        "env": ["NCCL_ALGO=Ring"],
        "nccl_version": 22602,
        "config": {
            "nthreads": 1,
            "ngpus": 2,
            "devices": [
                {"rank": 0, "hostname": "a", "device": 0, "device_info": "NVIDIA A100-SXM4-80GB"},
                {"rank": 2, "hostname": "b", "device": 0, "device_info": "NVIDIA A100-SXM4-80GB"},
            ],
        },
        "results": [
            {
                "size": 4096,
                "count": 256,
                "type": "float",
                "redop": "none",
                "root": "    -1",
                "out_of_place": {"time": 40.96, "alg_bw": 0.1, "bus_bw": 0.075, "nwrong": 0.0},
                "in_place": None,
            },
        ],
        "average_bus_bandwidth": {"bandwidth": 0.075, "okay": "unchecked"},
    }
    log = read_log(write(json.dumps(doc), "run.json"))
    assert (log.collective, log.ranks, log.nodes, log.layout) == ("all_gather", 4, 2, "json")
    assert (log.nccl_version, log.nccl_env) == ("2.26.2", {"NCCL_ALGO": "Ring"})
    assert log.rows[0].ip_time_us is None and not log.rows[0].has_in_place
    assert log.anomalies == () and log.gpus_per_thread == 2
    # A killed run leaves the file cut short: what it completed is kept, and the cut is said.
    second = dict(doc["results"][0], size=8192, count=512)
    second["out_of_place"] = {"time": 81.92, "alg_bw": 0.1, "bus_bw": 0.075, "nwrong": 0.0}
    text = json.dumps({**doc, "results": [doc["results"][0], second]}, indent=1)
    cut = read_log(write(text[: text.index('"average_bus')], "cut1.json"))
    assert [r.size_bytes for r in cut.rows] == [4096, 8192] and cut.ranks == 4
    assert any("the JSON stops at line" in n and "2 complete result(s)" in n for n in cut.notes)
    cut = read_log(write(text[: text.index('"size": 8192') + 30], "cut2.json"))
    assert [r.size_bytes for r in cut.rows] == [4096]
    assert any("1 complete result(s)" in n for n in cut.notes)
    with pytest.raises(CalibrationError, match=r"run2.json: field 'line \d+': malformed or trunc"):
        read_log(write(text[: text.index('"size": 4096') + 5], "run2.json"))
    # nccl-tests writes booleans as strings: a failed out-of-bounds check is "false", not OK
    doc["out_of_bounds"] = {"count": 5, "okay": "false"}
    assert any("(FAILED)" in a for a in read_log(write(json.dumps(doc), "oob.json")).anomalies)
    # a 'nan' in a result is an error naming it (it used to be read, and fitted)
    doc["results"][0]["out_of_place"]["time"] = "nan"
    with pytest.raises(CalibrationError, match=r"field 'results\[0\]\.time': not a number"):
        read_log(write(json.dumps(doc), "nan.json"))


def test_wrong_results_are_anomalies_and_strict_raises(write):
    rows = [ROWS[0], ROWS[1].replace("0.15      0    20.48", "0.15     17    20.48"), ROWS[2]]
    path = write(standard_log(rows))
    log = read_log(path)
    assert len(log.anomalies) == 1 and "#wrong = 17" in log.anomalies[0]
    with pytest.raises(CalibrationError, match="#wrong = 17"):
        read_log(path, strict=True)


def test_non_positive_times_are_anomalies(write):
    """A negative or zero time (a corrupted row) used to pass --strict and was silently left
    out of fits and validation."""
    rows = [ROWS[0].replace("-1    20.48", "-1   -20.48"), ROWS[1],
            ROWS[2].replace("-1    40.96", "-1     0.00")]  # fmt: skip
    anomalies = read_log(write(standard_log(rows))).anomalies
    assert any("size 1024 out-of-place: time -20.48 us" in a for a in anomalies)
    assert any("size 4096 out-of-place: time 0 us" in a for a in anomalies)


def test_a_repeated_size_is_noted(write):
    """A row repeated (two tables pasted together) counts twice in a fit: said, though not an
    anomaly (an alltoall stepped with -i can round two sizes to one count)."""
    log = read_log(write(standard_log([ROWS[0], ROWS[1], ROWS[1], ROWS[2]])))
    assert not log.anomalies and "sizes measured more than once: 2048" in log.notes


def test_inconsistent_numbers_are_anomalies(write):
    rows = [
        ROWS[0].replace("20.48    0.05    0.08", "20.48    0.09    0.14"),  # algbw != size/time
        ROWS[1].replace("0.10    0.15      0    20.48", "0.10    0.19      0    20.48"),
        ROWS[2].replace("4096          1024", "4096          1000"),
    ]
    anomalies = read_log(write(standard_log(rows))).anomalies
    assert any("algbw 0.09" in a for a in anomalies)
    assert any("busbw 0.19 is not algbw 0.1 x 1.5" in a for a in anomalies)
    assert any("count 1000" in a for a in anomalies)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("   \n\n", "empty file"),
        ("job started\nsome output\nNCCL version 2.18.1\n", "no nccl-tests result table"),
        (HEADER + FOOTER, "no nccl-tests result table"),
        # not one complete row: the cut row is the error (a log with one is read, see below)
        (
            standard_log()[: standard_log().index(ROWS[0]) + 40],
            r"line 14': result row is cut short \(file ends inside it\)",
        ),
        (
            standard_log([ROWS[0][:50]]),
            r"line 14': result row is cut short \(its table ends before it does\) \(value: '1024",
        ),
    ],
)
def test_bad_input_is_one_clear_error(write, text, message):
    path = write(text)
    with pytest.raises(CalibrationError, match=message) as info:
        read_log(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_a_log_cut_mid_row_keeps_the_rows_it_completed(write):
    """A run killed mid-row was refused whole ("result row is cut short"): its complete rows are
    read and a note says at which line the log stops and what was there (README: "from a run cut
    short, the rows it completed, with a note")."""
    cut = read_log(write(standard_log()[: standard_log().index(ROWS[2]) + 40]))
    assert [r.size_bytes for r in cut.rows] == [1024, 2048] and cut.anomalies == ()
    assert cut.incomplete_rows == (16,)
    (note,) = cut.incomplete_notes
    assert note.startswith("result row at line 16 left out: the file ends inside it ('4096")
    assert note.endswith("2 complete row(s) read")
    assert "no 'Avg bus bandwidth' line" in " ".join(cut.notes)  # and that is said too
    # A line lost in the middle of a table (cut, and the next row follows): the others are read.
    gap = read_log(write(standard_log([ROWS[0], ROWS[1][:50], ROWS[2]]), "gap.txt"))
    assert [r.size_bytes for r in gap.rows] == [1024, 4096] and gap.incomplete_rows == (15,)
    assert "line 15 left out: line 16 is a whole row of its own ('2048" in gap.notes[0]
    # A row cut before the summary: the table ends before the row does; the summary is read.
    early = read_log(write(standard_log([ROWS[0], ROWS[1][:70]]), "early.txt"))
    assert [r.size_bytes for r in early.rows] == [1024] and early.avg_busbw == 0.126667
    assert "line 15 left out: its table ends before it does" in early.notes[0]


def test_an_elided_device_list_counts_ranks_to_the_highest_listed(write):
    """A device list shortened by hand ("Rank 0 ... Rank 3") counted only the ranks listed: 2 of
    4 here, and every busbw became an anomaly. The highest rank listed counts them where the rows
    cannot pin the count (these small bandwidths allow 4 or 5 ranks), the hosts it shows are not
    all the nodes (unknown unless given), and a cut row at the end is left out as in any other."""
    lines = [line for line in standard_log().splitlines() if not re.search(r"Rank  [12] ", line)]
    text = "\n".join(lines).replace("#  Rank  3", "#  ...\n#  Rank  3")
    log = read_log(write(text))
    assert (log.ranks, log.nodes, log.anomalies) == (4, None, ())
    assert log.notes[:2] == (
        "the device list is elided (2 rank(s) shown, the highest 3); ranks (4) from the highest "
        "listed rank, which the rows' busbw/algbw ratio allows (4 to 5)",
        "nodes not known: the device list is incomplete (2 host(s) shown); pass --nodes",
    )
    assert read_log(write(text, "hint.txt"), nodes=2).nodes == 2
    cut = read_log(write(text[: text.index(ROWS[2]) + 30], "cut.txt"))
    assert (cut.ranks, len(cut.rows), cut.anomalies, cut.incomplete_rows) == (4, 2, (), (15,))


def test_a_cut_row_before_the_next_table_does_not_swallow_its_header(write):
    """Two tests in one file, the first killed mid-row: the second table's header used to be
    taken for noise inside the cut row; now the cut row is left out and both tables are read."""
    first = standard_log([ROWS[0], ROWS[1][:50]]).split("# Out of bounds")[0]
    second = standard_log(start="broadcast_perf")
    logs = read_logs(write(first + second))
    assert [[r.size_bytes for r in log.rows] for log in logs] == [[1024], [1024, 2048, 4096]]
    assert [log.collective for log in logs] == ["all_reduce", "broadcast"]
    assert logs[0].incomplete_rows == (15,) and logs[1].incomplete_rows == ()


def test_unknown_collective_and_conflicting_hint(write):
    with pytest.raises(CalibrationError, match="cannot tell which collective"):
        read_log(write(HEADER + ROWS[0] + "\n", "mystery.txt"), ranks=4)
    with pytest.raises(CalibrationError, match="not supported by collsim"):
        read_log(write(standard_log(start="hypercube_perf")))
    with pytest.raises(CalibrationError, match="is of all_reduce, not all_gather"):
        read_log(write(standard_log()), collective="all_gather")


def test_several_tables_in_one_file(write):
    path = write(standard_log() + standard_log(start="all_reduce_perf_mpi"))
    assert len(read_logs(path)) == 2
    with pytest.raises(CalibrationError, match="2 result tables"):
        read_log(path)


def test_ranks_inferred_when_the_log_does_not_say(write):
    log = read_log(write(HEADER + "\n".join(ROWS) + "\n", "x-all_reduce.txt"))
    assert (log.ranks, log.nodes) == (4, None)  # 2(n-1)/n = 1.5 -> 4 ranks
    assert any("busbw/algbw" in n for n in log.notes)
    given = read_log(write(HEADER + "\n".join(ROWS) + "\n", "y-all_reduce.txt"), ranks=4, nodes=2)
    assert (given.ranks, given.nodes, given.ranks_source) == (4, 2, "given")


def test_writer_round_trip(write):
    rows = [
        row_from_times(
            "reduce_scatter",
            8,
            s,
            "bfloat16",
            oop_time_s=1e-5 + s / 4e10,
            ip_time_s=2e-5 + s / 5e10,
            oop_wrong=0,
            ip_wrong=0,
        )
        for s in (64, 4096, 1 << 20, 1 << 30, 1 << 34)
    ]
    text = format_rows(rows, preamble=["# Collective test starting: reduce_scatter_perf"])
    log = read_log(write(text), ranks=8)
    assert log.anomalies == ()
    for got, want in zip(log.rows, rows, strict=True):
        assert (got.size_bytes, got.count, got.dtype) == (want.size_bytes, want.count, "bfloat16")
        assert got.oop_time_us == pytest.approx(want.oop_time_us, rel=1e-3)
        assert got.ip_busbw_gbps == pytest.approx(want.ip_busbw_gbps, rel=1e-2, abs=0.006)
    assert log.avg_busbw == pytest.approx(
        sum(r.oop_busbw_gbps + r.ip_busbw_gbps for r in rows) / 10, rel=1e-4
    )


def test_devices_block_fixture_is_consistent():
    assert DEVICES.count("Rank") == 4


def test_cli_read_prints_what_was_parsed(write):
    from click.testing import CliRunner

    from collsim.cli import cli

    rows = [ROWS[0], ROWS[1].replace("0.15      0    20.48", "0.15      2    20.48"), ROWS[2]]
    path = write(standard_log(rows))
    result = CliRunner().invoke(cli, ["calibrate", "read", str(path)])
    assert result.exit_code == 0
    assert f"# {path}: all_reduce on 4 ranks (2 nodes), GPU NVIDIA H100 80GB HBM3" in result.output
    assert "# ANOMALY: line 15, size 2048 out-of-place: #wrong = 2" in result.output
    assert "# 3 rows, 1 anomaly" in result.output
    strict = CliRunner().invoke(cli, ["calibrate", "read", "--strict", str(path)])
    assert strict.exit_code == 2 and len(strict.output.strip().splitlines()) == 1
    empty = CliRunner().invoke(cli, ["calibrate", "read", str(write("", "empty.txt"))])
    assert empty.exit_code == 2
    assert empty.output.strip() == f"collsim: error: {path.parent / 'empty.txt'}: empty file: " + (
        "no nccl-tests output in it"
    )
