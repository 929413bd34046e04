"""The step model on hand-computed cases: pure DP ring all-reduce, pipeline bubble, ZeRO-3
traffic, memory, stragglers, the analytic/engine timers."""

from __future__ import annotations

import pytest

from collsim.protocols import get_protocol
from collsim.topology.loader import load_topology
from collsim.training.comm import DesTimer, make_timer
from collsim.training.step import (
    StepModel,
    bubble_fraction,
    expected_max_multiplier,
    overlapped_buckets,
)
from collsim.training.transformer import eq3_flops_per_sample, model_flops_per_sample
from collsim.training.workload import DTYPE_BYTES, workload_from_dict
from tests.training._step_fixtures import generic, gpt, ring_topology

REL = 1e-9


@pytest.mark.parametrize("engine", ["des", "analytic"])
def test_pure_dp_ring_all_reduce_without_overlap_is_compute_plus_closed_form(engine):
    n, bw, lat = 4, 25e9, 2e-6
    topo = ring_topology(n)
    w = workload_from_dict(generic())
    result = StepModel(topo, make_timer(engine, topo)).evaluate(w)
    compute = 64 / n * 1e12 / (100e12 * 0.5)  # local samples x FLOPs / (peak x efficiency)
    grad_bytes = 100e6 * 2  # bf16 gradients
    proto = get_protocol("Simple")
    a = max(lat, proto.hop_latency_s[0])  # hwLat covers the route latency: the larger counts
    ring = 2 * (n - 1) * (a + grad_bytes / (n * bw * proto.bandwidth_fraction))
    assert result.breakdown["compute"] == pytest.approx(compute, rel=REL)
    assert result.breakdown["dp_comm"] == pytest.approx(ring, rel=1e-6)
    assert result.step_time_s == pytest.approx(compute + ring, rel=1e-6)
    assert result.breakdown["bubble"] == 0 and result.breakdown["tp_comm"] == 0


def test_gemms_run_at_the_efficiency_times_the_gpus_best_matmul_not_its_peak():
    from collsim.topology.loader import topology_from_dict
    from collsim.topology.spec import DEFAULT_MATMUL_FRACTION
    from tests.training import _step_fixtures as fx

    w = workload_from_dict(generic())
    results = {}
    for name, matmul in (("measured", {"bf16": 60}), ("assumed", None)):
        gpu = (
            dict(fx.GPU, matmul_tflops=matmul)
            if matmul
            else {k: v for k, v in fx.GPU.items() if k != "matmul_tflops"}
        )
        topo = topology_from_dict({**_single(), "gpu": gpu})
        results[name] = StepModel(topo, make_timer("analytic", topo)).evaluate(w)
    flops = 64 * 1e12
    assert results["measured"].breakdown["compute"] == pytest.approx(flops / (60e12 * 0.5))
    assert results["assumed"].breakdown["compute"] == pytest.approx(
        flops / (100e12 * DEFAULT_MATMUL_FRACTION * 0.5)
    )
    # utilisation is still measured against the datasheet peak
    assert results["measured"].peak_flops == pytest.approx(100e12)


def _single():
    """One GPU alone: compute only."""
    return {"name": "one", "devices": [{"name": "g0", "kind": "gpu", "node": 0}], "links": []}


def test_overlap_hides_the_all_reduce_behind_the_backward():
    topo = ring_topology(4)
    timer = make_timer("analytic", topo)
    plain = StepModel(topo, timer).evaluate(workload_from_dict(generic()))
    over = StepModel(topo, timer).evaluate(
        workload_from_dict(generic(training={"dp_overlap": True, "bucket": "25MB"}))
    )
    assert over.breakdown["dp_comm"] < plain.breakdown["dp_comm"]
    # 8 buckets of c each, backward W: exposed = max(8c - W(1 - 1/8), c)
    assert overlapped_buckets(8.0, 8, 4.0) == pytest.approx(8.0 - 4.0 * 7 / 8)
    assert overlapped_buckets(8.0, 8, 100.0) == pytest.approx(1.0)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 1), (8, 64, 1), (8, 64, 3), (2, 1, 1)])
