"""The CLI on every catalog system: list, show (text and JSON), draw, export, demo."""

import json

import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.topology.loader import catalog_names

runner = CliRunner()


def test_topo_list_shows_every_system():
    result = runner.invoke(cli, ["topo", "list"])
    assert result.exit_code == 0, result.output
    for name in catalog_names():
        assert name in result.output
    rows = json.loads(runner.invoke(cli, ["topo", "list", "--json"]).output)
    assert {r["name"] for r in rows} == set(catalog_names())


@pytest.mark.parametrize("name", catalog_names())
def test_topo_show_and_draw_every_system(name, tmp_path):
    result = runner.invoke(cli, ["topo", "show", name])
    assert result.exit_code == 0, result.output
    assert "bisection" in result.output
    info = json.loads(runner.invoke(cli, ["topo", "show", name, "--json"]).output)
    assert info["gpus"] == info["nodes"] * info["gpus_per_node"]
    assert info["bisection_bandwidth_gbps"] > 0
    assert info["diameter_hops"] >= 1 or info["gpus"] == 1
    png = tmp_path / f"{name}.png"
    result = runner.invoke(cli, ["topo", "draw", name, "-o", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_show_with_node_override():
    info = json.loads(
        runner.invoke(cli, ["topo", "show", "dgx-h100", "--nodes", "16", "--json"]).output
    )
    assert info["gpus"] == 128


def test_help_everywhere():
    for args in (["--help"], ["topo", "--help"], ["topo", "show", "--help"], ["demo", "--help"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0 and "Usage" in result.output


def test_demo_runs():
    result = runner.invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output


def test_an_unknown_plot_format_is_refused_before_any_work(tmp_path):
    """validate used to print its results and then fail with a matplotlib traceback."""
    from collsim.calibration.dataset import DATA_DIR

    log = str(DATA_DIR / "logs" / "h100-snellius-1n4g-all_gather-1.txt")
    for args in (["validate", log, "-t", "h100-4gpu-ib"],
                 ["scale", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1,2"]):  # fmt: skip
        result = CliRunner().invoke(cli, [*args, "--plot", str(tmp_path / "v.txt")])
        assert result.exit_code == 2
        assert result.output.startswith("collsim: error: field '--plot': cannot draw a '.txt'")


def test_a_chunk_of_no_bytes_is_refused_before_any_arithmetic():
    """`--chunk-bytes 0` printed numpy's divide-by-zero warnings before its error."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would now be an exception
        args = ["simulate", "all_reduce", "-t", "dgx-h100", "--chunk-bytes", "0"]
        result = CliRunner().invoke(cli, [*args, "--engine", "analytic"])
    assert result.exit_code == 2
    assert "'--chunk-bytes'" in result.output and "at least one byte" in result.output
    result = CliRunner().invoke(cli, ["stragglers", "all_reduce", "-t", "dgx-h100",
                                      "--chunk-bytes", "0"])  # fmt: skip
    assert result.exit_code == 2 and "'--chunk-bytes'" in result.output


def test_simulate_reports_progress_and_points_slow_engine_runs_at_the_analytic_one(monkeypatch):
    """The engine can take minutes on a big system: the sweep reports each size as it is timed
    (a bar on a terminal), and a run past SLOW_RUN_S ends with a hint at --engine analytic."""
    from collsim.cli import simulate as sim_cli
    from collsim.topology.loader import load_topology
    from collsim.whatif import WhatIf

    calls = []
    WhatIf(load_topology("dgx-h100", nodes=1)).sweep(
        "all_reduce", "ring", [1024, 4096, 16384], progress=lambda d, t: calls.append((d, t))
    )
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    monkeypatch.setattr(sim_cli, "SLOW_RUN_S", 0.0)
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-b", "1K", "-e", "4K"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0 and "--engine analytic estimates in milliseconds" in out.output
    quick = CliRunner().invoke(cli, [*args, "--engine", "analytic"])
    assert "--engine analytic estimates" not in quick.output
