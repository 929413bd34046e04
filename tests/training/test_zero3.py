"""ZeRO-3 layer by layer (:mod:`collsim.training.zero3`) on hand-computed cases, and the
layout ranking of Narayanan et al. 2021 Table 2 (3D parallelism beats ZeRO-3) from ``plan``."""

from __future__ import annotations

import pytest

from collsim.training.layout import place, resolve_layout
from collsim.training.plan import CandidatesIn, plan
from collsim.training.reference import load_runs, to_reference
from collsim.training.step import DEFAULT_EFFICIENCY, StepModel
from collsim.training.workload import workload_from_dict
from collsim.training.zero3 import (
    LIST_COPY_S,
    LayerComm,
    buckets,
    exposed_per_layer,
    layer_comm,
    regathered,
    stage_tensors,
    transformer_tensors,
    zero3,
)
from tests.training._step_fixtures import gpt, ring_topology

ALPHA, BETA = 1e-3, 1e9


class AlphaBetaTimer:
    """Every collective costs ``ALPHA + bytes / BETA`` seconds, on any group."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def time_s(self, collective, gpus, size_bytes, algorithm="nccl"):
        if len(gpus) <= 1 or size_bytes <= 0:
            return 0.0
        self.calls.append((collective, size_bytes))
        return ALPHA + size_bytes / BETA


def _z3(**training):
    return workload_from_dict(
        gpt(
            model={"layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32},
            global_batch=8, micro_batch=1, dtype="bf16",
            parallel={"tp": 1, "pp": 1, "zero": 3},
            # every tensor gathered (the default keeps h = 64 tensors whole on every rank)
            training={"optimizer": "none", "dp_overlap": False, "persistence_threshold": 0,
                      **training},
        )
    )  # fmt: skip


def test_exposed_gather_per_layer_is_comm_beyond_compute():
    c = LayerComm(demand=2.0, prefetch=3.0, reduce_scatter=4.0)
    # Without overlap: both passes' gathers and the reduce-scatter.
    assert exposed_per_layer(c, 1.0, 5.0, overlap=False) == pytest.approx(2 * 5 + 4)
    # Forward: 2 on demand + (3 - 1) beyond the compute; backward: 2 + (3 + 4 - 5).
    assert exposed_per_layer(c, 1.0, 5.0, overlap=True) == pytest.approx(4 + 4)
    # Long compute hides the prefetched gathers and the reduce-scatter, never the on-demand ones.
    assert exposed_per_layer(c, 10.0, 20.0, overlap=True) == pytest.approx(2 + 2)


def test_full_recomputation_regathers_what_the_recomputed_forward_released():
    """DeepSpeed keeps a tensor for its backward only if fewer than max_reuse elements are
    fetched in between: twice the elements after it in the layer (recomputed forward, then the
    backward in reverse). GPT layer weights QKV 3h^2, proj h^2, fc1 4h^2, fc2 4h^2."""
    h2 = 12288.0**2  # GPT-3 175B
    weights = [3 * h2, h2, 4 * h2, 4 * h2]
    assert regathered(weights, 1e9) == [True, True, True, False]  # 18, 16, 8, 0 h^2 apart
    assert regathered(weights, 17 * h2) == [True, False, False, False]
    assert regathered(weights, 1e12) == [False] * 4


def test_small_tensors_persist_and_a_recomputed_layer_gathers_some_weights_three_times():
    """h = 64: a layer's 4 matrices (12288, 4096, 16384, 16384 elements) are gathered, its 8
    bias / norm vectors (64-192) persist under a 1000-element threshold; with full
    recomputation and a reuse distance of 40000 elements, QKV (2 x 36864 apart) and the
    projection (2 x 32768) are gathered a third time, fc1 (2 x 16384) and fc2 are kept. Every
    tensor's gradient is still reduce-scattered."""
    w = _z3(persistence_threshold=1000, max_reuse_distance=40_000)
    w = workload_from_dict({**w.model_dump(), "recompute": "full"})
    layer = transformer_tensors(w, 1, 1, False)
    timer = AlphaBetaTimer()
    c = layer_comm(timer.time_s, ["a", "b", "c", "d"], w, layer, "ring", recomputed=True)
    big = [t for t in layer if t >= 1000]
    assert big == [3 * 64 * 64, 64 * 64, 4 * 64 * 64, 4 * 64 * 64]
    gathers = [size for coll, size in timer.calls if coll == "all_gather"]
    assert gathers == [2 * t for t in big]  # each distinct gather timed once
    ag = [ALPHA + 2 * t / BETA for t in big]
    assert c.prefetch == pytest.approx(sum(ag))
    assert c.regather_prefetch == pytest.approx(ag[0] + ag[1])
    assert c.gathers == 2 * 4 + 2
    # each GPU receives 3/4 of every gathered tensor, bf16: the repeats count, persistent don't
    assert c.gathered_bytes == pytest.approx((2 * sum(big) + big[0] + big[1]) * 2 * 3 / 4)
    copy = 4 * LIST_COPY_S
    assert c.copies == pytest.approx(4 * copy) and c.regather_copies == pytest.approx(2 * copy)
    rs = sum(size for coll, size in timer.calls if coll == "reduce_scatter")
    assert rs == pytest.approx(2 * sum(layer))  # all 12 tensors' gradients, bf16
    # no overlap: forward 4 gathers, backward 4 + 2, the reduce-scatter, every copy
    assert exposed_per_layer(c, 1.0, 1.0, overlap=False) == pytest.approx(
        2 * sum(ag) + ag[0] + ag[1] + c.reduce_scatter + 10 * copy + c.rs_copies
    )
    # without recomputation the backward gathers once, like the forward
    plain = layer_comm(AlphaBetaTimer().time_s, ["a", "b", "c", "d"], _z3(
        persistence_threshold=1000, max_reuse_distance=40_000), layer, "ring")  # fmt: skip
    assert plain.gathers == 8 and plain.regather_prefetch == 0
    # the whole step: 2 layers x 10 gathers; the embeddings (never recomputed) 2 x 2
    r = StepModel(ring_topology(4), AlphaBetaTimer()).evaluate(w)
    assert r.details["zero3_gathers_per_micro_batch"] == 2 * 10 + 2 * 2