def test_pipeline_bubble_matches_p_minus_1_over_m_plus_p_minus_1(p, m, v):
    topo = load_topology("dgx-h100", nodes=max(1, p // 8))
    sched = {"schedule": "interleaved", "virtual_stages": v} if v > 1 else {}
    w = workload_from_dict(
        gpt(
            model={"layers": 24 * v, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024},
            global_batch=m, micro_batch=1, parallel={"tp": 1, "pp": p, "dp": 1, **sched},
        )
    )  # fmt: skip
    r = StepModel(topo, make_timer("analytic", topo)).evaluate(w, p)
    assert r.details["bubble_fraction"] == pytest.approx(bubble_fraction(p, m, v))
    assert bubble_fraction(p, m, 1) == pytest.approx((p - 1) / (m + p - 1))
    stages = r.details["stage_time_s"]
    mean = sum(stages) / len(stages)
    assert r.breakdown["bubble"] == pytest.approx((p - 1) / v * mean, rel=REL)


def test_zero3_moves_one_and_a_half_times_the_data_parallel_bytes():
    topo = ring_topology(4)
    timer = make_timer("analytic", topo)
    base = generic(global_batch=64, micro_batch=16)
    dp = StepModel(topo, timer).evaluate(workload_from_dict(base))
    z3 = StepModel(topo, timer).evaluate(workload_from_dict({**base, "parallel": {"zero": 3}}))
    assert z3.details["dp_bytes_per_gpu"] == pytest.approx(1.5 * dp.details["dp_bytes_per_gpu"])
    z1 = StepModel(topo, timer).evaluate(workload_from_dict({**base, "parallel": {"zero": 1}}))
    assert z1.details["dp_bytes_per_gpu"] == pytest.approx(dp.details["dp_bytes_per_gpu"])
    # Without overlap the time follows the bytes on a bandwidth-bound ring (FSDP: one flat unit
    # per layer); DeepSpeed's list collectives add per-rank copies on top.
    fsdp = StepModel(topo, timer).evaluate(workload_from_dict({**base, "parallel": {"fsdp": True}}))
    assert fsdp.details["dp_bytes_per_gpu"] == pytest.approx(z3.details["dp_bytes_per_gpu"])
    assert fsdp.breakdown["dp_comm"] / dp.breakdown["dp_comm"] == pytest.approx(1.5, rel=0.02)
    assert z3.breakdown["dp_comm"] > fsdp.breakdown["dp_comm"]


def test_a_layout_that_does_not_fit_is_reported():
    topo = load_topology("dgx-a100", nodes=1)  # 40 GB GPUs
    big = gpt(
        model={"layers": 40, "hidden": 5120, "heads": 40, "vocab": 32000, "seq_len": 2048},
        global_batch=8, micro_batch=1, parallel={"tp": 1, "pp": 1},
    )  # fmt: skip
    model = StepModel(topo, make_timer("analytic", topo))
    r = model.evaluate(workload_from_dict(big))
    assert not r.fits and r.memory.total > r.memory.capacity
    # 13B parameters x 16 bytes alone exceed 40 GB; sharded 8 ways by TP they fit.
    assert r.memory.weights + r.memory.gradients + r.memory.optimizer > 40e9 * 4
    sharded = model.evaluate(
        workload_from_dict({**big, "parallel": {"tp": 8}, "recompute": "full"})
    )
    assert sharded.fits


def test_stragglers_are_deterministic_per_seed_and_grow_with_cv():
    a = expected_max_multiplier(512, 0.05, "lognormal", seed=3, samples=64)
    b = expected_max_multiplier(512, 0.05, "lognormal", seed=3, samples=64)
    c = expected_max_multiplier(512, 0.05, "lognormal", seed=4, samples=64)
    assert a == b and a != c
    assert 1.0 < a < expected_max_multiplier(512, 0.1, "lognormal", seed=3, samples=64)
    assert expected_max_multiplier(512, 0.0, "normal", seed=3, samples=8) == 1.0
    topo = ring_topology(4)
    w = workload_from_dict(generic(training={"stragglers": {"cv": 0.1, "seed": 7}}))
    r1 = StepModel(topo, make_timer("analytic", topo)).evaluate(w)
    r2 = StepModel(topo, make_timer("analytic", topo)).evaluate(w)
    assert r1.step_time_s == r2.step_time_s and r1.breakdown["straggler_wait"] > 0


def test_local_sgd_async_and_compression_cut_exposed_communication():
    topo = ring_topology(4)
    timer = make_timer("analytic", topo)
    sync = StepModel(topo, timer).evaluate(workload_from_dict(generic()))
    local = StepModel(topo, timer).evaluate(
        workload_from_dict(generic(training={"sync": {"mode": "local_sgd", "period": 4}}))
    )
    assert local.breakdown["dp_comm"] == pytest.approx(sync.breakdown["dp_comm"] / 4)
    asyn = StepModel(topo, timer).evaluate(
        workload_from_dict(generic(training={"sync": {"mode": "async", "staleness": 1}}))
    )
    assert asyn.breakdown["dp_comm"] == 0.0
    comp = StepModel(topo, timer).evaluate(
        workload_from_dict(generic(training={"compression": {"ratio": 4, "codec_gbps": 100}}))
    )
    assert comp.breakdown["dp_comm"] < sync.breakdown["dp_comm"] / 3
    assert comp.breakdown["compression"] == pytest.approx(2 * 100e6 * 2 / 100e9)


def test_gpt_flops_match_the_papers_formulas():
    w = workload_from_dict(gpt())
    m = w.model
    h, s, l_, v = m.hidden, m.seq_len, m.layers, m.vocab
    assert model_flops_per_sample(m) == pytest.approx(
        72 * s * l_ * h * h * (1 + s / (6 * h) + v / (12 * l_ * h)), rel=REL
    )
    assert eq3_flops_per_sample(m) == pytest.approx(
        96 * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h)), rel=REL
    )


