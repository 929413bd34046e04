"""``collsim step``, ``scale`` and ``plan`` on the bundled workloads, and bad workload files."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.training.workload import catalog_names, load_workload

runner = CliRunner()


@pytest.mark.parametrize("name", catalog_names())
def test_every_bundled_workload_steps(name, tmp_path):
    """On 8 nodes, or on the fewest (8-GPU) nodes that hold one replica of the layout."""
    par = load_workload(name).parallel
    nodes = max(8, -(-par.tp * par.cp * par.pp // 8))
    out = tmp_path / "s.json"
    res = runner.invoke(
        cli, ["step", "-w", name, "-t", "selene", "--nodes", str(nodes), "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert {"step_time_s", "tflops_per_gpu", "mfu", "breakdown", "memory_gb_per_gpu"} <= set(data)
    assert data["step_time_s"] == pytest.approx(sum(data["breakdown"].values()))
    assert 0 < data["mfu"] < 1


def test_step_with_measured_times_reports_the_error(tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text("step,step_time_s\n1,13.0\n2,14.5\n")
    out = tmp_path / "s.json"
    res = runner.invoke(
        cli, ["step", "-w", "gpt3-175b", "-t", "selene", "--nodes", "8", "--measured", str(csv),
              "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "error" in res.output
    data = json.loads(out.read_text())
    assert data["measured_step_time_s"] == pytest.approx(13.75)
    assert data["error"] == pytest.approx((data["step_time_s"] - 13.75) / 13.75)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"1,2.0\n2,2.1\n3,2.2\n", "line 1: 2 columns but no step_time_s header"),
        (b"\xff\xfe2\x00.\x001\x00", "not a UTF-8 text"),
        (b"gpu_efficiency_is_not_here\n", "not a number"),
    ],
)
def test_measured_times_are_never_guessed(tmp_path, content, expected):
    """A header-less file with an iteration column was read as step times of 1, 2, 3 s
    ('measured: 2 s'); a UTF-16 file was a traceback. A spreadsheet's UTF-8 byte-order mark
    before the header is fine."""
    bad = tmp_path / "m.csv"
    bad.write_bytes(content)
    args = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--measured", str(bad)]
    res = runner.invoke(cli, args)
    assert res.exit_code == 2 and expected in res.output, res.output
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffstep_time_s\n2.0\n2.2\n".encode())
    res = runner.invoke(cli, [*args[:-1], str(bom)])
    assert res.exit_code == 0 and "measured 2.1" in res.output.replace(":", ""), res.output


def test_a_boolean_gpu_efficiency_is_refused(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text('{"gpu_efficiency": true}')
    res = runner.invoke(
        cli, ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--profile", str(profile)]
    )
    assert res.exit_code == 2 and "gpu_efficiency" in res.output and "true" in res.output.lower()


def test_step_with_profile_efficiency(tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"gpu_efficiency": 0.5, "base_latency_s": 5e-6}))
    res = runner.invoke(
        cli, ["step", "-w", "gpt3-175b", "-t", "selene", "--nodes", "8", "--profile", str(prof)]
    )
    assert res.exit_code == 0, res.output
    assert "efficiency 0.500" in res.output


def test_scale_prints_the_fit_and_plots(tmp_path):
    png = tmp_path / "scale.png"
    res = runner.invoke(
        cli, ["scale", "-w", "gpt-1.3b-ddp", "-t", "selene", "--nodes", "1,2,4,8",
              "--plot", str(png)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Amdahl fit" in res.output and png.exists()
    res = runner.invoke(
        cli, ["scale", "-w", "gpt-1.3b-ddp", "-t", "selene", "--nodes", "1,2,4", "--mode", "weak"]
    )
    assert res.exit_code == 0 and "Gustafson" in res.output


def test_scale_marks_points_that_do_not_fit_in_memory(tmp_path):
    """gpt-1.3b DDP needs about 54 GB a GPU: on 40 GiB (42.9 GB) A100s every point is flagged,
    in the table, a warning and the JSON (the curve printed as if it ran)."""
    out = tmp_path / "s.json"
    args = ["scale", "-w", "gpt-1.3b-ddp", "--nodes", "1,2", "--json", str(out)]
    res = runner.invoke(cli, [*args, "-t", "dgx-a100"])
    assert res.exit_code == 0, res.output
    assert "WARNING: 2 points (fits: NO) exceed the GPU's 42.9 GB" in res.output
    points = json.loads(out.read_text())["points"]
    assert [p["fits_in_memory"] for p in points] == [False, False]
    assert all(p["memory_gb_per_gpu"] > 42.9 for p in points)
    res = runner.invoke(cli, [*args, "-t", "dgx-h100"])
    assert res.exit_code == 0 and "WARNING" not in res.output
    assert all(p["fits_in_memory"] for p in json.loads(out.read_text())["points"])


def test_plan_ranks_and_discards(tmp_path):
    cand = tmp_path / "c.yaml"
    cand.write_text(
        yaml.safe_dump(
            {
                "tokens": "10B",
                "clusters": [
                    {"topology": "dgx-a100", "nodes": [2, 4], "gpu_hour_usd": 1.5},
                    {"topology": "dgx-h100", "nodes": 2, "gpu_hour_usd": 3.0},
                ],
                "search": {"tp": [1, 2, 8], "pp": [1, 2], "zero": [0, 1]},
            }
        )
    )
    png, out = tmp_path / "p.png", tmp_path / "p.json"
    res = runner.invoke(
        cli, ["plan", "-w", "gpt-1.3b-ddp", "-c", str(cand), "--plot", str(png), "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert len(rows) == 3 and any(r["pareto"] for r in rows)
    hours = [r["days"] for r in rows]
    assert hours == sorted(hours)
    assert png.exists()


def _write(tmp_path, data):
    path = tmp_path / "w.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


GOOD = load_workload("gpt3-175b").model_dump()


def _good(**changes):
    data = json.loads(json.dumps(GOOD))
    data["model"].pop("kind")
    for k, v in changes.items():
        section, _, key = k.partition("__")
        if key:
            data[section][key] = v
        else:
            data[section] = v
    return data


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (_good(model__layrs=4), "field 'model.layrs': unknown key; did you mean 'layers'?"),
        (_good(model__hidden=-1), "field 'model.hidden'"),
        (_good(model__heads=7), "multiple of heads"),
        (_good(parallel__tp="eight"), "field 'parallel.tp'"),
        (_good(recompute="sometimes"), "field 'recompute'"),
        (_good(global_batch=63, micro_batch=2), "multiple of micro_batch"),
        (_good(dtype="int4"), "field 'dtype'"),
        (_good(parallel__virtual_stages=2, parallel__schedule="1f1b"), "needs schedule"),
        (_good(trainng={}), "unknown key; did you mean 'training'?"),
        (_good(training__bucket="25 furlongs"), "field 'training.bucket'"),
        ({"name": "x", "model": {"kind": "cnn"}, "global_batch": 1}, "unknown model kind"),
        ("name: [unclosed\n", "malformed YAML"),
        ("- just\n- a list\n", "must be a mapping"),
    ],
)
def test_bad_workload_files_give_one_line_exit_2(tmp_path, data, needle):
    path = _write(tmp_path, data)
    res = runner.invoke(cli, ["step", "-w", str(path), "-t", "selene", "--nodes", "8"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], res.output
    assert needle in lines[0], lines[0]


def test_layout_errors_name_the_field(tmp_path):
    path = _write(tmp_path, _good(parallel__tp=16))
    res = runner.invoke(cli, ["step", "-w", str(path), "-t", "selene", "--nodes", "8"])
    assert res.exit_code == 2 and "parallel" in res.output
    res = runner.invoke(cli, ["step", "-w", "no-such-workload", "-t", "selene"])
    assert res.exit_code == 2 and "no workload named" in res.output
