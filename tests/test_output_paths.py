"""Output paths: missing folders are made only inside the working directory. Elsewhere the folder
that holds an output must exist (an output folder's parent, for ``sweep -o /scratch/run1``), so a
slip such as ``--json /nonexistent/dir/x.json`` is one line naming the option and the folder,
before any work, instead of folders created at the root of the filesystem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from collsim.calibration.store import ResultStore
from collsim.cli import cli
from collsim.errors import CollsimError
from collsim.io import atomic_write_text, make_folders

ROOT = Path(__file__).resolve().parents[1]
LOG = str(ROOT / "data/nccl-tests/logs/h100-snellius-1n4g-all_reduce-1.txt")
TOPOLOGY = "h100-4gpu-ib"


@pytest.fixture
def places(tmp_path, monkeypatch):
    """(the working directory, a folder outside it); the tests run in the first."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    monkeypatch.chdir(work)
    return work.resolve(), outside.resolve()


def _one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("collsim: error: "), result.output
    return lines[0]


# Each output option with the least else its command needs; OUT is the output path.
OUTPUTS = {
    "simulate --json": ["simulate", "all_reduce", "-t", "dgx-h100", "-e", "1K", "--json", "OUT"],
    "simulate --trace": ["simulate", "all_reduce", "-t", "dgx-h100", "-e", "1K", "--trace", "OUT"],
    "tune --json": ["tune", "all_reduce", "-t", "dgx-h100", "--json", "OUT"],
    "topo draw -o": ["topo", "draw", "dgx-h100", "-o", "OUT"],
    "validate --json": ["validate", LOG, "-t", TOPOLOGY, "--json", "OUT"],
    "validate --plot": ["validate", LOG, "-t", TOPOLOGY, "--plot", "OUT"],
    "step --json": ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--json", "OUT"],
    "scale --plot": ["scale", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--plot", "OUT"],
    "stragglers --json": ["stragglers", "all_reduce", "-t", "dgx-h100", "--json", "OUT"],
    "calibrate fit -o": ["calibrate", "fit", LOG, "-t", TOPOLOGY, "-o", "OUT"],
    "calibrate run --out": ["calibrate", "run", "--out", "OUT"],
    "sweep -o": ["sweep", str(ROOT / "sweeps/h100-vs-b200.yaml"), "-o", "OUT", "--dry-run"],
    "report -o": ["report", str(ROOT / "sweeps"), "-o", "OUT"],
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_an_output_in_a_missing_folder_outside_the_working_directory_is_refused(name, places):
    """Every output option: refused before any work, naming the option, the missing folder and
    the path; nothing is created."""
    _, outside = places
    target = outside / "nonexistent" / "dir" / "x.json"
    args = [str(target) if a == "OUT" else a for a in OUTPUTS[name]]
    line = _one_line_error(args)
    option = name.split()[-1]
    flag = {"-o": "--output"}.get(option, option)
    assert f"field '{flag}'" in line, line
    assert f"folder {target.parent} does not exist" in line, line
    assert "(value: '" in line, line  # the path, cut at 80 characters
    assert not (outside / "nonexistent").exists()


def test_json_at_a_missing_root_folder_is_refused(places):
    """The issue's own case: a path under a folder that is not there, from the root."""
    line = _one_line_error(
        [
            "simulate",
            "all_reduce",
            "-t",
            "dgx-h100",
            "-e",
            "1K",
            "--json",
            "/nonexistent/dir/x.json",
        ]
    )
    assert line == (
        "collsim: error: field '--json': folder /nonexistent/dir does not exist (collsim makes "
        "missing folders only inside the working directory: create it first) "
        "(value: '/nonexistent/dir/x.json')"
    )
    assert not Path("/nonexistent").exists()


def test_inside_the_working_directory_missing_folders_are_made(places):
    work, _ = places
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "-e", "1K", "--json", "out/run1/x.json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads((work / "out" / "run1" / "x.json").read_text())


def test_outside_it_an_existing_folder_takes_the_output(places):
    _, outside = places
    target = outside / "x.json"
    result = CliRunner().invoke(
        cli, ["simulate", "all_reduce", "-t", "dgx-h100", "-e", "1K", "--json", str(target)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text())


def test_an_output_folder_outside_is_made_where_its_parent_exists(places):
    """``sweep -o /scratch/run1`` makes ``run1`` (and its own ``parts/`` inside it) but not a
    missing ``/scratch``."""
    _, outside = places
    spec = outside / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "topologies": ["dgx-h100"],
                "nodes": [1],
                "collectives": ["all_reduce"],
                "algorithms": ["ring"],
                "sizes": ["1K"],
                "engines": ["analytic"],
            }
        )
    )
    results = outside / "run1"
    result = CliRunner().invoke(cli, ["sweep", str(spec), "-o", str(results), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert (results / "points.csv").is_file() and any((results / "parts").iterdir())
    result = CliRunner().invoke(cli, ["report", str(results), "-o", str(outside / "report")])
    assert result.exit_code == 0, result.output
    assert (outside / "report" / "report.md").is_file()


def test_the_library_follows_the_same_rule(places):
    """``atomic_write_text`` (profiles, traces, results) refuses a missing folder outside the
    working directory with the same line, naming the path; a results folder makes its own
    layout inside itself wherever it lies."""
    work, outside = places
    with pytest.raises(CollsimError) as info:
        atomic_write_text(outside / "a" / "b" / "x.json", "{}")
    assert str(info.value).startswith(
        f"{outside / 'a' / 'b' / 'x.json'}: folder {outside / 'a' / 'b'}"
    )
    assert not (outside / "a").exists()
    atomic_write_text("a/b/x.json", "{}")
    assert (work / "a" / "b" / "x.json").is_file()
    assert make_folders(outside / "made", folder=True) == outside / "made"
    assert (outside / "made").is_dir()
    store = ResultStore(outside / "made", {"kind": "test"})
    store.record("k", "points/all_reduce/8.json", b"{}")
    assert (outside / "made" / "points" / "all_reduce" / "8.json").read_bytes() == b"{}"


def test_a_file_where_the_folder_should_be_is_said(places):
    _, outside = places
    (outside / "f").write_text("")
    line = _one_line_error(
        ["simulate", "all_reduce", "-t", "dgx-h100", "-e", "1K", "--json", str(outside / "f" / "x")]
    )
    assert f"{outside / 'f'} is a file, not a folder" in line
