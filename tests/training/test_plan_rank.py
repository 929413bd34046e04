"""``collsim plan``: each layout's throughput, memory, fit and rank (1 = fastest that fits),
ties ranked the same way whatever the order they were found in."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.topology.loader import load_topology
from collsim.training.plan import Option, rank_options
from tests.training._step_fixtures import evaluate as _evaluate
from tests.training._step_fixtures import gpt

runner = CliRunner()


def test_ties_rank_by_name_and_what_does_not_fit_ranks_last():
    r = _evaluate(load_topology("dgx-h100", nodes=1), gpt(), 8)
    big = replace(r, memory=replace(r.memory, capacity=r.memory.total / 2))
    assert r.fits and not big.fits
    opts = [
        Option("b", "t", 1, r, hours=1.0, cost_usd=1.0),
        Option("fast-but-too-big", "t", 1, big, hours=0.5, cost_usd=0.5),
        Option("a", "t", 1, r, hours=1.0, cost_usd=1.0),
    ]
    for order in (opts, opts[::-1]):
        found = list(order)
        rank_options(found)
        assert [(o.cluster, o.rank) for o in found] == [
            ("a", 1), ("b", 2), ("fast-but-too-big", 3)
        ]  # fmt: skip
    assert {"tokens_s_per_gpu", "tflops_per_gpu", "fits", "rank"} <= set(found[0].row())


def test_plan_reports_throughput_memory_and_rank(tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(
        cli,
        ["plan", "-w", "llama2-70b", "-c", "workloads/candidates/llama2-70b.yaml",
         "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if line.startswith("cluster"))
    for col in ("tokens_s_per_gpu", "tflops_per_gpu", "mem_GB", "fits", "rank"):
        assert col in header
    rows = json.loads(out.read_text())
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    hours = [r["days"] for r in rows if r["fits"] == "yes"]
    assert hours == sorted(hours)
    first = rows[0]
    tokens = first["step"]["tokens_per_s"] / first["gpus"]
    assert abs(first["tokens_s_per_gpu"] - tokens) < 1e-6 * tokens


def test_ffn_that_does_not_shard_over_tp_is_one_line_exit_2(tmp_path):
    """An MLP width tp does not divide: one line naming the file, parallel.tp and the value."""
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(gpt(model={"ffn": 4090}, parallel={"tp": 4})))
    res = runner.invoke(cli, ["step", "-w", str(path), "-t", "dgx-h100", "--nodes", "1"])
    assert res.exit_code == 2, res.output
    assert "parallel.tp" in res.output and "4090" in res.output and str(path) in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("changes", "topology", "field", "value"),
    [
        ({"model": {"hidden": 1536, "heads": 12}, "parallel": {"tp": 8}}, "dgx-h100",
         "parallel.tp", "8"),  # heads that TP does not shard
        ({"dtype": "fp8"}, "dgx-a100", "dtype", "fp8"),  # FP8 on a GPU without FP8 tensor cores
        ({"model": {"experts": {"count": 6, "top_k": 2}}, "parallel": {"ep": 4}}, "dgx-h100",
         "parallel.ep", "4"),  # EP that does not divide the experts
        ({"model": {"seq_len": 1000}, "parallel": {"cp": 3}}, "dgx-h100", "parallel",
         "'cp': 3"),  # a sequence CP cannot split into 2 x cp chunks
    ],
)  # fmt: skip
def test_layouts_that_cannot_run_are_one_line_exit_2(tmp_path, changes, topology, field, value):
    """The issue's bad inputs: one line naming the file, the field and the value; exit 2."""
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(gpt(**changes)))
    res = runner.invoke(cli, ["step", "-w", str(path), "-t", topology, "--nodes", "1"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert str(path) in line and f"field '{field}'" in line and value in line
