"""Bad inputs a third review found taking a traceback, printing NaN or inf as a result, running
for hours, or ignored without a word (each was one)."""

from __future__ import annotations

import gzip
import json

import pytest
import yaml

from collsim.cli import main
from collsim.errors import CollsimError
from collsim.io import yaml_load
from collsim.model.params import DEFAULT_PARAMS, ModelParams
from tests.test_bad_inputs_review import _error  # one line, exit code 2, no traceback

STEP = ["step", "-w", "gpt-1.3b-ddp", "-t", "h100-4gpu-ib", "--nodes", "1"]


def _ok(args: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code in (0, None)


def _read(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def _write(tmp_path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"bandwidth_efficiency": 0.5}, "'bandwidth_efficiency'"),  # TypeError before
        ({"size_factors": 5}, "'size_factors'"),
        ({"size_factors": [5]}, "'size_factors[0]'"),
        ({"size_factors": [[1000, float("inf")]]}, "'size_factors[0]'"),
        ({"params": 5}, "'params'"),
        ({"protocols": [1, 2]}, "'protocols'"),  # AttributeError before
        (
            {"protocols": {"Simple": {"bandwidth_fraction": -1, "hop_latency_s": [0, 0, 0]}}},
            "'protocols.Simple.bandwidth_fraction'",
        ),
        ({"base_latency_s": 1e300}, "'base_latency_s'"),  # a step of 1e302 s before
        ({"bandwidth_efficiency": [1e6, 1e6, 1e6]}, "'bandwidth_efficiency'"),
        ({"tree_correction": 1}, "'tree_correction'"),
        ({"bandwidth_efficency": [1, 1, 1]}, "'bandwidth_efficency'"),
    ],
)
def test_a_raw_parameter_profile_is_checked_field_by_field(params, field, tmp_path, capsys):
    err = _error([*STEP, "--profile", _write(tmp_path, "p.yaml", params)], capsys)
    assert field in err and "p.yaml" in err


def test_raw_parameters_round_trip_and_keep_their_ranges():
    assert ModelParams.from_dict(DEFAULT_PARAMS.to_dict()) == DEFAULT_PARAMS
    with pytest.raises(CollsimError) as info:
        ModelParams.from_dict({"reduce_efficiency": 0})
    assert info.value.field == "reduce_efficiency"


def test_yaml_reads_scientific_numbers_as_numbers():
    """PyYAML (YAML 1.1) read 1e6 and 5e0 as strings, so a profile's size_efficiency: [[1e6,
    1.0]] was refused as 'expected a number (value: '1e6')' while topologies took 8e10."""
    data = yaml_load("a: 1e6\nb: 5e-06\nc: -2E3\nd: 1e\ne: name1e6\nf: 10")
    assert data == {"a": 1e6, "b": 5e-06, "c": -2000.0, "d": "1e", "e": "name1e6", "f": 10}


def test_a_fitted_profile_named_json_is_json_and_every_command_reads_it(tmp_path, capsys):
    """``calibrate fit -o fit.json`` wrote YAML into it, which step/scale/plan then refused."""
    from collsim.model.profile import datasheet_profile
    from collsim.topology.loader import load_topology

    topo = load_topology("h100-4gpu-ib", nodes=1)
    path = tmp_path / "fit.json"
    datasheet_profile(topo, base_latency_us=5.0).save(path)
    assert json.loads(path.read_text())["collsim_profile"] == 2
    _ok([*STEP, "--profile", str(path)])
    assert "step" in capsys.readouterr().out
    path.write_text(datasheet_profile(topo).to_yaml())  # an older fit's YAML under .json
    _ok([*STEP, "--profile", str(path)])


def test_an_unknown_key_in_a_mapping_of_models_gets_its_hint(tmp_path, capsys):
    """A typo under link_classes.nvlink listed no keys ('expected one of: ')."""
    from collsim.model.profile import datasheet_profile
    from collsim.topology.loader import load_topology

    doc = datasheet_profile(load_topology("h100-4gpu-ib", nodes=1)).to_dict()
    doc["link_classes"] = {"nvlink": {"bandwidth_efficiency": 0.9, "latency_scal": 1.5}}
    err = _error([*STEP, "--profile", _write(tmp_path, "p.yaml", doc)], capsys)
    assert "'link_classes.nvlink.latency_scal'" in err and "did you mean 'latency_scale'" in err


