"""The tuner, `collsim tune`, and `collsim simulate --engine analytic / --model`."""

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.model import AnalyticModel
from collsim.model.tuner import Tuner, ranges
from collsim.topology.loader import catalog_names, load_topology
from collsim.whatif import WhatIf

runner = CliRunner()


def test_tuner_picks_latency_algorithms_small_and_bandwidth_ones_large():
    whatif = WhatIf(load_topology("dgx-h100", nodes=4))
    result = Tuner(whatif.cost_model("collsim")).tune("all_reduce", [8, 16 << 30])
    small, large = result.choice_at(0), result.choice_at(1)
    assert small.protocol == "LL" and small.algorithm in ("direct", "tree", "rhd")
    assert large.protocol == "Simple"
    # the winner is never slower than the baseline, and is the minimum of all candidates
    assert np.all(result.best_s <= result.baseline_s * (1 + 1e-12))
    assert np.allclose(result.best_s, result.times_s.min(axis=0))


def test_nccl_model_tuner_prefers_tree_or_ll_small_and_ring_simple_large():
    whatif = WhatIf(load_topology("dgx-h100", nodes=4))
    result = Tuner(whatif.cost_model("nccl")).tune("all_reduce", [1024, 1 << 30])
    small, large = result.choice_at(0), result.choice_at(1)
    assert small.algorithm == "tree" or small.protocol == "LL"
    assert (large.algorithm, large.protocol) == ("ring", "Simple")


def test_ranges_cover_every_size_once():
    model = AnalyticModel(load_topology("p4d"))
    sizes = [8 << i for i in range(28)]
    spans = ranges(Tuner(model).tune("all_gather", sizes))
    assert spans[0].lo_bytes == sizes[0] and spans[-1].hi_bytes == sizes[-1]
    assert all(a.hi_bytes < b.lo_bytes for a, b in itertools.pairwise(spans))
    assert all(s.speedup_min >= 1 - 1e-9 for s in spans)


@pytest.mark.parametrize("name", catalog_names())
def test_tune_cli_prints_crossovers_for_every_catalog_system(name):
    result = runner.invoke(cli, ["tune", "all_reduce", "-t", name, "-e", "1G", "-f", "4"])
    assert result.exit_code == 0, result.output
    assert "speed-up" in result.output and "algorithm" in result.output
    rows = [line for line in result.output.splitlines() if not line.startswith("#")][1:]
    assert rows and all(len(r.split()) >= 6 for r in rows)


def test_tune_cli_json_and_nccl_model(tmp_path):
    out = tmp_path / "t.json"
    args = ["tune", "all_reduce", "-t", "dgx-h100", "--nodes", "2", "--model", "nccl", "--json",
            str(out)]  # fmt: skip
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["model"] == "nccl" and doc["ranges"] and doc["points"]
    assert {p["algorithm"] for p in doc["points"]} <= {"ring", "tree", "in_network", "nvls_tree"}


def test_simulate_analytic_engine_matches_the_des_engine(tmp_path):
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "1", "-a", "ring", "-b", "1K",
            "-e", "64M", "-f", "64", "--json"]  # fmt: skip
    des = runner.invoke(cli, [*args, str(tmp_path / "des.json")])
    ana = runner.invoke(cli, [*args, str(tmp_path / "ana.json"), "--engine", "analytic"])
    assert des.exit_code == 0 and ana.exit_code == 0, des.output + ana.output
    t_des = [p["time_us"] for p in json.loads((tmp_path / "des.json").read_text())["points"]]
    t_ana = [p["time_us"] for p in json.loads((tmp_path / "ana.json").read_text())["points"]]
    assert np.allclose(t_ana, t_des, rtol=0.01)


def test_simulate_auto_uses_the_tuner_and_times_its_choice():
    whatif = WhatIf(load_topology("dgx-h100", nodes=2))
    sweep = whatif.sweep("all_reduce", "auto", [1024, 256 << 20])
    ana = whatif.sweep("all_reduce", "auto", [1024, 256 << 20], engine="analytic")
    assert [p.algorithm for p in sweep.points] == [p.algorithm for p in ana.points]
    for des, model in zip(sweep.points, ana.points, strict=True):
        assert model.time_s == pytest.approx(des.time_s, rel=0.02)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["simulate", "all_reduce", "-t", "dgx-h100", "--engine", "fast"], "unknown engine"),
        (
            ["simulate", "all_reduce", "-t", "dgx-h100", "--engine", "analytic", "--model", "x"],
            "unknown model",
        ),
        (["tune", "all_reduce", "-t", "dgx-h100", "--model", "x"], "unknown model"),
        (["tune", "all_reduce", "-t", "dgx-h100", "-b", "1G", "-e", "1K"], "larger"),
        (
            [
                "simulate",
                "all_reduce",
                "-t",
                "dgx-h100",
                "--engine",
                "analytic",
                "--trace",
                "t.json",
            ],
            "trace",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args, words):
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], result.output