def test_tensor_parallel_layer_and_des_timer_agree_with_analytic_inside_a_node():
    topo = load_topology("dgx-h100", nodes=1)
    w = workload_from_dict(gpt(parallel={"tp": 8, "pp": 1, "sequence_parallel": True}))
    ana = StepModel(topo, make_timer("analytic", topo)).evaluate(w)
    des = StepModel(topo, DesTimer(topo)).evaluate(w)
    assert ana.breakdown["tp_comm"] > 0
    assert des.breakdown["tp_comm"] == pytest.approx(ana.breakdown["tp_comm"], rel=0.05)


def test_timer_caches_groups_of_the_same_shape():
    topo = load_topology("dgx-h100", nodes=2)
    timer = make_timer("analytic", topo)
    a = timer.time_s("all_reduce", [f"n0.gpu{i}" for i in range(8)], 1 << 24)
    b = timer.time_s("all_reduce", [f"n1.gpu{i}" for i in range(8)], 1 << 24)
    assert a == b and timer.evaluations == 1
    assert timer.time_s("all_reduce", ["n0.gpu0"], 1 << 24) == 0.0


def test_group_shapes_survive_a_freed_topologys_id_being_reused():
    """The GPU map is cached per topology object: a new topology that gets a freed one's id
    (other node counts, other GPU names) must not see the old map. The reuse is staged: the
    cache's entry for the freed topology is put under the new one's id, as CPython's allocator
    would leave it (waiting for a natural reuse took 300 loads and collections)."""
    import gc

    from collsim.training import comm

    old = load_topology("dgx-h100", nodes=1)
    assert comm.group_shape(old, [g.name for g in old.gpus])[:3] == (8, tuple(range(8)), 1)
    stale = comm._WHERE[id(old)]
    new = load_topology("dgx-h100", nodes=3)
    del old
    gc.collect()
    assert stale[0]() is None  # the old topology is gone; its entry is what remains
    comm._WHERE[id(new)] = stale
    try:
        gpus = [g.name for g in new.gpus]
        assert comm.group_shape(new, gpus)[:3] == (24, tuple(range(8)), 3)
        assert comm._WHERE[id(new)][0]() is new
    finally:
        comm._WHERE.pop(id(new), None)


