"""``collsim calibrate run`` with nccl-tests: command lines, missing tools, a fake nccl-tests."""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from collsim.calibration.dataset import DATA_DIR
from collsim.cli import cli

SAMPLE = DATA_DIR / "logs" / "h100-snellius-ib-2n-all_reduce-1.txt"


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _fake_binaries(folder: Path, body: str, names=("all_reduce", "all_gather")) -> Path:
    """nccl-tests stand-ins: shell scripts that print a published log (or misbehave)."""
    folder.mkdir(exist_ok=True)
    for name in names:
        script = folder / f"{name}_perf"
        script.write_text("#!/bin/sh\n" + body.replace("NAME", name))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def test_dry_run_mpirun_and_srun_commands(tmp_path):
    result = _cli(
        "calibrate",
        "run",
        "--launcher",
        "mpirun",
        "--nprocs",
        "16",
        "--nodes",
        "2",
        "-c",
        "all_reduce,alltoall",
        "-b",
        "8",
        "-e",
        "8G",
        "--binary-dir",
        "/opt/nt",
        "--launcher-args",
        "--hostfile hosts -x NCCL_DEBUG=INFO",
        "--out",
        str(tmp_path / "r"),
        "--dry-run",
    )
    assert result.exit_code == 0
    dump = (tmp_path / "r" / "cluster" / "nccl-topo.xml").resolve()
    assert result.output.splitlines() == [
        # the first job writes NCCL's topology dump into the results (Open MPI passes it on)
        f"NCCL_TOPO_DUMP_FILE={dump} mpirun -x NCCL_TOPO_DUMP_FILE -np 16 -npernode 8 "
        "--hostfile hosts -x NCCL_DEBUG=INFO /opt/nt/all_reduce_perf "
        "-b 8 -e 8589934592 -f 2 -w 5 -n 20 -d float -g 1 -c 1",
        "mpirun -np 16 -npernode 8 --hostfile hosts -x NCCL_DEBUG=INFO /opt/nt/alltoall_perf "
        "-b 8 -e 8589934592 -f 2 -w 5 -n 20 -d float -g 1 -c 1",
    ]
    result = _cli(
        "calibrate",
        "run",
        "--launcher",
        "srun",
        "--nprocs",
        "8",
        "--nodes",
        "2",
        "-c",
        "all_gather",
        "-d",
        "half",
        "-w",
        "2",
        "-n",
        "50",
        "--out",
        str(tmp_path / "r"),
        "--dry-run",
    )
    assert result.output.strip() == (
        f"NCCL_TOPO_DUMP_FILE={dump} "
        "srun -N 2 -n 8 --ntasks-per-node 4 all_gather_perf -b 8 -e 134217728 -f 2 -w 2 -n 50 "
        "-d half "
        "-g 1 -c 1"
    )
    result = _cli(
        "calibrate", "run", "--nprocs", "4", "-c", "all", "--out", str(tmp_path / "r"), "--dry-run"
    )
    lines = result.output.splitlines()
    assert len(lines) == 7 and lines[0].startswith(f"NCCL_TOPO_DUMP_FILE={dump} all_reduce_perf")
    assert lines[1].startswith("all_gather_perf -b 8 -e 134217728")  # the first job only
    assert lines[0].endswith("-g 4 -c 1")  # local: one process drives all GPUs
    assert not (tmp_path / "r").exists()  # a dry run writes nothing


