"""Low-precision recipes in the step model: only the linear layers run at the FP8/FP4 rate, the
quantisation kernels cost HBM traffic, recipes must fit the data type (hand-computed)."""

from __future__ import annotations

import copy

import pytest

from collsim.errors import CollsimError
from collsim.topology.loader import topology_from_dict
from collsim.training.precision import (
    CAST_BYTES_PER_ELEMENT,
    HIGH_PRECISION_LAYER_SHARE,
    cast_elements_per_token,
    linear_flops_per_s,
)
from collsim.training.workload import workload_from_dict
from tests.training._step_fixtures import GPU, evaluate, gpt

R16, R8, R4 = 100e12, 200e12, 400e12
MEM_BW = 2e12


def _topology():
    gpu = copy.deepcopy(GPU)
    gpu["peak_tflops"] = {"bf16": 100, "fp8": 200, "fp4": 400}
    gpu["matmul_tflops"] = {"bf16": 100, "fp8": 200, "fp4": 400}
    devices = [{"name": f"g{i}", "kind": "gpu", "node": i, "forwards": True} for i in range(2)]
    links = [{"a": "g0", "b": "g1", "kind": "nvlink", "bandwidth": "25GB/s", "latency": "2us"}]
    return topology_from_dict({"name": "pair", "gpu": gpu, "devices": devices, "links": links})


def _compute(**changes):
    data = gpt(compute={"efficiency": 1.0}, training={"optimizer": "none"}, **changes)
    return evaluate(_topology(), data, 2).breakdown["compute"]


L, S, H, B, M = 8, 1024, 1024, 2, 8  # gpt(): 8 layers, h 1024, s 1024; micro 2, 32 / (2 x 2)
LINEAR = 24 * S * H * H  # QKV 6 s h^2 + projection 2 s h^2 + 4h MLP 16 s h^2, one sequence
CAST_ELEMENTS = 16 * H  # forward 3h + ffn, backward 3h + 2h + ffn (tp 1, 4h MLP), per token


def test_fp8_runs_only_the_linear_layers_faster_and_pays_its_casts():
    gemm_gain = 3 * B * L * LINEAR * (1 / R16 - 1 / R8)  # fwd + dgrad + wgrad, per micro-batch
    casts = L * B * S * CAST_ELEMENTS * CAST_BYTES_PER_ELEMENT["fp8"] / MEM_BW
    expected = M * (gemm_gain - casts)
    assert _compute() - _compute(dtype="fp8") == pytest.approx(expected, rel=1e-9)


def test_current_scaling_reads_each_input_once_more_than_delayed():
    extra = 2.0 * L * B * S * CAST_ELEMENTS / MEM_BW * M  # 6 - 4 bytes an element
    got = _compute(dtype="fp8", precision="fp8-cs") - _compute(dtype="fp8", precision="fp8")
    assert got == pytest.approx(extra, rel=1e-9)


def test_nvfp4_keeps_a_share_of_the_linear_layers_in_bf16():
    share = HIGH_PRECISION_LAYER_SHARE["nvfp4"]
    assert linear_flops_per_s("nvfp4", R4, R16) == pytest.approx(
        1 / ((1 - share) / R4 + share / R16)
    )
    assert linear_flops_per_s("fp8", R8, R16) == R8
    fp4 = _compute(dtype="fp4")
    fp8 = _compute(dtype="fp8")
    rate = linear_flops_per_s("nvfp4", R4, R16)
    casts = L * B * S * CAST_ELEMENTS / MEM_BW * M
    expected = M * 3 * B * L * LINEAR * (1 / R8 - 1 / rate) - casts * (
        CAST_BYTES_PER_ELEMENT["nvfp4"] - CAST_BYTES_PER_ELEMENT["fp8"]
    )
    assert fp8 - fp4 == pytest.approx(expected, rel=1e-9)


def test_sequence_parallel_casts_the_local_shard():
    fwd, bwd = cast_elements_per_token(1024, 256, 4096, True, 4, True)
    assert fwd == pytest.approx(2 * 256 + 256 + 1024)
    assert bwd == pytest.approx((1024 + 512) / 4 + 2 * 256 + 2 * 4096 / 4)


@pytest.mark.parametrize(
    ("dtype", "precision", "needle"),
    [
        ("bf16", "fp8-cs", "runs its GEMMs in fp8"),
        ("fp8", "nvfp4", "runs its GEMMs in fp4"),
        ("fp8", "bf16", "must equal dtype"),
    ],
)
def test_a_recipe_must_fit_the_data_type(dtype, precision, needle):
    with pytest.raises(CollsimError, match=needle):
        workload_from_dict(gpt(dtype=dtype, precision=precision))


def test_fp8_on_a_gpu_without_fp8_names_the_dtype():
    from collsim.topology.loader import load_topology
    from collsim.training.comm import make_timer
    from collsim.training.step import StepModel

    topo = load_topology("dgx-a100", nodes=1)
    w = workload_from_dict(gpt(dtype="fp8", parallel={"tp": 8}))
    with pytest.raises(CollsimError) as err:
        StepModel(topo, make_timer("analytic", topo)).evaluate(w)
    assert err.value.field == "dtype" and "fp8" in str(err.value)


def test_fp4_accepts_its_usual_names():
    assert workload_from_dict(gpt(dtype="nvfp4")).dtype == "fp4"
    assert workload_from_dict(gpt(dtype="fp4")).recipe == "nvfp4"
    assert workload_from_dict(gpt(dtype="fp8")).recipe == "fp8"
    assert workload_from_dict(gpt()).recipe == "bf16"


def test_breakdown_parts_of_an_fp8_step_sum_to_its_compute():
    data = gpt(compute={"efficiency": 1.0}, training={"optimizer": "none"}, dtype="fp8")
    res = evaluate(_topology(), data, 2)
    parts = res.details["compute_parts_s"]
    assert sum(parts.values()) == pytest.approx(res.breakdown["compute"], rel=1e-12)
    casts = L * B * S * CAST_ELEMENTS * CAST_BYTES_PER_ELEMENT["fp8"] / MEM_BW * M
    assert parts["quantisation"] == pytest.approx(casts, rel=1e-9)
    core = 4 * S * S * H  # the attention core of one sequence and layer, at the BF16 rate
    assert parts["attention"] == pytest.approx(M * 3 * B * L * core / R16, rel=1e-9)
    assert parts["gemm"] == pytest.approx(M * 3 * B * L * LINEAR / R8, rel=1e-9)
