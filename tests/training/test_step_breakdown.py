"""``collsim step --breakdown``: phases that sum to the step, hidden vs exposed communication,
one layer per part, parts a newer step model adds listed as they come."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.topology.loader import load_topology
from collsim.training.breakdown import phase_rows
from tests.training._step_fixtures import MOE, gpt
from tests.training._step_fixtures import evaluate as _evaluate

runner = CliRunner()


@pytest.fixture(scope="module")
def dgx():
    return load_topology("dgx-h100", nodes=2)


def _rows(result):
    return {r["phase"]: r for r in phase_rows(result)}


def test_phases_sum_to_the_step_and_split_compute(dgx):
    """Exposed times sum to the step; compute is split into GEMM, memory-bound, recompute and
    the output layer, which sum to the step model's compute."""
    par = {"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True}
    r = _evaluate(dgx, gpt(recompute="selective", parallel=par, global_batch=32), 16)
    rows = _rows(r)
    assert sum(x["exposed_s"] for x in rows.values()) == pytest.approx(r.step_time_s, rel=1e-12)
    parts = [k for k in rows if k.startswith("compute: ")]
    assert {"compute: GEMM", "compute: memory-bound", "compute: recompute"} <= set(parts)
    assert "compute: other" not in rows  # the parts account for all of compute
    assert sum(rows[k]["exposed_s"] for k in parts) == pytest.approx(r.breakdown["compute"])
    assert {"TP comm", "PP comm", "DP comm", "pipeline bubble"} <= set(rows)
    assert sum(x["share"] for x in rows.values()) == pytest.approx(1.0)


def test_overlap_shows_total_hidden_and_exposed(dgx):
    """tp_overlap and DP bucket overlap keep their total: hidden = total - exposed > 0."""
    par = {"tp": 8, "pp": 1, "dp": 2, "sequence_parallel": True}
    plain = _rows(_evaluate(dgx, gpt(global_batch=16, micro_batch=1, parallel=par), 16))
    over = _evaluate(dgx, gpt(global_batch=16, micro_batch=1,
                              parallel={**par, "tp_overlap": True}), 16)  # fmt: skip
    tp = _rows(over)["TP comm"]
    assert tp["total_s"] == pytest.approx(plain["TP comm"]["total_s"])
    assert tp["hidden_s"] > 0
    assert tp["exposed_s"] == pytest.approx(over.breakdown["tp_comm"])
    assert tp["hidden_s"] + tp["exposed_s"] == pytest.approx(tp["total_s"])
    dp = _rows(over)["DP comm"]
    assert dp["hidden_s"] > 0 and dp["exposed_s"] == pytest.approx(over.breakdown["dp_comm"])


def test_unknown_parts_are_listed_as_they_come(dgx):
    """A compute part or breakdown key this module does not know shows under its own name;
    compute no part accounts for is an 'other' row, and the rows still sum to the step."""
    r = _evaluate(dgx, gpt(), 8)
    parts = {**r.details["compute_parts_s"], "grouped_gemm": 0.1 * r.breakdown["compute"]}
    parts["gemm"] -= 0.2 * r.breakdown["compute"]
    extra = replace(r, details={**r.details, "compute_parts_s": parts},
                    breakdown={**r.breakdown, "moe_imbalance": 0.01},
                    step_time_s=r.step_time_s + 0.01)  # fmt: skip
    rows = _rows(extra)
    assert rows["compute: grouped_gemm"]["exposed_s"] == pytest.approx(parts["grouped_gemm"])
    assert rows["compute: other"]["exposed_s"] == pytest.approx(0.1 * r.breakdown["compute"])
    assert rows["moe_imbalance"]["exposed_s"] == 0.01
    assert sum(x["exposed_s"] for x in rows.values()) == pytest.approx(extra.step_time_s)


def _workload_file(tmp_path, data):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_cli_breakdown_prints_and_writes_json(tmp_path):
    """`step --breakdown` prints the phase table in ms and one layer's parts; --json holds the
    same rows, whose exposed times sum to the step; without the flag neither appears."""
    data = gpt(model={**MOE}, parallel={"tp": 2, "ep": 4, "sequence_parallel": True})
    w = _workload_file(tmp_path, data)
    out = tmp_path / "o.json"
    args = ["step", "-w", w, "-t", "dgx-h100", "--nodes", "1"]
    res = runner.invoke(cli, [*args, "--breakdown", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "total_ms" in res.output and "hidden_ms" in res.output and "exposed_ms" in res.output
    assert "EP comm" in res.output and "TP comm" in res.output
    assert "one layer of the slowest stage" in res.output
    got = json.loads(out.read_text())
    phases = got["phases"]
    assert sum(r["exposed_s"] for r in phases["phases"]) == pytest.approx(got["step_time_s"])
    layer = {(r["pass"], r["part"]) for r in phases["layer"]}
    assert {("forward", "GEMM"), ("backward", "GEMM"), ("forward", "EP comm")} <= layer
    plain = runner.invoke(cli, args)
    assert plain.exit_code == 0 and "exposed_ms" not in plain.output