def test_persistent_tensors_are_held_whole_in_memory():
    """Raising the persistence threshold above every tensor removes all gathers and leaves
    every GPU holding the whole weights (fp16) though gradients and optimizer stay sharded."""
    from collsim.training.transformer import total_params

    topo = ring_topology(4)

    def deep(**training):  # 16 layers: gathering two at a time is well under all of them
        w = _z3(**training)
        return workload_from_dict({**w.model_dump(), "model": {**w.model.model_dump(),
                                                               "layers": 16}})  # fmt: skip

    sharded = StepModel(topo, AlphaBetaTimer()).evaluate(deep())
    whole = StepModel(topo, AlphaBetaTimer()).evaluate(deep(persistence_threshold=10**9))
    assert whole.details["zero3_gathers_per_micro_batch"] == 0
    assert whole.memory.weights == pytest.approx(total_params(deep().model) * 2, rel=1e-9)
    assert sharded.memory.weights < whole.memory.weights
    assert whole.memory.gradients == pytest.approx(sharded.memory.gradients)


def test_an_moe_layers_reuse_distances_run_over_its_experts_too():
    """Attention tensors (one group) are followed by the experts' (another group) in the same
    layer: their distance to the backward counts the experts' elements."""
    assert regathered([10.0, 5.0], 8.0) == [True, False]  # 2 x 5 apart, then 0
    assert regathered([10.0, 5.0], 8.0, later=100.0) == [True, True]


def test_gradient_buckets_coalesce_small_tensors_and_keep_large_ones_alone():
    assert buckets([10, 10, 50, 5, 5], 25) == [20, 50, 10]
    assert buckets([30], 25) == [30]


