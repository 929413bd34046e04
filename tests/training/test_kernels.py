"""Kernel times from shapes (collsim/training/kernels.py), checked on hand-computed cases: tile
and wave quantisation, the roofline's memory side, the backward's two GEMMs, a layer's GEMMs
against its FLOP count, and the CPU's kernel-launch floor in the step model."""

from __future__ import annotations

import math

import pytest

from collsim.model.params import HOST_LAUNCH_S
from collsim.topology.loader import load_topology
from collsim.training.comm import make_timer
from collsim.training.kernels import (
    KERNELS_PER_LAYER,
    Gemm,
    backward,
    gemm_efficiency,
    gemm_seconds,
    layer_gemms,
)
from collsim.training.step import StepModel
from collsim.training.transformer import layer_costs
from collsim.training.workload import workload_from_dict
from tests.training._step_fixtures import MOE, gpt

A100_SMS = 108


def test_full_waves_reach_the_best_rate_and_one_tile_more_starts_a_wave():
    # 108 tiles of 256 x 128 fill the A100's 108 SMs exactly: one full wave
    assert gemm_efficiency(256 * 12, 128 * 9, A100_SMS) == pytest.approx(1.0)
    # 4096 x 4096: 512 tiles of 256 x 128 (or 1024 of 128 x 128) -> 5 (10) waves of 108: 0.948
    assert gemm_efficiency(4096, 4096, A100_SMS) == pytest.approx(512 / 540)
    # 109 tiles' worth (one row of tiles more): a second wave with one tile; the best tile
    # shape does better than 109/216 but not better than one wave's worth of work
    eff = gemm_efficiency(256 * 12 + 1, 128 * 9, A100_SMS)
    assert eff < 0.85
    assert gemm_efficiency(4096, 4096, None) == 1.0  # no SM count: no quantisation


def test_a_skinny_gemm_is_bound_by_memory():
    rate, bw = 300e12, 1e12
    # 128 rows: 2 x 128 x 8192^2 FLOPs (97 us on 64 of the 108 SMs) but the 8192^2 weights
    # alone are 134 MB to read: 138 us at 1 TB/s
    thin = Gemm(128, 8192, 8192)
    assert gemm_seconds(thin, rate, bw, 2, A100_SMS) == pytest.approx(
        (128 * 8192 + 8192 * 8192 + 128 * 8192) * 2 / bw
    )
    big = Gemm(256 * 12, 128 * 9, 8192, count=3)  # one full wave, compute-bound
    assert gemm_seconds(big, rate, bw, 2, A100_SMS) == pytest.approx(big.flops / rate)


def test_the_backward_runs_both_gradients_at_the_forwards_flops():
    g = Gemm(4096, 1536, 12288)
    dx, dw = backward(g)
    assert (dx.m, dx.n, dx.k) == (4096, 12288, 1536)  # dX = dY W^T
    assert (dw.m, dw.n, dw.k) == (12288, 1536, 4096)  # dW = X^T dY
    assert dx.flops == dw.flops == g.flops


@pytest.mark.parametrize(("tp", "moe", "ep"), [(1, False, 1), (8, False, 1), (2, True, 4)])
def test_a_layers_gemms_are_its_linear_flops(tp, moe, ep):
    """The GEMMs listed per layer carry exactly the FLOPs the layer count gives its linear
    layers (forward FLOPs less the attention core), for dense and MoE layers alike."""
    w = workload_from_dict(gpt(model=dict(MOE)) if moe else gpt())
    m = w.model
    costs = layer_costs(m, tp=tp, sequence_parallel=False, recompute="none", elem_bytes=2,
                        moe=moe)  # fmt: skip
    # every EP rank's tokens reach this GPU's count / ep experts
    gemms = layer_gemms(m, tokens=m.seq_len, tp=tp, moe=moe, ep=ep)
    assert sum(g.flops for g in gemms) == pytest.approx(costs.fwd_flops - costs.attn_core_flops)


@pytest.fixture(scope="module")
def h100():
    topo = load_topology("dgx-h100", nodes=1)
    return StepModel(topo, make_timer("analytic", topo))


def test_narrow_tp8_gemms_lose_more_to_quantisation_than_wide_ones(h100):
    """The issue's systematic error: at TP8 and micro-batch 1 the per-GPU matrices are narrow
    and their partial waves cost a larger share than at TP1 with micro-batch 4: the GEMM time
    per FLOP is higher, not the single constant efficiency."""
    model = {"layers": 4, "hidden": 5120, "heads": 40, "vocab": 32000, "seq_len": 2048}

    def per_flop(tp, micro):
        w = workload_from_dict(gpt(model=model, global_batch=8 * micro, micro_batch=micro,
                                   parallel={"tp": tp, "pp": 1}))  # fmt: skip
        one = h100.one_layer(w, 8)
        costs = layer_costs(w.model, tp=tp, sequence_parallel=False, recompute="none",
                            elem_bytes=2)  # fmt: skip
        return one["gemm"] / (3 * micro * (costs.fwd_flops - costs.attn_core_flops))

    assert per_flop(8, 1) > 1.03 * per_flop(1, 4)


def test_a_tiny_layer_runs_at_the_cpus_launch_rate(h100):
    """A 256-wide layer's kernels take microseconds: the step waits for the CPU to launch its
    KERNELS_PER_LAYER kernels, HOST_LAUNCH_S each, forward and backward."""
    tiny = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128}
    w = workload_from_dict(gpt(model=tiny, global_batch=8, micro_batch=1))
    one = h100.one_layer(w, 8)
    assert one["launch"] > 0
    fwd, bwd = KERNELS_PER_LAYER
    floor = (fwd + bwd) * HOST_LAUNCH_S
    kernels = one["gemm"] + one["attention"] + one["memory_bound"] + one["launch"]
    assert kernels == pytest.approx(floor)


def test_dropless_routing_waits_for_the_busiest_ranks_tokens():
    """imbalance (dropless, capacity factor 1) scales the expert MLP's FLOPs and all-to-all
    bytes like padding does; padded buffers (capacity factor > 1) already bound the work."""
    from collsim.training.transformer import routing_imbalance

    even = workload_from_dict(gpt(model=dict(MOE)))
    skew = workload_from_dict(gpt(model=dict(MOE, experts={"count": 8, "top_k": 2,
                                                           "imbalance": 1.25})))  # fmt: skip
    padded = workload_from_dict(gpt(model=dict(MOE, experts={"count": 8, "top_k": 2,
                                                             "capacity_factor": 1.5,
                                                             "imbalance": 1.25})))  # fmt: skip

    def costs(w):
        return layer_costs(w.model, tp=1, sequence_parallel=False, recompute="none",
                           elem_bytes=2, moe=True)  # fmt: skip

    base, more, pad = costs(even), costs(skew), costs(padded)
    assert more.moe_tokens_bytes == pytest.approx(1.25 * base.moe_tokens_bytes)
    assert pad.moe_tokens_bytes == pytest.approx(1.5 * base.moe_tokens_bytes)
    mlp_even = sum(g.flops for g in layer_gemms(even.model, tokens=1024, tp=1, moe=True)[2:])
    mlp_skew = sum(g.flops for g in layer_gemms(skew.model, tokens=1024, tp=1, moe=True)[2:])
    assert mlp_skew == pytest.approx(1.25 * mlp_even)
    # a random router over 8 experts, 1024 tokens x top-2: mean 256 a expert
    assert routing_imbalance(8, 1024, 2) == pytest.approx(1 + (2 * math.log(8) / 256) ** 0.5)
    assert routing_imbalance(1, 1024, 1) == 1.0
