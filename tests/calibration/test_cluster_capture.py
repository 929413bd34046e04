"""``calibrate run`` keeps what the cluster says of itself; ``calibrate fit -t OUT`` uses it."""

import json
import shutil
import socket
from pathlib import Path

from click.testing import CliRunner

from collsim.calibration.cluster import capture_cluster, captured_topology, note_captures
from collsim.cli import cli

DATA = Path(__file__).parents[1] / "topology" / "imports_data"
LOG = Path(__file__).parents[2] / "data" / "nccl-tests" / "logs"
runner = CliRunner()


def _fake_tool(folder: Path, name: str, text_file: Path) -> None:
    tool = folder / name
    tool.write_text(f"#!/bin/sh\ncat {text_file}\n")
    tool.chmod(0o755)


def test_captures_nvidia_smi_and_ibnetdiscover_where_they_exist(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "nvidia-smi", DATA / "nvsmi_topo_h100_8gpu_ml-engineering.txt")
    _fake_tool(bin_dir, "ibnetdiscover", DATA / "ibnetdiscover_ibm_pcm_sdr_2009.topo")
    monkeypatch.setenv("PATH", f"{bin_dir}:{shutil.os.environ['PATH']}")
    out = tmp_path / "r"
    out.mkdir()
    problems = capture_cluster(out, "local", 1, [])
    assert problems == {}
    host = socket.gethostname()
    assert "NV18" in (out / "cluster" / f"nvsmi-{host}.txt").read_text()
    assert "Switch" in (out / "cluster" / "ibnetdiscover.txt").read_text()
    note_captures(out, problems)
    info = json.loads((out / "env.json").read_text())
    assert info["cluster_captures"] == ["ibnetdiscover.txt", f"nvsmi-{host}.txt"]


def test_missing_tools_are_notes_not_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither tool
    problems = capture_cluster(tmp_path, "local", 1, [])
    assert set(problems) == {"nvidia-smi", "ibnetdiscover"}


def test_fit_on_a_results_directory_imports_what_it_captured(tmp_path):
    cluster = tmp_path / "r" / "cluster"
    cluster.mkdir(parents=True)
    shutil.copy(DATA / "nccl_ibmcloud_gx3d_h100_8gpu_topo.xml", cluster / "nccl-topo.xml")
    log = LOG / "h100-8gpu-together-ring-all_reduce-1.txt"
    result = runner.invoke(cli, ["calibrate", "fit", str(log), "-t", str(tmp_path / "r"), "-o",
                                 str(tmp_path / "p.yaml")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "imported the captured cluster" in result.output
    text = (cluster / "topology.yaml").read_text()
    assert "collsim topo import of nccl-topo.xml" in text
    assert (tmp_path / "p.yaml").exists()
    # A captured scan whose switch cannot hold these servers' NICs: one line naming the scan.
    shutil.copy(DATA / "ibnetdiscover_ibm_pcm_sdr_2009.topo", cluster / "ibnetdiscover.txt")
    result = runner.invoke(cli, ["calibrate", "fit", str(log), "-t", str(tmp_path / "r"), "-o",
                                 str(tmp_path / "q.yaml")])  # fmt: skip
    assert result.exit_code == 2
    assert "ibnetdiscover.txt" in result.output and "2 servers of 8 NICs" in result.output


def test_a_results_directory_without_captures_is_one_line(tmp_path):
    log = LOG / "h100-8gpu-together-ring-all_reduce-1.txt"
    result = runner.invoke(cli, ["calibrate", "fit", str(log), "-t", str(tmp_path), "-o",
                                 str(tmp_path / "p.yaml")])  # fmt: skip
    assert result.exit_code == 2
    assert "no captured topology here" in result.output and str(tmp_path) in result.output
    assert captured_topology.__doc__