def test_non_finite_step_inputs_are_refused_not_printed_as_nan(tmp_path, capsys):
    wl = _read("workloads/gpt-1.3b-ddp.yaml")
    wl["compute"] = {**wl.get("compute", {}), "elementwise_traffic": 1e300}
    err = _error(["step", "-w", _write(tmp_path, "w.yaml", wl), "-t", "dgx-h100"], capsys)
    assert "'compute.elementwise_traffic'" in err
    topo = _read("topologies/h100-4gpu-ib.yaml")
    topo["gpu"]["peak_tflops"]["bf16"] = 1e300
    err = _error(["topo", "show", _write(tmp_path, "t.yaml", topo)], capsys)
    assert "'gpu.peak_tflops.bf16'" in err


def test_a_job_that_never_completes_is_said_so_not_inf(tmp_path, capsys):
    wl = _read("workloads/gpt-1.3b-ddp.yaml")
    wl["resilience"] = {
        "node_mtbf_hours": 0.01,
        "storage_bandwidth": "1kB/s",
        "restart_time": "10min",
    }
    path = _write(tmp_path, "w.yaml", wl)
    err = _error(["step", "-w", path, "-t", "dgx-h100", "--nodes", "1"], capsys)
    assert "never completes" in err and "w.yaml" in err and "'resilience'" in err


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (
            ["topo", "show", "dgx-h100", "--nodes", "1", "--gpus-per-node", "100000"],
            "'--gpus-per-node'",
        ),  # hours of routing before
        (
            ["calibrate", "run", "--dry-run", "--out", "{tmp}/o", "--launcher-args", "'open"],
            "'--launcher-args'",
        ),  # a shlex traceback before
        (
            ["calibrate", "run", "--dry-run", "--out", "{tmp}/o", "--launcher-args", "--bind-to x"],
            "'--launcher-args'",
        ),  # dropped under --launcher local before
        (["calibrate", "run", "--dry-run", "--out", "{tmp}/o", "--nodes", "0"], "'--nodes'"),
    ],
)
def test_flags_out_of_range(args, field, tmp_path, capsys):
    err = _error([a.replace("{tmp}", str(tmp_path)) for a in args], capsys)
    assert field in err


def test_an_empty_output_name_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulate", "all_reduce", "-t", "dgx-h100", "--engine", "analytic", "--json", ""])
    assert info.value.code == 2
    assert "--json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (
            {"fabric": {"kind": "dragonfly", "routers_per_group": 100000}},
            "'fabric.routers_per_group'",
        ),
        (
            {"fabric": {"kind": "fat_tree", "radix": 64, "oversubscription": 1000}},
            "'fabric.oversubscription'",
        ),  # silently 63:1 before
        ({"gpu": {"memory": 80}}, "'gpu.memory'"),  # 80 bytes
    ],
)
def test_topology_sizes_beyond_physical_are_refused(patch, field, tmp_path, capsys):
    topo = _read("topologies/h100-4gpu-ib.yaml")
    for key, value in patch.items():
        topo[key] = {**topo.get(key, {}), **value}
    err = _error(["topo", "show", _write(tmp_path, "t.yaml", topo)], capsys)
    assert field in err


def test_huge_plan_searches_and_straggler_draws_are_refused_up_front(tmp_path, capsys):
    cand = {
        "tokens": "1T",
        "clusters": [{"topology": "dgx-h100", "nodes": 2, "gpu_hour_usd": 2}],
        "search": {
            "tp": [1, 2, 4, 8, 16],
            "pp": [1, 2, 4, 8, 16],
            "micro_batch": [1, 2, 4, 8],
            "cp": [1, 2, 4, 8],
            "virtual_stages": [1, 2, 3, 4],
            "zero": [0, 1, 2, 3],
            "recompute": ["none", "full"],
            "sequence_parallel": [True, False],
        },
    }

    err = _error(["plan", "-w", "gpt-1.3b-ddp", "-c", _write(tmp_path, "c.yaml", cand)], capsys)
    assert "'search'" in err and "c.yaml" in err and "25,600 layouts" in err
    wl = _read("workloads/gpt-1.3b-ddp.yaml")
    wl.setdefault("training", {})["stragglers"] = {"cv": 0.1, "samples": 10**9}
    err = _error(["step", "-w", _write(tmp_path, "w.yaml", wl), "-t", "dgx-h100"], capsys)
    assert "'training.stragglers.samples'" in err


