"""``step``/``scale``/``plan``: ``--global-batch``/``--micro-batch`` overrides, and the warning for
a tensor-parallel group placed over several nodes (collsim/training/tp_span.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

import collsim.cli.base as cli_base
from collsim.cli import cli

runner = CliRunner()

TINY = {  # 8-way TP: two nodes of a 4-GPU system
    "name": "tiny-tp8",
    "model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024},
    "global_batch": 16,
    "micro_batch": 1,
    "parallel": {"tp": 8},
}
SIX_GPU_NODES = {  # 6 GPUs a node: a 4-way TP group straddles nodes 0 and 1
    "name": "six-gpu",
    "nodes": 2,
    "gpu": {"model": "H100 SXM5 80GB", "peak_tflops": {"bf16": 989.4}, "memory": "80GiB",
            "memory_bandwidth": "3.35TB/s"},
    "node": {
        "gpus": 6,
        "intra": {"kind": "nvswitch",
                  "link": {"kind": "nvlink", "bandwidth": "450GB/s", "latency": "0.7us"}},
        "pcie": {"kind": "pcie", "bandwidth": "63GB/s", "latency": "0.5us"},
        "nics": {"count": 6,
                 "link": {"kind": "infiniband", "bandwidth": "400Gbps", "latency": "0.6us"}},
    },
    "fabric": {"kind": "fat_tree", "radix": 64, "tiers": 2},
}  # fmt: skip


def _file(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _one_error_line(res):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    return lines[0]


def test_batch_overrides_set_the_step_and_show_in_its_output(tmp_path):
    """gpt-1.3b-ddp's file says 512 x 8; the options make it 256 x 4 on 16 GPUs: 4 micro-batches
    per replica, printed in the header and written in the JSON."""
    out = tmp_path / "s.json"
    base = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "2", "--json", str(out)]
    res = runner.invoke(cli, base)
    assert res.exit_code == 0, res.output
    plain = json.loads(out.read_text())
    assert (plain["global_batch"], plain["micro_batch"]) == (512, 8)
    res = runner.invoke(cli, [*base, "--global-batch", "256", "--micro-batch", "4"])
    assert res.exit_code == 0, res.output
    assert "global batch 256 (4 micro-batches of 4 per replica)" in res.output
    data = json.loads(out.read_text())
    assert (data["global_batch"], data["micro_batch"]) == (256, 4)
    assert data["details"]["micro_batches"] == 4 and data["layout"].endswith("-mb4")
    assert data["step_time_s"] < plain["step_time_s"]  # half the samples


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        (["--micro-batch", "3"], ["'--micro-batch'", "multiple of micro_batch (3)", "value: 3"]),
        (["--global-batch", "100"], ["'--global-batch'", "global_batch (100)", "value: 100"]),
        # 136 = 17 x 8 divides by the micro-batch, not by 16 replicas x 8
        (["--global-batch", "136"], ["'--global-batch'", "dp x micro_batch = 16 x 8"]),
        (
            ["--global-batch", "64", "--micro-batch", "16"],
            ["'--global-batch'", "value: 64", "(with --micro-batch 16)"],
        ),  # 64 / 16 < 16 replicas
        (["--global-batch", str(1 << 41)], ["'--global-batch'", str(1 << 41)]),
        (["--micro-batch", "0"], ["--micro-batch", "0"]),
    ],
)
def test_bad_batch_overrides_name_the_option(options, needles):
    res = runner.invoke(
        cli, ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "2", *options]
    )
    line = _one_error_line(res)
    for needle in needles:
        assert needle in line, line


def test_scale_and_plan_take_the_batch_overrides(tmp_path):
    out = tmp_path / "s.json"
    res = runner.invoke(
        cli, ["scale", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1,2",
              "--global-batch", "256", "--micro-batch", "2", "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    points = json.loads(out.read_text())["points"]
    assert [(p["global_batch"], p["micro_batch"]) for p in points] == [(256, 2), (256, 2)]
    assert [p["layout"] for p in points] == ["tp1-pp1-dp8-mb2", "tp1-pp1-dp16-mb2"]
    res = runner.invoke(cli, ["scale", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1,2",
                              "--micro-batch", "5"])  # fmt: skip
    assert "'--micro-batch'" in _one_error_line(res)

    cand = _file(tmp_path, "c.yaml", {
        "tokens": "1B", "clusters": [{"topology": "dgx-h100", "nodes": 1, "gpu_hour_usd": 2}],
        "search": {"micro_batch": [1, 2]},
    })  # fmt: skip
    args = ["plan", "-w", "gpt-1.3b-ddp", "-c", cand, "--all-layouts", "--json", str(out)]
    res = runner.invoke(cli, [*args, "--global-batch", "128", "--micro-batch", "4"])
    assert res.exit_code == 0, res.output
    assert "--micro-batch 4 replaces the candidates' search of micro_batch [1, 2]" in res.output
    assert "global batch 128" in res.output
    rows = json.loads(out.read_text())
    assert [r["layout"] for r in rows] == ["tp1-pp1-dp8-mb4"]
    assert (rows[0]["step"]["global_batch"], rows[0]["step"]["micro_batch"]) == (128, 4)


def test_step_warns_when_a_tp_group_spans_nodes(tmp_path):
    """tp 8 on 4-GPU nodes: the warning names the span and what TP costs (most of this step);
    tp 4 on the same nodes: no warning."""
    wl, out = _file(tmp_path, "w.yaml", TINY), tmp_path / "s.json"
    args = ["step", "-w", wl, "-t", "h100-4gpu-ib", "--nodes", "2", "--json", str(out)]
    res = runner.invoke(cli, args)
    assert res.exit_code == 0, res.output
    warning = [line for line in res.output.splitlines() if line.startswith("# warning:")]
    assert len(warning) == 1, res.output
    data = json.loads(out.read_text())
    span = data["tp_span"]
    assert (span["tp"], span["nodes"], span["gpus_per_node"]) == (8, 2, 4)
    assert span["tp_comm_s"] == pytest.approx(data["breakdown"]["tp_comm"])
    assert span["share_of_step"] == pytest.approx(span["tp_comm_s"] / data["step_time_s"])
    assert span["in_node_tp_comm_s"] is None  # 8 GPUs never sit in one 4-GPU node
    assert "the tensor-parallel group (8 GPUs) spans 2 nodes (4 GPUs per node)" in warning[0]
    assert f"({100 * span['share_of_step']:.1f}% of the step)" in warning[0]
    assert "tp <= 4" in warning[0]
    four = _file(tmp_path, "w4.yaml", {**TINY, "parallel": {"tp": 4}})
    res = runner.invoke(cli, ["step", "-w", four, "-t", "h100-4gpu-ib", "--nodes", "2",
                              "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0 and "warning" not in res.output, res.output
    assert "tp_span" not in json.loads(out.read_text())


def test_a_straddling_tp_group_is_priced_against_one_node(tmp_path):
    """tp 4 on 6-GPU nodes: of the three groups the second (GPUs 4-7) straddles nodes 0 and 1.
    The step model times rank 0's group, inside node 0; the warning prices the split one too,
    slower than inside a node."""
    wl = _file(tmp_path, "w.yaml", {**TINY, "global_batch": 12, "parallel": {"tp": 4}})
    topo, out = _file(tmp_path, "six.yaml", SIX_GPU_NODES), tmp_path / "s.json"
    res = runner.invoke(cli, ["step", "-w", wl, "-t", topo, "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "# warning: 1 of 3 tensor-parallel groups (4 GPUs) span 2 nodes" in res.output
    data = json.loads(out.read_text())
    span = data["tp_span"]
    assert span["in_node_tp_comm_s"] == pytest.approx(data["breakdown"]["tp_comm"])
    assert span["tp_comm_s"] > 1.2 * span["in_node_tp_comm_s"]
    assert "inside one node" in res.output


def test_scale_and_plan_mark_layouts_whose_tp_group_spans_nodes(tmp_path):
    wl, out = _file(tmp_path, "w.yaml", TINY), tmp_path / "s.json"
    res = runner.invoke(cli, ["scale", "-w", wl, "-t", "h100-4gpu-ib", "--nodes", "2,4",
                              "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "# warning: 8 GPUs: the tensor-parallel group (8 GPUs) spans 2 nodes" in res.output
    assert "# warning: 16 GPUs: every tensor-parallel group (8 GPUs) spans 2 nodes" in res.output
    assert all(p["tp_span"]["nodes"] == 2 for p in json.loads(out.read_text())["points"])

    cand = _file(tmp_path, "c.yaml", {
        "tokens": "1B", "clusters": [{"topology": "h100-4gpu-ib", "nodes": 2, "gpu_hour_usd": 2}],
        "search": {"tp": [4, 8]},
    })  # fmt: skip
    res = runner.invoke(cli, ["plan", "-w", wl, "-c", cand, "--all-layouts", "--json", str(out)])
    assert res.exit_code == 0, res.output
    head = res.output.splitlines()[1].split()
    assert head[head.index("layout") + 1] == "tp_nodes"
    assert "# warning: 1 listed option(s) split a tensor-parallel group over nodes" in res.output
    rows = {r["layout"]: r for r in json.loads(out.read_text())}
    assert rows["tp8-pp1-dp1-mb1"]["tp_nodes"] == 2 and "tp_span" in rows["tp8-pp1-dp1-mb1"]
    assert rows["tp4-pp1-dp2-mb1"]["tp_nodes"] == 1 and "tp_span" not in rows["tp4-pp1-dp2-mb1"]


def test_plan_shows_progress_on_a_terminal(tmp_path, monkeypatch):
    """A plan over many cluster sizes takes a while: a bar per cluster size on stderr, on a
    terminal only; the table is the same either way."""
    cand = _file(tmp_path, "c.yaml", {
        "tokens": "1B",
        "clusters": [{"topology": "dgx-h100", "nodes": [1, 2, 4], "gpu_hour_usd": 2}],
    })  # fmt: skip
    args = ["plan", "-w", "gpt-1.3b-ddp", "-c", cand]
    quiet = runner.invoke(cli, args)
    assert quiet.exit_code == 0, quiet.output
    monkeypatch.setattr(cli_base, "show_progress", lambda: True)
    shown = runner.invoke(cli, args)
    assert shown.exit_code == 0, shown.output
    assert "plan: 100%" in shown.stderr and "3/3" in shown.stderr
    assert shown.stdout == quiet.stdout and "plan:" not in quiet.stderr
