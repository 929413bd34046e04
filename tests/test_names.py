"""Collective and data-type names (issue 26, item 6): every spelling users write works at every
entry point, through one normaliser each, and output prints the canonical names."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from collsim.cli import cli
from collsim.sweep import read_points
from tests.calibration.conftest import DEVICES, FOOTER, HEADER, ROWS

runner = CliRunner()
SMALL = ["-t", "rtx2080ti-2gpu-nop2p"]  # two GPUs: every run below is instant

COLLECTIVE_ALIASES = [
    ("allreduce", "all_reduce"),
    ("all-reduce", "all_reduce"),
    ("AllReduce", "all_reduce"),
    ("ALL_REDUCE", "all_reduce"),
    ("all_reduce_perf", "all_reduce"),
    ("all_reduce_perf_mpi", "all_reduce"),
    ("allgather", "all_gather"),
    ("all_gather_perf", "all_gather"),
    ("reduce-scatter", "reduce_scatter"),
    ("reduce_scatter_perf", "reduce_scatter"),
    ("broadcast_perf", "broadcast"),
    ("bcast", "broadcast"),
    ("reduce_perf", "reduce"),
    ("all_to_all", "alltoall"),
    ("all-to-all", "alltoall"),
    ("AllToAll", "alltoall"),
    ("alltoall", "alltoall"),
    ("alltoall_perf", "alltoall"),
    ("sendrecv_perf", "sendrecv"),
    ("send_recv", "sendrecv"),
]

# nccl-tests' -d names, NCCL's enum aliases, PyTorch's and the short forms -> nccl-tests' name
DTYPE_ALIASES = [
    ("int8", "int8"), ("char", "int8"), ("ncclChar", "int8"),
    ("uint8", "uint8"), ("u8", "uint8"),
    ("int32", "int32"), ("int", "int32"), ("ncclInt", "int32"),
    ("uint32", "uint32"),
    ("int64", "int64"), ("torch.int64", "int64"),
    ("uint64", "uint64"),
    ("half", "half"), ("float16", "half"), ("fp16", "half"), ("FP16", "half"),
    ("float", "float"), ("float32", "float"), ("fp32", "float"), ("ncclFloat32", "float"),
    ("double", "double"), ("float64", "double"), ("fp64", "double"),
    ("bfloat16", "bfloat16"), ("bf16", "bfloat16"), ("BF16", "bfloat16"),
    ("torch.bfloat16", "bfloat16"),
    ("f8e4m3", "f8e4m3"), ("fp8", "f8e4m3"), ("e4m3", "f8e4m3"), ("float8_e4m3fn", "f8e4m3"),
    ("f8e5m2", "f8e5m2"), ("e5m2", "f8e5m2"), ("fp8-e5m2", "f8e5m2"),
]  # fmt: skip
BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2,
         "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}  # fmt: skip
NOT_MODELLED = ["gather_perf", "scatter_perf", "hypercube_perf", "alltoallv"]


def _ok(args: list[str]) -> str:
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    return result.output


def _one_line_error(args: list[str], *words: str) -> str:
    result = runner.invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for word in words:
        assert word in result.output, (word, result.output)
    return result.output


# --- collectives --------------------------------------------------------------------------------


@pytest.mark.parametrize(("alias", "name"), COLLECTIVE_ALIASES)
def test_simulate_and_tune_take_every_spelling_of_a_collective(alias, name):
    sim = ["-b", "1K", "-e", "1K", "--engine", "analytic", *SMALL]
    out = _ok(["simulate", alias, *sim])
    assert f"# collsim: {name} on rtx2080ti-2gpu-nop2p" in out
    assert out == _ok(["simulate", name, *sim])
    tuned = _ok(["tune", alias, "-b", "1K", "-e", "4K", *SMALL])
    assert tuned.startswith(f"# {name} on rtx2080ti-2gpu-nop2p")


@pytest.mark.parametrize(("alias", "name"), [COLLECTIVE_ALIASES[i] for i in (4, 13, 18)])
def test_stragglers_takes_nccl_tests_names(alias, name):
    out = _ok(["stragglers", alias, "-b", "1K", "-n", "2", *SMALL])
    assert out.startswith(f"# {name} on rtx2080ti-2gpu-nop2p")


def test_help_lists_the_canonical_names():
    usage = "".join(_ok(["simulate", "--help"]).split())  # click wraps the usage line
    assert "{all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|sendrecv}" in usage
    assert "{all_reduce|" in "".join(_ok(["tune", "--help"]).split())


@pytest.mark.parametrize("command", ["simulate", "tune", "stragglers"])
def test_an_unknown_collective_says_what_was_meant_and_what_is_supported(command):
    _one_line_error([command, "allreduse", *SMALL], "field 'collective'", "'allreduse'",
                    "did you mean 'all_reduce'?", "supported: all_reduce, ")  # fmt: skip


@pytest.mark.parametrize("binary", NOT_MODELLED)
def test_nccl_tests_collectives_collsim_does_not_model_say_so(binary):
    what = binary.removesuffix("_perf")
    _one_line_error(["simulate", binary, *SMALL], f"{what} (nccl-tests' {what}_perf) is not "
                    "supported by collsim", "sendrecv", repr(binary))  # fmt: skip
    _one_line_error(["calibrate", "run", "-c", f"all_reduce,{binary}", "--out", "x", "--dry-run"],
                    "'--collectives'", "not supported by collsim")  # fmt: skip


def test_calibrate_run_takes_nccl_tests_names_and_runs_their_binaries(tmp_path):
    out = _ok(["calibrate", "run", "-c", "allreduce,all_to_all,sendrecv_perf,AllGather",
               "--out", str(tmp_path), "--dry-run"])  # fmt: skip
    binaries = [next(w for w in line.split() if "=" not in w) for line in out.splitlines()]
    assert binaries == ["all_reduce_perf", "alltoall_perf", "sendrecv_perf", "all_gather_perf"]


def test_read_and_validate_take_any_spelling_of_the_collective_hint(tmp_path):
    """A log that does not name its collective: --collective takes any spelling."""
    log = tmp_path / "mystery.txt"
    log.write_text(f"{DEVICES}#\n{HEADER}" + "\n".join(ROWS) + "\n" + FOOTER)
    for alias in ("allreduce", "all-reduce", "all_reduce_perf"):
        out = _ok(["calibrate", "read", str(log), "--collective", alias])
        assert f"# {log}: all_reduce on 4 ranks" in out
        out = _ok(["validate", str(log), "-t", "dgx-h100", "--collective", alias, "--summary"])
        assert "all_reduce on 4 ranks" in out
    _one_line_error(["calibrate", "read", str(log), "--collective", "gather_perf"],
                    "'--collective'", "not supported by collsim")  # fmt: skip


def _sweep(tmp_path, **spec):
    path = tmp_path / "spec.yaml"
    base = {"topologies": ["rtx2080ti-2gpu-nop2p"], "sizes": ["1K"], "algorithms": ["auto"]}
    path.write_text(yaml.safe_dump({**base, **spec}))
    return path


def test_a_sweep_spec_takes_any_spelling_and_records_canonical_names(tmp_path):
    names = ["allreduce", "all_to_all", "sendrecv_perf", "ReduceScatter"]
    spec = _sweep(tmp_path, collectives=names, dtype="bf16")
    _ok(["sweep", str(spec), "-o", str(tmp_path / "out")])
    rows = read_points(tmp_path / "out")
    assert sorted(r["collective"] for r in rows) == ["all_reduce", "alltoall", "reduce_scatter",
                                                     "sendrecv"]  # fmt: skip
    assert {r["dtype"] for r in rows} == {"bfloat16"}
    twice = _sweep(tmp_path, collectives=["all_reduce", "allreduce"])
    _one_line_error(["sweep", str(twice), "-o", str(tmp_path / "o2")], "'collectives.1'",
                    "names all_reduce twice")  # fmt: skip
    gather = _sweep(tmp_path, collectives=["gather_perf"])
    _one_line_error(["sweep", str(gather), "-o", str(tmp_path / "o3")], "'collectives.0'",
                    "not supported by collsim")  # fmt: skip


def test_measured_rows_match_by_any_spelling(tmp_path):
    from collsim.report.figures import FigureWriter
    from collsim.report.sweep_report import _measured_section

    coll = [{"collective": "all_reduce", "size_bytes": "1024", "bytes": "1024", "error": "",
             "algorithm": "ring", "time_us": "10", "topology": "t", "nodes": "1"}]  # fmt: skip
    for name in ("allreduce", "all_reduce_perf", "AllReduce"):
        measured = [{"collective": name, "size_bytes": "1024", "time_us": "12"}]
        assert "match no predicted case" not in str(
            _measured_section(coll, measured, FigureWriter(tmp_path, jobs=1))
        )


# --- data types ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("alias", "name"), DTYPE_ALIASES)
def test_simulate_takes_every_spelling_of_a_type_and_prints_nccl_tests_name(alias, name):
    args = ["simulate", "all_reduce", "-b", "1K", "-e", "1K", "--engine", "analytic", *SMALL]
    out = _ok([*args, "-d", alias])
    (row,) = [line.split() for line in out.splitlines() if line.startswith("        1024")]
    assert row[1:3] == [str(1024 // BYTES[name]), name]
    assert out == _ok([*args, "-d", name])


@pytest.mark.parametrize(("alias", "name"), DTYPE_ALIASES)
def test_tune_and_calibrate_run_take_every_spelling_of_a_type(alias, name, tmp_path):
    tune = ["tune", "all_gather", "-b", "1", "-e", "64", *SMALL]
    assert _ok([*tune, "-d", alias]) == _ok([*tune, "-d", name])
    # nccl-tests is handed its own name: it runs float for one it does not know
    run = _ok(["calibrate", "run", "-d", alias, "--out", str(tmp_path), "--dry-run"])
    assert f" -d {name} " in run


@pytest.mark.parametrize(("alias", "name"), [("bf16", "bfloat16"), ("float16", "half"),
                                             ("fp32", "float"), ("char", "int8")])  # fmt: skip
def test_the_torch_runner_takes_aliases_of_the_types_torch_runs(alias, name, tmp_path):
    from collsim.calibration.torchbench import parse_args

    out = _ok(["calibrate", "run", "--runner", "torch", "--launcher", "torchrun", "-d", alias,
               "--out", str(tmp_path), "--dry-run"])  # fmt: skip
    assert f" -d {name} " in out
    assert parse_args(["-d", alias, "--out", str(tmp_path)]).datatype == name


def test_types_a_runner_or_command_cannot_use_are_one_line_errors(tmp_path):
    _one_line_error(["calibrate", "run", "--runner", "torch", "-d", "fp8", "--out", str(tmp_path)],
                    "'--datatype'", "torch runner", "f8e4m3 is not supported here")  # fmt: skip
    _one_line_error(["simulate", "all_reduce", "-d", "tf32", *SMALL], "'--datatype'",
                    "tf32 is not supported here", "bfloat16")  # fmt: skip
    _one_line_error(["tune", "all_reduce", "-d", "bfloat61", *SMALL], "'--datatype'",
                    "did you mean 'bfloat16'?")  # fmt: skip
    spec = _sweep(tmp_path, collectives=["all_reduce"], dtype="fp13")
    _one_line_error(["sweep", str(spec), "-o", str(tmp_path / "o")], "field 'dtype'", "fp13")


def test_stragglers_takes_a_type_alias():
    args = ["stragglers", "all_gather", "-b", "1K", "-n", "2", *SMALL]
    assert _ok([*args, "-d", "bf16"]) == _ok([*args, "-d", "bfloat16"])


def _workload(tmp_path, dtype: str, grad: str) -> str:
    text = (
        "name: tiny\nmodel: {layers: 2, hidden: 256, heads: 4, vocab: 1000, seq_len: 128}\n"
        f"global_batch: 16\nmicro_batch: 2\ndtype: {dtype}\n"
        f"training: {{grad_reduce_dtype: {grad}}}\n"
    )
    path = tmp_path / f"w-{dtype}-{grad}.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("dtype", "grad", "same_as"),
    [("bfloat16", "float32", ("bf16", "fp32")), ("BF16", "float", ("bf16", "fp32")),
     ("float16", "half", ("fp16", "fp16")), ("e4m3", "torch.bfloat16", ("fp8", "bf16")),
     ("float32", "fp16", ("fp32", "fp16"))],
)  # fmt: skip
def test_a_workload_takes_any_spelling_of_its_types(tmp_path, dtype, grad, same_as):
    from collsim.training.workload import load_workload

    path = _workload(tmp_path, dtype, grad)
    w = load_workload(path)
    assert (w.dtype, w.training.grad_reduce_dtype) == same_as
    step = ["step", "-t", "dgx-h100", "--nodes", "1", "-w"]
    assert _ok([*step, path]) == _ok([*step, _workload(tmp_path, *same_as)])
    bad = _workload(tmp_path, "int8", "bf16")
    _one_line_error([*step, bad], "'dtype'", "not a training data type", "int8")