def test_zero3_step_is_one_collective_per_tensor_hand_computed():
    """2 layers of h = 64 (12 tensors each) + the embeddings (vocab x h, seq x h), 4 GPUs, 2
    micro-batches, bf16: each tensor all-gathered twice, each layer's gradients reduce-scattered
    in one bucket, every collective ALPHA + bytes / BETA, nothing overlapped."""
    topo = ring_topology(4)
    timer = AlphaBetaTimer()
    w = _z3()
    r = StepModel(topo, timer).evaluate(w)
    h, s, v = 64, 32, 128
    layer = transformer_tensors(w, 1, 1, False)
    assert len(layer) == 12 and sum(layer) == pytest.approx(12 * h * h + 13 * h)
    embed = [v * h, s * h]
    m = 8 // (4 * 1)

    copy = 4 * LIST_COPY_S  # each list collective copies into / out of 4 per-rank tensors

    def one(tensors):
        gathers = 2 * sum(ALPHA + 2 * t / BETA + copy for t in tensors)
        return gathers + ALPHA + 2 * sum(tensors) / BETA + copy

    expected = m * (2 * one(layer) + one(embed))
    assert r.breakdown["dp_comm"] == pytest.approx(expected, rel=1e-12)
    assert r.details["zero3_gathers_per_micro_batch"] == 2 * (2 * 12 + 2)
    gathers = [c for c in timer.calls if c[0] == "all_gather"]
    assert sorted({size for _, size in gathers}) == sorted({2 * t for t in layer + embed})


def test_prefetch_hides_small_gathers_but_not_tensors_beyond_the_bucket():
    """Overlap, hand-computed: 2 layers with 20 ms forward / 60 ms backward each per
    micro-batch; a 1 KB prefetch bucket leaves the weight matrices (8-32 KB) on demand."""
    topo = ring_topology(4)
    w = _z3(dp_overlap=True, prefetch_bucket="1KB")
    lay = resolve_layout(w, 4)
    tensors = stage_tensors(w, lay, 0, range(2))
    crit = {"fwd": 0.040, "bwd": 0.120, "layers": 2.0}
    timer = AlphaBetaTimer()
    gathers, reduces, _ = zero3(timer.time_s, w, lay, place(lay, topo), tensors, crit, 3, "ring")
    exposed = gathers + reduces

    def ag(t):
        return ALPHA + 2 * t / BETA

    layer = tensors[0]
    demand = sum(ag(t) for t in layer if 2 * t > 1000)
    pre = sum(ag(t) for t in layer if 2 * t <= 1000)
    rs = ALPHA + 2 * sum(layer) / BETA
    copies = (2 * 12 + 1) * 4 * LIST_COPY_S  # never hidden
    per_layer = demand + max(0, pre - 0.020) + demand + max(0, pre + rs - 0.060) + copies
    emb = tensors[2]  # both embedding tensors are larger than 1 KB: on demand, no compute
    per_emb = 2 * sum(ag(t) for t in emb) + ALPHA + 2 * sum(emb) / BETA + 5 * 4 * LIST_COPY_S
    assert demand > 4 * ALPHA and pre == pytest.approx(8 * ALPHA, rel=1e-3)
    assert exposed == pytest.approx(3 * (2 * per_layer + per_emb), rel=1e-12)
    # The default 100 MB bucket prefetches everything: only comm beyond compute is exposed.
    w_all = _z3(dp_overlap=True)
    hidden = sum(zero3(timer.time_s, w_all, lay, place(lay, topo), tensors, crit, 3, "ring")[:2])
    both = demand + pre
    assert hidden == pytest.approx(
        3 * (2 * (max(0, both - 0.020) + max(0, both + rs - 0.060) + copies) + per_emb),
        rel=1e-12,
    )
    assert hidden < exposed


def test_fsdp_gathers_one_flat_unit_per_layer():
    topo = ring_topology(4)
    timer = AlphaBetaTimer()
    w = _z3()
    fsdp = workload_from_dict(
        {**w.model_dump(), "parallel": {**w.parallel.model_dump(), "fsdp": True}}
    )
    r = StepModel(topo, timer).evaluate(fsdp)
    assert r.details["zero3_gathers_per_micro_batch"] == 2 * 3
    ds = StepModel(topo, AlphaBetaTimer()).evaluate(w)
    assert r.details["dp_bytes_per_gpu"] == pytest.approx(ds.details["dp_bytes_per_gpu"])
    assert r.breakdown["dp_comm"] < ds.breakdown["dp_comm"]  # fewer latencies, same bytes


def _measured(run_id: str) -> float:
    return next(to_reference(r).measured_s for r in load_runs() if r["id"] == run_id)


