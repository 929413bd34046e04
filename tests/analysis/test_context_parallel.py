"""Context parallelism: each sequence split over ``cp`` GPUs that all-gather the whole sequence's
keys and values per layer (Llama 3's all-gather-based CP), checked on hand-computed cases: the
per-rank costs, the rank order, the exposed K/V collectives, the gradient group and the memory."""

from __future__ import annotations

import pytest

from collsim.analysis.comm import make_timer
from collsim.analysis.layout import place, resolve_layout
from collsim.analysis.plan import SearchIn, layouts
from collsim.analysis.sharing import concurrent_groups
from collsim.analysis.step import StepModel
from collsim.analysis.transformer import layer_costs
from collsim.analysis.workload import WorkloadError, workload_from_dict
from collsim.errors import CollsimError
from collsim.topology.loader import load_topology
from tests.analysis._step_fixtures import generic, gpt

GQA = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "vocab": 32000, "seq_len": 4096}


@pytest.fixture(scope="module")
def node():
    return load_topology("dgx-h100", nodes=1)


@pytest.fixture(scope="module")
def model(node):
    return StepModel(node, make_timer("analytic", node))


def _w(**changes):
    return workload_from_dict(gpt(model=dict(GQA), **changes))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_cp_rank_carries_its_share_of_every_per_sequence_cost(recompute):
    """Every FLOP and activation byte of a sequence splits evenly over the CP ranks (two chunks
    each balance the causal mask, so even the s^2 attention core divides by cp); the parameters
    do not; the K/V gathered are the whole sequence's, 2 s h_kv elements per TP rank."""
    m = _w().model
    kw = {"tp": 2, "sequence_parallel": True, "recompute": recompute, "elem_bytes": 2}
    one, four = layer_costs(m, **kw), layer_costs(m, cp=4, **kw)
    for name in ("fwd_flops", "attn_core_flops", "act_bytes", "act_bytes_recompute",
                 "elementwise_bytes", "attn_elementwise_bytes", "tp_bytes"):  # fmt: skip
        assert getattr(four, name) == pytest.approx(getattr(one, name) / 4), name
    assert four.params == one.params
    assert one.cp_bytes == 0.0
    kv = 1024 * 4 // 16  # hidden x kv_heads / heads
    assert four.cp_bytes == 2 * 4096 * kv * 2 / 2


def test_ranks_are_ordered_tp_then_cp_then_dp_then_pp(node):
    """Megatron-Core's tp-cp-dp-pp order: tp 2, cp 2, dp 2 on 8 GPUs puts rank 0's CP partner
    2 GPUs away and its data-parallel replica 4 away; gradients are reduced over the dp x cp
    GPUs that hold the same weights (0, 2, 4, 6)."""
    lay = resolve_layout(_w(parallel={"tp": 2, "cp": 2}), 8)
    assert (lay.dp, lay.cp, lay.shards) == (2, 2, 4)
    groups = place(lay, node)
    names = [g.name for g in node.gpus]
    assert groups.tp == names[0:2]
    assert groups.cp == [names[0], names[2]]
    assert groups.dp == [names[0], names[2], names[4], names[6]]
    # every GPU is in exactly one concurrent CP group and one TP group
    for kind, size in (("cp", 2), ("tp", 2)):
        found = concurrent_groups(lay, names, kind)
        assert sorted(g for grp in found for g in grp) == sorted(names)
        assert {len(grp) for grp in found} == {size}
    assert len(concurrent_groups(lay, names, "dp")) == 2  # one per TP rank of the first stage


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_each_layer_gathers_keys_and_values_and_reduce_scatters_their_gradients(model, recompute):
    """Per micro-batch and layer: one all-gather of the whole sequence's K/V before the
    attention (one more in a full recomputation) and one reduce-scatter of their gradients,
    exposed; m micro-batches, 8 layers on the one stage."""
    w = _w(parallel={"tp": 2, "cp": 4}, recompute=recompute, global_batch=8, micro_batch=2)
    res = model.evaluate(w, 8)
    lay = res.layout
    assert (lay.dp, lay.m) == (1, 4)
    groups = model._place(lay)
    size = 2 * 2 * 4096 * 256 * 2 / 2  # micro-batch x K and V x s x h_kv x bytes / tp
    ag = model._coll("all_gather", groups.cp, size, "nccl")
    rs = model._coll("reduce_scatter", groups.cp, size, "nccl")
    gathers = 2 if recompute == "full" else 1
    assert res.breakdown["cp_comm"] == pytest.approx(lay.m * 8 * (gathers * ag + rs))
    assert res.breakdown["cp_comm"] > 0


