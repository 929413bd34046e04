"""The torch runner for real: gloo on loopback, 2 and 4 processes, run -> read, resume, kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from collsim.calibration import read_log
from collsim.calibration.store import ResultStore
from collsim.cli import cli
from collsim.metrics import COLLECTIVES, bus_factor

pytest.importorskip(
    "torch",
    reason="torch is not installed: `make test` installs it only where pip resolves a CPU build "
    "(scripts/install_torch.py says why it did not)",
)

SIZES = ["-b", "1K", "-e", "64K", "-f", "8"]  # 1K, 8K, 64K
FAST = ["-w", "1", "-n", "3", "--backend", "gloo", "--timeout", "60"]


def _run(out: Path, nprocs: int, collectives: str = "all") -> str:
    args = [
        "calibrate",
        "run",
        "--runner",
        "torch",
        "--nprocs",
        str(nprocs),
        "-c",
        collectives,
        *SIZES,
        *FAST,
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("nprocs", [2, 4])
def test_gloo_end_to_end(tmp_path, nprocs):
    out = tmp_path / "res"
    _run(out, nprocs)
    for collective in COLLECTIVES:
        log = read_log(out / "logs" / f"{collective}.txt")
        assert (log.collective, log.ranks, log.nodes) == (collective, nprocs, 1)
        assert "gloo" in (log.gpu or "") and log.anomalies == ()
        assert [r.size_bytes for r in log.rows] == [1024, 8192, 65536]
        factor = bus_factor(collective, nprocs)
        for row in log.rows:
            assert row.time_us is not None and row.time_us > 0
            assert row.busbw_gbps is not None
            placed = (row.oop_wrong, row.ip_wrong)
            assert all(w in (0, None) for w in placed) and any(w == 0 for w in placed)
            alg = row.oop_algbw_gbps if row.oop_time_us is not None else row.ip_algbw_gbps
            assert row.busbw_gbps == pytest.approx(alg * factor, abs=0.011)
        has_oop = collective in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")
        has_ip = collective not in ("alltoall", "sendrecv")
        assert all((r.oop_time_us is not None) == has_oop for r in log.rows)
        assert all(r.has_in_place == has_ip for r in log.rows)
    env = json.loads((out / "env.json").read_text())
    assert env["torch"] == metadata.version("torch") and "127.0.0.1" in env["commands"][0]


def test_resume_measures_only_what_is_missing_or_damaged(tmp_path):
    out = tmp_path / "res"
    _run(out, 2, "all_reduce,alltoall")
    point = out / "points" / "alltoall" / "8192.json"
    point.write_text(point.read_text()[:30])  # damaged, as by a crash mid-write elsewhere
    before = {p: p.stat().st_mtime_ns for p in (out / "points").rglob("*.json") if p != point}
    output = _run(out, 2, "all_reduce,alltoall")
    assert "8192.json: truncated or changed" in output
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before  # nothing completed was measured again
    assert ResultStore(out, {}).problems() == []
    assert len(read_log(out / "logs" / "alltoall.txt").rows) == 3


def test_sigterm_stops_the_run_and_keeps_what_completed(tmp_path):
    out = tmp_path / "res"
    argv = [
        sys.executable,
        "-c",
        "from collsim.cli import main; main()",
        "calibrate",
        "run",
        "--runner",
        "torch",
        "--nprocs",
        "2",
        "-c",
        "all_reduce",
        "-b",
        "1K",
        "-e",
        "1G",
        "-f",
        "2",
        *FAST,
        "--out",
        str(out),
    ]  # sizes up to 1 GiB: still running when stopped
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    manifest = out / "manifest.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if manifest.exists() and len(json.loads(manifest.read_text())["points"]) >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "stopped (143): completed points are kept" in err and "to resume" in err
    launch = (out / "run" / "torchbench.partial").read_text()
    pids = {
        int(line.split("Pid")[1].split()[0])
        for line in launch.splitlines()
        if line.startswith("#  Rank")
    }
    time.sleep(0.5)
    for pid in pids:  # the benchmark processes went down with the run
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    kept = ResultStore(out, {}).rows("all_reduce")
    assert len(kept) >= 3 and all(r.size_bytes < 1 << 30 for r in kept)
    assert len(read_log(out / "logs" / "all_reduce.txt").rows) == len(kept)


def test_watchdog_names_the_hung_collective():
    code = (
        "from collsim.calibration.torchbench import Watchdog\nimport time\n"
        "w = Watchdog(rank=3)\nw.arm('all_gather of 1048576 B', 0.3)\ntime.sleep(10)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    assert (
        "collsim torchbench: rank 3: all_gather of 1048576 B did not complete within 0.3 s"
        in done.stderr
    )


def test_nccl_backend_without_gpus_is_refused_up_front(tmp_path):
    """Each rank used to die inside torchbench with an AttributeError the user never saw."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA GPUs")
    result = CliRunner().invoke(cli, ["calibrate", "run", "--runner", "torch", "--backend",
                                      "nccl", "--nprocs", "2", "-c", "all_reduce", "-e", "1K",
                                      "--out", str(tmp_path / "r")])  # fmt: skip
    assert result.exit_code == 2 and "needs CUDA GPUs" in result.output


def _bench(dtype: str, n: int):
    """A Bench for ``n`` ranks without a process group: its expected values and comparison."""
    import torch

    from collsim.calibration.torchbench import TORCH_DTYPES, Bench

    bench = object.__new__(Bench)
    bench.torch, bench.device, bench.n = torch, torch.device("cpu"), n
    bench.dtype = getattr(torch, TORCH_DTYPES[dtype])
    return bench


def test_checks_wrap_integers_and_stay_exact_in_short_floats():
    """int8 on 16 ranks: the sum 136 wraps to -120 as the collective's own sum does (building
    the expected value raised an overflow, reported as a hung collective). bfloat16 holds the
    integers to 256 exactly: up to 22 ranks (1 + ... + 22 = 253) each adds r + 1, beyond that
    each adds 1, so the sum stays exact and one missing rank is caught (the sum of 1..24 rounded
    at its additions: 336 elements of a 24-rank run were counted wrong and the fit refused it)."""
    small = _bench("int8", 16)
    want = small.expect(4, 16 * 17 // 2)
    assert want.tolist() == [-120] * 4
    assert small.mismatches(want.clone(), want, 16) == 0
    assert small.mismatches(want + 1, want, 16) == 4
    for n, addends in ((22, list(range(1, 23))), (24, [1] * 24)):
        bench = _bench("bfloat16", n)
        assert [bench.addend(r) for r in range(n)] == addends
        want = bench.expect(1, sum(addends))
        assert bench.mismatches(want.clone(), want, n) == 0
        assert bench.mismatches(bench.expect(1, sum(addends) - addends[0]), want, n) == 1


def test_a_backend_error_is_not_called_a_hang():
    code = (
        "from collsim.calibration.torchbench import hung\n"
        "hung(0, 'all_reduce of 64 B', 300, 'value cannot be converted to type int8_t')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "all_reduce of 64 B failed: value cannot be converted" in done.stderr
    assert "within" not in done.stderr