def test_vectorised_evaluation_is_fast():
    import time

    model = AnalyticModel(load_topology("dgx-h100", nodes=2))
    sizes = np.geomspace(8, 1 << 34, 200_000).astype(np.int64)
    model.predict("all_reduce", "ring", sizes[:2])
    t0 = time.perf_counter()
    model.predict("all_reduce", "ring", sizes)
    assert time.perf_counter() - t0 < 1.0  # >= 200k points/s even on a slow CI machine


def test_ll128_only_where_nccl_enables_it_by_default():
    """NCCL enables LL128 by default only on NVLink systems of compute capability 7.0/8.0/9.0
    (tuning.cc): the tuner keeps to that; an explicit protocol (or NCCL_PROTO) still runs it."""
    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 24]
    systems = [("dgx-a100", True), ("a100-pcie-2gpu", False), ("rtx4090-4gpu-pcie", False),
               ("rtx2080ti-2gpu-nop2p", False)]  # fmt: skip
    for name, expected in systems:
        model = AnalyticModel(load_topology(name))
        assert model.enabled("all_reduce", "ring", "LL128") is expected
        assert model.enabled("all_reduce", "ring", "LL") and model.enabled(
            "all_reduce", "ring", "Simple"
        )
        picked = {c.protocol for c in Tuner(model).tune("all_reduce", sizes).choices}
        assert ("LL128" in picked) is expected
        assert np.all(np.isfinite(model.predict("all_reduce", "ring", sizes, protocol="LL128")))
    from collsim.calibration.predict import Predictor

    pcie = Predictor(load_topology("a100-pcie-2gpu"))
    _, default = pcie.predict("all_reduce", np.array(sizes))
    _, forced = pcie.predict("all_reduce", np.array(sizes), env={"NCCL_PROTO": "LL128"})
    assert not any("LL128" in label for label in default)
    assert all("/LL128/" in label for label in forced)


def test_in_network_reduction_runs_simple_only():
    """NVLS (and SHARP) reduce whole buffers: NCCL never runs them with LL or LL128, so neither
    does the tuner, and asking for it is an error naming the protocol."""
    whatif = WhatIf(load_topology("dgx-h100", nodes=1))
    sizes = [8, 1 << 10, 1 << 16, 1 << 20, 4 << 20, 1 << 30]
    result = Tuner(whatif.cost_model("collsim")).tune(
        "all_reduce", sizes, algorithms=["ring", "tree", "in_network"]
    )
    picks = {(c.algorithm, c.protocol) for c in (result.choice_at(i) for i in range(len(sizes)))}
    assert ("in_network", "Simple") in picks
    assert not {p for p in picks if p[0] == "in_network" and p[1] != "Simple"}
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "--nodes", "1",
            "-a", "in_network", "--protocol", "ll", "-b", "8", "-e", "8"]  # fmt: skip
    out = runner.invoke(cli, args)
    assert out.exit_code == 2 and "'protocol'" in out.output and "Simple" in out.output


def test_a_chunk_the_pipeline_must_coarsen_is_noted():
    args = ["simulate", "all_reduce", "-t", "dgx-h100", "-a", "tree", "-b", "16M", "-e", "16M",
            "--engine", "analytic"]  # fmt: skip
    fine = runner.invoke(cli, [*args, "--chunk-bytes", "4K"])
    assert fine.exit_code == 0 and "may be larger" in fine.output
    plain = runner.invoke(cli, [*args, "--chunk-bytes", "512K"])
    assert plain.exit_code == 0 and "may be larger" not in plain.output
    as_ring = [a if a != "tree" else "ring" for a in args]
    ring = runner.invoke(cli, [*as_ring, "--chunk-bytes", "4K"])
    assert ring.exit_code == 0 and "may be larger" not in ring.output  # rings do not pipeline


def test_tune_prints_each_ranges_times_and_busbw(tmp_path):
    """Comparing clusters needed the JSON: each range now shows its time at both ends and the
    bus bandwidth at its largest size, the same numbers the JSON's points hold."""
    import json

    out = tmp_path / "t.json"
    result = runner.invoke(cli, ["tune", "all_reduce", "-t", "dgx-h100", "--nodes", "2",
                                 "-b", "1G", "-e", "1G", "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    (point,) = json.loads(out.read_text())["points"]
    row = next(line for line in result.output.splitlines() if line.strip().startswith("1G"))
    t_us = point["time_us"]
    assert f"{t_us:.4g}..{t_us:.4g}" in row
    busbw = 2 * 15 / 16 * 2**30 / (t_us * 1e-6) / 1e9
    assert f"{busbw:.2f} GB/s" in row