def test_zero1_and_zero2_time_one_weight_all_gather_a_step():
    """Hand-timed ZeRO 0-2 without overlap on a 4-GPU ring: stage 0 is one all-reduce; stage 1
    a reduce-scatter of the gradients and one all-gather of the updated weights (its time was
    counted twice); stage 2 reduce-scatters every micro-batch's gradients. The codec runs once
    per reduction."""
    topo = ring_topology(4)
    timer = make_timer("analytic", topo)
    gpus = ["g0", "g1", "g2", "g3"]

    def run(zero, micro=16, **training):
        data = generic(micro_batch=micro, parallel={"zero": zero}, training=training)
        w = workload_from_dict(data)
        return StepModel(topo, timer).evaluate(w), w

    r0, w = run(0)
    grads = 100e6 * DTYPE_BYTES[w.grad_dtype]
    weights = 100e6 * DTYPE_BYTES[w.value_dtype]
    rs = timer.time_s("reduce_scatter", gpus, grads, "ring")
    ag = timer.time_s("all_gather", gpus, weights, "ring")
    assert r0.breakdown["dp_comm"] == pytest.approx(timer.time_s("all_reduce", gpus, grads, "ring"))
    assert run(1)[0].breakdown["dp_comm"] == pytest.approx(rs + ag)
    two = run(2, micro=4)[0]
    assert two.details["micro_batches"] == 4
    assert two.breakdown["dp_comm"] == pytest.approx(4 * rs + ag)
    packed = run(2, micro=4, compression={"ratio": 4, "codec_gbps": 100})[0]
    assert packed.breakdown["compression"] == pytest.approx(4 * 2 * grads / 100e9)


def test_replicas_meet_every_step_whatever_the_sync_mode():
    """A replica's TP/PP GPUs wait for their slowest every step in every sync mode; only the
    data-parallel replicas wait less: local SGD for the slowest replica's mean over k steps,
    async for none (staleness 0 is synchronous). TP 2 x DP 4 on one DGX H100, cv 0.1."""
    from collsim.training.dataparallel import expected_max_multiplier

    topo = load_topology("dgx-h100", nodes=1)
    timer = make_timer("analytic", topo)

    def run(**sync):
        training = {"stragglers": {"cv": 0.1, "seed": 5}, **({"sync": sync} if sync else {})}
        data = gpt(global_batch=16, micro_batch=1, training=training, parallel={"tp": 2})
        return StepModel(topo, timer).evaluate(workload_from_dict(data))

    sync = run()
    work = sync.breakdown["compute"] + sync.breakdown["bubble"]
    pair = expected_max_multiplier(2, 0.1, "lognormal", 5, 64) - 1  # the 2 TP GPUs
    every = expected_max_multiplier(8, 0.1, "lognormal", 5, 64) - 1
    assert sync.breakdown["straggler_wait"] == pytest.approx(every * work)
    asyn = run(mode="async", staleness=1).breakdown["straggler_wait"]
    assert asyn == pytest.approx(pair * work) and asyn > 0  # was 0: no one waited at all
    assert run(mode="async", staleness=0).breakdown["straggler_wait"] == pytest.approx(
        sync.breakdown["straggler_wait"]
    )
    local = run(mode="local_sgd", period=16).breakdown["straggler_wait"]
    assert asyn < local < sync.breakdown["straggler_wait"]
    assert run(mode="local_sgd", period=16).breakdown["straggler_wait"] == local  # seeded


@pytest.mark.parametrize("distribution", ["lognormal", "normal"])
def test_local_sgd_wait_is_the_slowest_replicas_mean_of_its_step_maxima(distribution):
    """The closed-form draw of each step's replica maximum (the U^(1/p) quantile) equals brute
    force: max over GPUs of a replica, mean over k steps, max over replicas."""
    import numpy as np

    from collsim.training.dataparallel import _local_sgd_multiplier, _multipliers

    k, replicas, per_replica, cv, n = 8, 4, 3, 0.1, 20000
    got = _local_sgd_multiplier(k, replicas, per_replica, cv, distribution, 1, n)
    draws = _multipliers(np.random.default_rng(2), cv, distribution, (n, k, replicas, per_replica))
    brute = draws.max(axis=3).mean(axis=1).max(axis=1).mean()
    assert got == pytest.approx(brute, abs=1e-3)
    swapped = draws.max(axis=3).max(axis=1).mean(axis=1).mean()  # the axes the other way round
    assert abs(got - swapped) > 5e-3