def test_dry_run_torch_uses_loopback_only(tmp_path, monkeypatch):
    result = _cli(
        "calibrate",
        "run",
        "--runner",
        "torch",
        "--nprocs",
        "4",
        "-c",
        "all_reduce",
        "--out",
        str(tmp_path / "r"),
        "--dry-run",
    )
    argv = shlex.split(result.output)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert "collsim.calibration.torchbench" in argv
    monkeypatch.setenv("MASTER_ADDR", "node0")  # several nodes: the rendezvous is not loopback
    result = _cli(
        "calibrate",
        "run",
        "--runner",
        "torch",
        "--launcher",
        "srun",
        "--nprocs",
        "8",
        "--nodes",
        "2",
        "--out",
        str(tmp_path / "r"),
        "--dry-run",
    )
    assert result.output.startswith("srun -N 2 -n 8 --ntasks-per-node 4 ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--binary-dir", "/nonexistent"], "nccl-tests binary all_reduce_perf not found in "),
        (["--launcher", "srun", "--nodes", "2", "--nprocs", "4"], "launcher 'srun' not found"),
        (["--launcher", "local", "--nodes", "2", "--nprocs", "4"], "runs on this machine only"),
        (["--nprocs", "3", "--nodes", "2", "--launcher", "mpirun"], "multiple of --nodes"),
        (["-c", "all_reduce,allgatherv"], "unknown collective"),
        (["--runner", "torch", "-d", "floaty"], "'--datatype'"),
        (["-d", "float61"], "unknown data type"),  # float16 is half: tests/test_names.py
        (["-n", "0"], "'--iters': must be >= 1"),
        (["--timeout", "-1"], "'--timeout': must be > 0"),
    ],
)
def test_missing_tools_and_bad_options_are_one_line_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun/mpirun/binaries anywhere
    result = CliRunner().invoke(cli, ["calibrate", "run", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_the_reason_of_a_failure_is_the_line_that_says_it():
    from collsim.calibration.runners import failure_reason

    traceback = "Traceback (most recent call last):\n  File x\nZeroDivisionError: division by zero"
    assert failure_reason(f"{traceback}\n{'=' * 60}\n", 1) == "ZeroDivisionError: division by zero"
    ours = "collsim torchbench: all_reduce 1024 B hung\nsome trailing words\n"
    assert failure_reason(ours, 1) == "collsim torchbench: all_reduce 1024 B hung"
    assert failure_reason("", 3) == "exit status 3"


def test_fake_nccl_tests_run_records_logs_and_resumes(tmp_path):
    bins = _fake_binaries(
        tmp_path / "bin",
        f"echo '# Collective test starting: NAME_perf'\ngrep -v 'Collective test' {SAMPLE}\n",
    )
    out = tmp_path / "res"
    args = [
        "calibrate",
        "run",
        "--nprocs",
        "8",
        "-c",
        "all_reduce",
        "--binary-dir",
        str(bins),
        "--out",
        str(out),
    ]
    result = _cli(*args)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and (out / "logs" / "all_reduce.txt").exists()
    read = _cli("calibrate", "read", str(out / "logs" / "all_reduce.txt"), "--json")
    parsed = json.loads(read.output)[0]
    assert (parsed["collective"], parsed["ranks"], len(parsed["rows"])) == ("all_reduce", 8, 31)
    env = json.loads((out / "env.json").read_text())
    assert env["runner"] == "nccl-tests" and "all_reduce_perf" in env["commands"][0]
    again = _cli(*args)  # rerun: nothing left to do
    assert "all_reduce: done in an earlier run, skipped" in again.output


def test_failing_or_hung_binary_is_a_clear_error(tmp_path):
    out = tmp_path / "res"
    bins = _fake_binaries(tmp_path / "bad", "echo 'NCCL failure common.cu:900' >&2\nexit 3\n")
    result = CliRunner().invoke(
        cli, ["calibrate", "run", "-c", "all_reduce", "--binary-dir", str(bins), "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "all_reduce failed: NCCL failure common.cu:900" in result.output
    bins = _fake_binaries(tmp_path / "hang", "echo '# nThread 1 nGpus 2'\nexec sleep 30\n")
    result = CliRunner().invoke(
        cli,
        [
            "calibrate",
            "run",
            "-c",
            "all_gather",
            "--binary-dir",
            str(bins),
            "--out",
            str(out),
            "--timeout",
            "1",
        ],
    )
    assert result.exit_code == 2
    assert "all_gather: no output for 1 s after '# nThread 1 nGpus 2'; a hung collective?" in (
        result.output
    )
    assert (out / "run" / "all_gather.partial").exists()  # what it printed is kept, not used
    assert not (out / "logs" / "all_gather.txt").exists()


def test_sigkill_mid_run_keeps_finished_collectives(tmp_path):
    """``calibrate run`` killed with SIGKILL while the second collective runs: the rerun skips the
    first (kept as it was), reports the output left by the killed one, and measures it again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "res"
    bins = _fake_binaries(tmp_path / "bin", f"cat {SAMPLE}\n", names=("all_reduce",))
    _fake_binaries(bins, "echo '# nThread 1 nGpus 8 minBytes 8'\nexec sleep 20\n", ("all_gather",))
    script = Path(sys.executable).parent / "collsim"
    collsim = [str(script)] if script.exists() else [sys.executable, "-m", "collsim.cli"]
    args = ["calibrate", "run", "--nprocs", "8", "-c", "all_reduce,all_gather",
            "--binary-dir", str(bins), "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        [*collsim, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if list((out / "run").glob("all_gather*")):  # all_reduce done, all_gather running
                break
            time.sleep(0.02)
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the hung stand-in runs in a session of its own; it ends by itself (sleep 20) unused
    assert proc.returncode == -signal.SIGKILL
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["points"]) == ["all_reduce"]
    kept = (out / "logs" / "all_reduce.txt").read_bytes()
    gather = SAMPLE.with_name(SAMPLE.name.replace("all_reduce", "all_gather"))
    _fake_binaries(bins, f"cat {gather}\n", names=("all_gather",))  # fixed: finishes now
    again = _cli(*args)
    assert again.exit_code == 0, again.output
    assert "all_gather.partial: output of a run that did not finish; not used" in again.output
    # ...and moves it aside rather than writing over what it holds (the header line here)
    aside = out / "run" / "all_gather.interrupted-1.txt"
    assert "kept as" in again.output and aside.read_text().startswith("# nThread 1 nGpus 8")
    assert "all_reduce: done in an earlier run, skipped" in again.output
    assert (out / "logs" / "all_reduce.txt").read_bytes() == kept
    assert (out / "logs" / "all_gather.txt").exists()
    done = json.loads((out / "manifest.json").read_text())["points"]
    assert set(done) == {"all_reduce", "all_gather"}
    assert done["all_reduce"] == manifest["points"]["all_reduce"]


def test_the_reason_survives_a_long_traceback_after_it(tmp_path):
    """torchrun prints a long traceback after a rank's own message; the message used to be cut
    off (only the last 2000 characters of stderr were kept), leaving 'ChildFailedError:'."""
    import sys

    from collsim.calibration._process import execute
    from collsim.calibration.runners import Step, failure_reason

    code = (
        "import sys\n"
        "print('collsim torchbench: rank 1: all_reduce of 33554432 B did not complete', "
        "file=sys.stderr)\n"
        "print('Traceback (most recent call last):\\n' + '  frame\\n' * 2000 + "
        "'ChildFailedError:', file=sys.stderr)\nsys.exit(1)\n"
    )
    status, _, err = execute(Step([sys.executable, "-c", code], None), tmp_path, "t", 30.0,
                             lambda _: None)  # fmt: skip
    assert status == 1
    assert failure_reason(err, status).startswith("collsim torchbench: rank 1: all_reduce")


def test_a_log_on_other_ranks_is_not_recorded(tmp_path):
    """The binary measured 8 ranks where 4 were asked for: not recorded under a 4-rank identity
    (it used to be), and -f must be whole for nccl-tests (which reads it with strtol)."""
    bins = _fake_binaries(tmp_path / "bin", f"cat {SAMPLE}\n", names=("all_reduce",))
    out = tmp_path / "res"
    result = CliRunner().invoke(cli, ["calibrate", "run", "--nprocs", "4", "-c", "all_reduce",
                                      "--binary-dir", str(bins), "--out", str(out)])  # fmt: skip
    assert result.exit_code == 2 and "ran on 8 ranks, not the 4" in result.output
    assert not (out / "logs" / "all_reduce.txt").exists()
    result = CliRunner().invoke(cli, ["calibrate", "run", "-f", "1.5", "--binary-dir", str(bins),
                                      "--out", str(out), "--dry-run"])  # fmt: skip
    assert result.exit_code == 2 and "'-f'" in result.output


def test_one_run_per_directory_and_resumes_measure_alike(tmp_path):
    """A second run into a directory in use is refused (it took the first's live output for
    stale); a resumed run must use the first one's warm-up and iteration counts."""
    import fcntl

    bins = _fake_binaries(tmp_path / "bin", f"cat {SAMPLE}\n", names=("all_reduce",))
    out = tmp_path / "res"
    out.mkdir()
    args = ["calibrate", "run", "--nprocs", "8", "-c", "all_reduce", "--binary-dir", str(bins),
            "--out", str(out)]  # fmt: skip
    with (out / ".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running calibrate run holds it
        busy = CliRunner().invoke(cli, args)
    assert busy.exit_code == 2 and "another calibrate run is writing" in busy.output
    assert _cli(*args).exit_code == 0
    other = CliRunner().invoke(cli, [*args, "-n", "3"])
    assert other.exit_code == 2 and "iters=20" in other.output


def test_nccl_tests_failures_printed_to_stdout_are_the_reason():
    """nccl-tests prints its failures with printf (stdout), and its '#wrong' summary too."""
    from collsim.calibration.runners import failure_reason

    out = ("# nThread 1 nGpus 1\nvm: Test NCCL failure common.cu:1005 'unhandled system error "
           "(run with NCCL_DEBUG=INFO for details) / Connection refused'\n .. vm pid 7: Test "
           "failure common.cu:893\n")  # fmt: skip
    assert failure_reason("", 1, out).startswith("vm: Test NCCL failure common.cu:1005")
    wrong = "   8  2 float sum -1  10.0 0.00 0.00  3\n# Out of bounds values : 3 FAILED\n"
    assert failure_reason("", 1, wrong) == "Out of bounds values : 3 FAILED"
    assert failure_reason("", 1, "# Out of bounds values : 0 OK\n") == "exit status 1"


def test_sizes_are_passed_to_nccl_tests_as_bytes(tmp_path):
    """nccl-tests reads 1MB as 2**20 and refuses 512B; collsim reads 1e6 and 512 (and 1M as
    2**20, as nccl-tests)."""
    result = _cli("calibrate", "run", "--nprocs", "2", "-c", "all_reduce", "-b", "512B",
                  "-e", "1MB", "--out", str(tmp_path / "r"), "--dry-run")  # fmt: skip
    assert " -b 512 -e 1000000 " in result.output


def test_multi_node_srun_finds_the_rendezvous_or_says_how(tmp_path, monkeypatch):
    """Ranks on other nodes cannot reach 127.0.0.1: under Slurm the first node of the
    allocation hosts the rendezvous; outside one, MASTER_ADDR must be set."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, body in (("srun", "exit 0"), ("scontrol", "echo gpu-017; echo gpu-018")):
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    args = ["calibrate", "run", "--runner", "torch", "--launcher", "srun", "--nodes", "2",
            "--nprocs", "4", "--out", str(tmp_path / "r"), "--dry-run"]  # fmt: skip
    outside = CliRunner().invoke(cli, args)
    assert outside.exit_code == 2 and "MASTER_ADDR" in outside.output
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[017-018]")
    inside = _cli(*args)
    assert inside.exit_code == 0 and "MASTER_ADDR=gpu-017" in inside.output


def test_a_rerun_with_other_nodes_or_sizes_is_refused(tmp_path):
    """A finished collective's log covers its run's size range on its nodes: a rerun into the
    same directory with other sizes or nodes must not take it as done."""
    bins = _fake_binaries(tmp_path / "bin", f"cat {SAMPLE}\n", names=("all_reduce",))
    out = tmp_path / "res"
    args = ["calibrate", "run", "--nprocs", "8", "-c", "all_reduce", "--binary-dir", str(bins),
            "--out", str(out)]  # fmt: skip
    assert _cli(*args).exit_code == 0
    wider = CliRunner().invoke(cli, [*args, "-e", "8G"])
    assert wider.exit_code == 2 and "sizes" in wider.output and "another --out" in wider.output
