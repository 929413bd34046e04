"""Bad input everywhere: every malformed file of ``tests/bad_inputs`` gives one line naming the
file, the field and the value, exit code 2 and no traceback (``manifest.yaml`` lists each file,
the command that reads it and the words its error line must contain)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli

HERE = Path(__file__).parent / "bad_inputs"
MANIFEST = yaml.safe_load((HERE / "manifest.yaml").read_text())
KINDS = ("topology", "workload", "sweep", "profile", "nccl_tests")


def _args(command: str, path: Path, tmp: Path) -> list[str]:
    swap = {"FILE": str(path), "TMP": str(tmp / "out")}
    return [swap.get(word, word) for word in shlex.split(command)]


def test_the_corpus_is_complete():
    files = sorted(p.relative_to(HERE).as_posix() for k in KINDS for p in (HERE / k).iterdir())
    assert files == sorted(MANIFEST), "every bad file has a manifest entry and vice versa"
    assert len(files) >= 30
    assert all(any(f.startswith(k + "/") for f in files) for k in KINDS)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_one_line_naming_file_field_and_value(name, tmp_path):
    case = MANIFEST[name]
    path = HERE / name
    result = CliRunner().invoke(cli, _args(case["command"], path, tmp_path))
    output = result.output
    assert result.exit_code == 2, output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert result.stdout == "" and result.stderr == output  # the line is on stderr
    line = lines[0]
    assert line.startswith("collsim: error: ") and str(path) in line, line
    for word in case["words"]:
        assert word in line, f"{word!r} not in {line!r}"


def _collsim() -> list[str]:
    script = Path(sys.executable).parent / "collsim"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from collsim.cli import main; main()"]


@pytest.mark.parametrize(
    "name",
    [
        "topology/zero_bandwidth.yaml",
        "workload/unknown_key.yaml",
        "sweep/unknown_collective.yaml",
        "profile/bad_version.yaml",
        "nccl_tests/bad_number.txt",
    ],
)
def test_as_a_real_process(name, tmp_path):
    """The installed ``collsim`` command: exit code 2 and the one line on stderr, nothing else."""
    case = MANIFEST[name]
    path = HERE / name
    proc = subprocess.run(
        [*_collsim(), *_args(case["command"], path, tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and str(path) in proc.stderr
    assert all(word in proc.stderr for word in case["words"])


def test_a_closed_pipe_stops_quietly():
    """``collsim ... | head -1``: the reader leaves early; no error line, no traceback."""
    from collsim.calibration.dataset import DATA_DIR

    log = DATA_DIR / "logs" / "a100-80g-p4de-efa-2n-all_reduce-1.txt"
    proc = subprocess.Popen(
        [*_collsim(), "calibrate", "read", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) in (0, 1)
    assert first.startswith("# ") and "error" not in err and "Traceback" not in err