ZERO3_TOO_FAST = pytest.mark.xfail(
    strict=True,
    reason="known gap: the ZeRO-3 runs are predicted 11-44% fast (reports/steptime_validation.md:"
    " the measured steps leave their collectives a fraction of the fabric's rate); on 384 GPUs"
    " ZeRO-3 then beats 3D parallelism (73.0 vs 74.8 s; measured 81.6 vs 76.8 s)",
)


@pytest.mark.parametrize(
    ("nodes", "micro"), [pytest.param(48, 4, marks=ZERO3_TOO_FAST), (96, 2), (192, 1)]
)
def test_plan_ranks_3d_parallelism_above_zero3_as_measured(nodes, micro):
    """Narayanan et al. 2021 Table 2: GPT 174.6B, global batch 1536, on 384/768/1536 A100s,
    ZeRO-3 (no model parallelism, micro-batch 4/2/1) vs PTD-P (TP 8 x PP 12, micro-batch 1)."""
    n = nodes * 8
    zero_s = _measured(f"narayanan2021-t2-zero3-174.6B-{n}gpu")
    ptd_s = _measured(f"narayanan2021-t2-ptd-174.6B-{n}gpu")
    w = next(
        to_reference(r).workload
        for r in load_runs()
        if r["id"] == f"narayanan2021-t2-zero3-174.6B-{n}gpu"
    )
    cand = CandidatesIn.model_validate(
        {
            "clusters": [{"topology": "selene", "nodes": nodes, "gpu_hour_usd": 1}],
            "search": {"tp": [1, 8], "pp": [1, 12], "zero": [0, 3], "micro_batch": [1, micro]},
        }
    )
    options, _ = plan(w, cand, efficiency=DEFAULT_EFFICIENCY, keep="all")
    z3 = [o for o in options if o.result.layout.zero == 3 and o.result.layout.tp == 1]
    ptd = [o for o in options if o.result.layout.label().startswith("tp8-pp12-") and not
           o.result.layout.zero]  # fmt: skip
    assert z3 and ptd
    zero_pred = min(o.result.step_time_s for o in z3)
    ptd_pred = min(o.result.step_time_s for o in ptd)
    assert (ptd_pred < zero_pred) == (ptd_s < zero_s)
    assert ptd_s < zero_s  # the published order


def test_zero3_step_does_not_shrink_from_768_to_1536_gpus_as_measured():
    """Narayanan et al. 2021 Table 2: 174.6B under ZeRO-3 takes 66.75 s on 768 and on 1536 GPUs
    (global batch fixed, so the compute halves): the per-collective costs that grow with the GPU
    count (ring steps, DeepSpeed's per-rank copies) eat the gain. The model keeps the step from
    shrinking too, though it predicts both runs faster than measured
    (reports/steptime_validation.md)."""
    from collsim.training.reference import Predictor

    pred = Predictor()
    runs = {r["id"]: to_reference(r) for r in load_runs()}
    small = pred.predict(runs["narayanan2021-t2-zero3-174.6B-768gpu"], DEFAULT_EFFICIENCY)
    large = pred.predict(runs["narayanan2021-t2-zero3-174.6B-1536gpu"], DEFAULT_EFFICIENCY)
    assert large > 0.9 * small  # compute alone: 0.5


def test_gather_copy_time_is_a_workload_knob():
    """``training.gather_copy_time``: 0 for flat-buffer gathers removes exactly the copies."""
    topo = ring_topology(4)
    base = StepModel(topo, AlphaBetaTimer()).evaluate(_z3())
    flat = StepModel(topo, AlphaBetaTimer()).evaluate(_z3(gather_copy_time="0us"))
    # per micro-batch (2 of them): 2 layers x (2 x 12 gathers + 1 reduce-scatter), embeddings
    # 2 x 2 gathers + 1: 55 list collectives, each copying 4 per-rank tensors
    copies = 2 * 55 * 4
    assert base.breakdown["dp_comm"] - flat.breakdown["dp_comm"] == pytest.approx(
        copies * LIST_COPY_S, rel=1e-9
    )
    assert _z3(gather_copy_time="10us").training.gather_copy_s == pytest.approx(10e-6)
    with pytest.raises(Exception, match="gather_copy_time"):
        _z3(gather_copy_time="-1us")


def test_the_schema_default_is_the_documented_constant():
    assert _z3().training.gather_copy_s == pytest.approx(LIST_COPY_S)