def test_nccl_env_given_twice_is_refused_and_crossed_channel_bounds_noted(capsys):
    log = "data/nccl-tests/logs/h100-snellius-1n4g-all_gather-1.txt"
    base = ["validate", log, "-t", "h100-4gpu-ib", "--summary"]
    err = _error([*base, "--nccl-env", "NCCL_ALGO=Ring", "--nccl-env", "NCCL_ALGO=Tree"], capsys)
    assert "given twice" in err
    _ok([*base, "--nccl-env", "NCCL_MIN_NCHANNELS=8", "--nccl-env", "NCCL_MAX_NCHANNELS=2"])
    assert "the minimum wins" in capsys.readouterr().out


def test_validate_says_what_it_modelled_and_which_gpu(capsys, tmp_path):
    log = "data/nccl-tests/logs/h100-snellius-1n4g-all_gather-1.txt"
    out_json = tmp_path / "v.json"
    _ok(
        [
            "validate",
            log,
            "-t",
            "h100-4gpu-ib",
            "--nodes",
            "4",
            "--summary",
            "--json",
            str(out_json),
        ]
    )
    out = capsys.readouterr().out
    assert "the log ran on 1 node; modelled on 4 nodes of 1 GPU" in out
    assert "(4 nodes)" in out and json.loads(out_json.read_text())["logs"][0]["nodes"] == 4
    _ok(["validate", log, "-t", "localhost-gloo", "--summary"])
    assert "ran on NVIDIA H100, but topology localhost-gloo" in capsys.readouterr().out
    _ok(["validate", log, "-t", "h100-4gpu-ib", "--summary", "--ranks", "3"])
    assert "the log records ranks = 4, which wins over --ranks 3" in capsys.readouterr().out


def test_compressed_logs_and_folders_say_what_they_are(tmp_path, capsys):
    packed = tmp_path / "log.txt.gz"
    packed.write_bytes(gzip.compress(b"# nccl-tests\n"))
    err = _error(["validate", str(packed), "-t", "dgx-h100"], capsys)
    assert "gzip-compressed" in err
    err = _error(["topo", "show", str(tmp_path)], capsys)
    assert "a folder, not a topology file" in err


def test_a_partition_with_nothing_left_to_forward_names_the_gpus(tmp_path, capsys):
    graph = {
        "name": "one-switch",
        "gpu": {
            "model": "H100",
            "peak_tflops": {"bf16": 989},
            "memory": "80GB",
            "memory_bandwidth": "3.35TB/s",
        },
        "devices": [
            {"name": "g0", "kind": "gpu", "node": 0},
            {"name": "g1", "kind": "gpu", "node": 0},
            {"name": "sw", "kind": "switch"},
        ],
        "links": [
            {"a": "g0", "b": "sw", "kind": "nvlink", "bandwidth": "450GB/s", "latency": "1us"},
            {"a": "g1", "b": "sw", "kind": "nvlink", "bandwidth": "450GB/s", "latency": "1us"},
        ],
        "faults": [{"switch": "sw", "fail": True}],
    }
    err = _error(["topo", "show", _write(tmp_path, "g.yaml", graph)], capsys)
    assert "1 GPU(s) unreachable" in err and "g1" in err


def test_a_sweep_says_how_many_rows_failed(tmp_path, capsys):
    spec = {
        "name": "t",
        "topologies": ["dgx-h100"],
        "nodes": [1],
        "collectives": ["all_reduce"],
        "algorithms": ["ring"],
        "sizes": {"min": 8, "max": 1024, "factor": 4},
        "engines": ["analytic"],
        "steps": {"workloads": ["gpt-1.3b-ddp"], "layouts": [{"tp": 3}]},
    }
    _ok(["sweep", _write(tmp_path, "s.yaml", spec), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "1 row could not be computed" in err and "does not divide" in err