def test_pure_context_parallelism_still_reduces_gradients(model):
    """dp 1, cp 8: the eight GPUs hold the same weights and saw different tokens, so their
    gradients are all-reduced over all eight (nothing to reduce at cp 1 on one GPU)."""
    res = model.evaluate(_w(parallel={"cp": 8}, global_batch=8, micro_batch=1), 8)
    assert res.layout.dp == 1
    assert res.breakdown["dp_comm"] > 0
    params = res.details["params_per_gpu"]
    assert res.details["dp_bytes_per_gpu"] == pytest.approx(2 * params * 2 * 7 / 8)


def test_cp_halves_the_compute_and_activations_of_each_gpu(model):
    """The same global batch on 8 GPUs as dp 8 or as dp 4 x cp 2: each GPU computes the same
    tokens per step either way, but with cp it holds half of each of twice as many sequences'
    activations per micro-batch... which is half a micro-batch's worth each."""
    dp8 = model.evaluate(_w(global_batch=16, micro_batch=1), 8)
    cp2 = model.evaluate(_w(parallel={"cp": 2}, global_batch=16, micro_batch=1), 8)
    assert cp2.layout.m == 2 * dp8.layout.m
    assert cp2.breakdown["compute"] == pytest.approx(dp8.breakdown["compute"], rel=1e-9)
    act = cp2.memory.activations - 4 * 4096 * 32000 / 2  # the loss's logits, /cp too
    assert act == pytest.approx((dp8.memory.activations - 4 * 4096 * 32000) / 2, rel=1e-9)
    assert cp2.model_flops == dp8.model_flops
    assert cp2.hardware_flops == pytest.approx(dp8.hardware_flops)


def test_zero_shards_over_dp_times_cp(model):
    """ZeRO-1 shards the optimizer state over every GPU holding the weights: dp x cp."""
    w = _w(parallel={"cp": 4, "zero": 1}, global_batch=8, micro_batch=1)
    res = model.evaluate(w, 8)
    params = res.details["params_per_gpu"]
    assert res.memory.optimizer == pytest.approx(12 * params / 8)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (gpt(model=dict(GQA, seq_len=4094), parallel={"cp": 2}), "divisible by 2 x cp"),
        (generic(parallel={"cp": 2}), "needs a transformer"),
        (gpt(model={**GQA, "experts": {"count": 8}}, parallel={"cp": 2, "ep": 2}),
         "cp > 1 with ep > 1"),
    ],
)  # fmt: skip
def test_bad_context_parallel_layouts_are_refused(data, needle):
    with pytest.raises(CollsimError) as info:
        workload_from_dict(data, file="w.yaml")
    assert needle in str(info.value)
    assert "w.yaml" in str(info.value)
    assert "parallel" in str(info.value)


def test_cp_that_does_not_divide_the_gpus_names_it():
    w = workload_from_dict(gpt(model=dict(GQA, seq_len=4098), parallel={"tp": 2, "cp": 3}))
    with pytest.raises(WorkloadError, match="tp x cp x pp = 6 does not divide the 8 GPUs"):
        resolve_layout(w, 8)


def test_plan_searches_context_parallel_sizes():
    w = _w()
    found = layouts(w, SearchIn(cp=[1, 2, 4]))
    assert sorted(x.parallel.cp for x in found) == [1, 2, 4]
