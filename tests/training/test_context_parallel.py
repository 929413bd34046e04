"""Context parallelism: each sequence split over ``cp`` GPUs that all-gather the whole sequence's
keys and values per layer (Llama 3's all-gather-based CP), checked on hand-computed cases: the
per-rank costs, the rank order, the exposed K/V collectives, the gradient group and the memory."""

from __future__ import annotations

import dataclasses

import pytest

from collsim.errors import CollsimError
from collsim.topology.loader import load_topology
from collsim.training.comm import make_timer
from collsim.training.layout import place, resolve_layout
from collsim.training.plan import SearchIn, layouts
from collsim.training.sharing import concurrent_groups
from collsim.training.step import StepModel
from collsim.training.transformer import layer_costs
from collsim.training.workload import WorkloadError, workload_from_dict
from tests.training._step_fixtures import generic, gpt

GQA = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "vocab": 32000, "seq_len": 4096}


@pytest.fixture(scope="module")
def node():
    """A DGX H100 without its SM count: no tile or wave quantisation, so a GEMM's time is its
    FLOPs' whatever its shape and these hand-computed cases scale exactly with cp (the shape
    model has its own tests: tests/training/test_kernels.py)."""
    topo = load_topology("dgx-h100", nodes=1)
    return dataclasses.replace(topo, gpu=dataclasses.replace(topo.gpu, sms=None))


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
    for kind, size in (("cp", 2), ("tp", 2), ("dp", 4), ("dp_expert", 4)):
        found = concurrent_groups(lay, names, kind)
        assert sorted(g for grp in found for g in grp) == sorted(names)
        assert {len(grp) for grp in found} == {size}
    assert concurrent_groups(lay, names, "dp")[0] == groups.dp
    staged = resolve_layout(_w(parallel={"tp": 2, "cp": 2, "pp": 2}), 8)
    pairs = concurrent_groups(staged, names, "pp")
    assert len(pairs) == 4 and sorted(g for pair in pairs for g in pair) == sorted(names)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_each_layer_gathers_keys_and_values_and_reduce_scatters_their_gradients(model, recompute):
    """Per micro-batch and layer: the whole sequence's K/V all-gathered before the attention
    and again for its backward (Transformer Engine keeps only the local ones; a full
    recomputation gathers a third time) and one reduce-scatter of their gradients, exposed;
    m micro-batches, 8 layers on the one stage. One layer's forward holds one gather."""
    w = _w(parallel={"tp": 2, "cp": 4}, recompute=recompute, global_batch=8, micro_batch=2)
    res = model.evaluate(w, 8)
    lay = res.layout
    assert (lay.dp, lay.m) == (1, 4)
    groups = model._place(lay)
    size = 2 * 2 * 4096 * 256 * 2 / 2  # micro-batch x K and V x s x h_kv x bytes / tp
    ag = model._coll("all_gather", groups.cp, size, "nccl")
    rs = model._coll("reduce_scatter", groups.cp, size, "nccl")
    gathers = 3 if recompute == "full" else 2
    assert res.breakdown["cp_comm"] == pytest.approx(lay.m * 8 * (gathers * ag + rs))
    assert res.breakdown["cp_comm"] > 0
    # One layer (Korthikanti's Table 4 view), without TP: a quarter of the tokens' compute, one
    # gather in the forward, the rest in the backward.
    one = {"global_batch": 16, "micro_batch": 2, "recompute": recompute}
    fwd, bwd = model.layer_times(_w(parallel={"cp": 4}, **one), 8)
    fwd1, bwd1 = model.layer_times(_w(**one), 8)
    lone = model._place(resolve_layout(_w(parallel={"cp": 4}, **one), 8)).cp
    ag1 = model._coll("all_gather", lone, 2 * size, "nccl")
    rs1 = model._coll("reduce_scatter", lone, 2 * size, "nccl")
    assert fwd - fwd1 / 4 == pytest.approx(ag1, rel=1e-6)
    assert bwd - bwd1 / 4 == pytest.approx((gathers - 1) * ag1 + rs1, rel=1e-6)


def test_pure_context_parallelism_still_reduces_gradients(model):
    """dp 1, cp 8: the eight GPUs hold the same weights and saw different tokens, so their
    gradients are all-reduced over all eight (nothing to reduce at cp 1 on one GPU)."""
    res = model.evaluate(_w(parallel={"cp": 8}, global_batch=8, micro_batch=1), 8)
    assert res.layout.dp == 1
    assert res.breakdown["dp_comm"] > 0
    params = res.details["params_per_gpu"]
    assert res.details["dp_bytes_per_gpu"] == pytest.approx(2 * params * 2 * 7 / 8)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_cp_halves_the_compute_and_activations_of_each_gpu(model, recompute):
    """The same global batch on 8 GPUs as dp 8 or as dp 4 x cp 2: each GPU computes the same
    tokens per step either way (hardware FLOPs, recomputation included, alike), but with cp a
    micro-batch is half of a sequence per GPU: half the activations in flight."""
    dp8 = model.evaluate(_w(global_batch=16, micro_batch=1, recompute=recompute), 8)
    cp2 = model.evaluate(
        _w(parallel={"cp": 2}, global_batch=16, micro_batch=1, recompute=recompute), 8
    )
    assert cp2.layout.m == 2 * dp8.layout.m
    assert cp2.breakdown["compute"] == pytest.approx(dp8.breakdown["compute"], rel=1e-9)
    act = cp2.memory.activations - 4 * 4096 * 32000 / 2  # the loss's logits, /cp too
    assert act == pytest.approx((dp8.memory.activations - 4 * 4096 * 32000) / 2, rel=1e-9)
    assert cp2.model_flops == dp8.model_flops
    assert cp2.hardware_flops == pytest.approx(dp8.hardware_flops)
    if recompute == "full":
        assert cp2.hardware_flops > 1.2 * cp2.model_flops


def test_pipeline_sends_carry_the_gpus_share_of_the_sequence(model):
    """pp 2, cp 2: each GPU sends its half of each micro-batch's activations to the next
    stage, ``m v + p - 1`` times each way on the critical path."""
    w = _w(parallel={"cp": 2, "pp": 2}, global_batch=8, micro_batch=1)
    res = model.evaluate(w, 8)
    lay = res.layout
    groups = model._place(lay)
    send = model._coll("sendrecv", groups.pp_pair, 4096 * 1024 * 2 / 2, "nccl")
    assert res.breakdown["pp_comm"] == pytest.approx((lay.m + 1) * 2 * send)


def test_zero_shards_over_dp_times_cp(model):
    """ZeRO-1 shards the optimizer state over every GPU holding the weights: dp x cp."""
    w = _w(parallel={"cp": 4, "zero": 1}, global_batch=8, micro_batch=1)
    res = model.evaluate(w, 8)
    params = res.details["params_per_gpu"]
    assert res.memory.optimizer == pytest.approx(12 * params / 8)


@pytest.mark.parametrize("zero", [1, 3])
@pytest.mark.parametrize("moe", [False, True])
def test_eight_cp_ranks_shard_and_move_like_eight_replicas(model, zero, moe):
    """dp 1 x cp 8 and dp 8 hold the same weights on the same 8 GPUs, one micro-batch each:
    ZeRO shards weights, gradients and optimizer state (experts' too) alike, and moves the
    same gradient and weight bytes per GPU."""
    spec = {**GQA, "experts": {"count": 8, "top_k": 2}} if moe else dict(GQA)

    def run(cp):
        data = gpt(model=spec, parallel={"cp": cp, "zero": zero}, global_batch=8 // cp)
        return model.evaluate(workload_from_dict(dict(data, micro_batch=1)), 8)

    cp8, dp8 = run(8), run(1)
    assert (cp8.layout.dp, cp8.layout.m) == (1, dp8.layout.m)
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(cp8.memory, part) == pytest.approx(getattr(dp8.memory, part)), part
    assert cp8.details["dp_bytes_per_gpu"] == pytest.approx(dp8.details["dp_bytes_per_gpu"])
    assert cp8.details["dp_bytes_per_gpu"] > 0


def test_the_elastic_option_shrinks_whole_replicas_of_tp_cp_pp(node):
    """A cp 2 layout on 2 nodes, one node lost: 4 replicas of 2 GPUs on the other node (a
    replica counted as tp x pp alone fits no layout there)."""
    from collsim.cli.step import _elastic_step

    two = load_topology("dgx-h100", nodes=2)
    model2 = StepModel(two, make_timer("analytic", two))
    w = _w(parallel={"cp": 2}, global_batch=16, micro_batch=1)
    result = model2.evaluate(w)
    at = _elastic_step(model2, w, result, 8)
    assert at(2) == result.step_time_s
    from collsim.training.workload import with_changes

    expected = model2.evaluate(with_changes(w, parallel={"dp": 4}), 8).step_time_s
    assert at(1) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (gpt(model=dict(GQA, seq_len=4094), parallel={"cp": 2}), "divisible by 2 x cp"),
        (generic(parallel={"cp": 2}), "needs a transformer"),
        (gpt(model={**GQA, "experts": {"count": 8}}, parallel={"cp": 2, "ep": 2}),
         "cp > 1 with ep > 1"),
        (gpt(model=GQA, parallel={"cp": 2}, training={"sync": {"mode": "local_sgd", "period": 4}}),
         "must reduce their gradients every step"),
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


def test_plan_turns_to_context_parallelism_where_long_sequences_do_not_fit():
    """A 7B-class model at 64K tokens a sequence on one DGX H100 without recomputation: a whole
    sequence's activations exceed 80 GB on one GPU, so every cp 1 layout is discarded and the
    plan's answer splits the sequence (cp 8 holds one eighth of it on each GPU)."""
    from collsim.training.plan import CandidatesIn, plan

    spec = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
            "seq_len": 65536, "flash_attention": True}  # fmt: skip
    w = workload_from_dict(gpt(model=spec, global_batch=8, micro_batch=1,
                               parallel={"zero": 1}))  # fmt: skip
    cand = CandidatesIn.model_validate(
        {"tokens": "1B", "clusters": [{"topology": "dgx-h100", "nodes": [1], "gpu_hour_usd": 3}],
         "search": {"cp": [1, 2, 8]}}
    )  # fmt: skip
    every, rejected = plan(w, cand, keep="all")
    assert rejected.memory >= 1  # cp 1 (and cp 2) cannot hold the activations
    assert every and all(o.result.layout.cp == 8 for o in every)
    assert every[0].result.fits


@pytest.mark.parametrize("seq_len", [512, 4096])
def test_ring_attention_exposes_only_what_a_step_outlasts_its_attention(model, seq_len):
    """cp_comm: p2p (ring attention): cp - 1 steps per layer, each sending a K/V chunk (1 / cp of
    the gathered K/V) to the next rank while attending to the one held; the backward sends K/V
    and their gradients. Exposed per layer: (cp - 1) x max(0, hop - attention / cp) forward and
    (cp - 1) x max(0, 2 hop - backward attention / cp) backward. Long sequences hide it all."""
    cp = 4
    data = {"global_batch": 8, "micro_batch": 1, "recompute": "none"}
    model_ = dict(GQA, seq_len=seq_len)
    ring = workload_from_dict(gpt(model=model_, parallel={"cp": cp, "cp_comm": "p2p"}, **data))
    gather = workload_from_dict(gpt(model=model_, parallel={"cp": cp}, **data))
    one = model.one_layer(ring, 8)
    lay = resolve_layout(ring, 8)
    groups = model._place(lay)
    kv_bytes = 2 * seq_len * 256 * 2  # K and V x s x h_kv (1024 x 4 / 16) x bytes
    hop = model._coll("sendrecv", groups.cp[:2], kv_bytes / cp, "nccl")
    fwd_attn = one["attention_fwd"] / cp
    bwd_attn = (one["attention"] - one["attention_fwd"]) / cp
    expect = (cp - 1) * (max(0.0, hop - fwd_attn) + max(0.0, 2 * hop - bwd_attn))
    assert one["cp"] == pytest.approx(expect, rel=1e-9, abs=1e-15)
    assert one["cp"] <= model.one_layer(gather, 8)["cp"]
    if seq_len == 4096:  # the attention of a 4k chunk outlasts an NVLink hop: nothing exposed
        assert one["cp"] == 0.0


def test_plan_searches_the_cp_communication_only_where_there_is_cp():
    """cp_comm is a planning choice: with cp 1 it is moot (one layout), with cp 2 both ways are
    layouts of their own, labelled apart (-cp2 all-gather, -cp2r ring)."""
    w = workload_from_dict(gpt(model=dict(GQA), global_batch=8, micro_batch=1))
    found = layouts(w, SearchIn(cp=[1, 2], cp_comm=["allgather", "p2p"]))
    assert sorted((x.parallel.cp, x.parallel.cp_comm) for x in found) == [
        (1, "allgather"), (2, "allgather"), (2, "p2p"),
    ]  # fmt: skip
    labels = {resolve_layout(x, 8).label() for x in found}
    assert {"tp1-pp1-dp4-cp2-mb1", "tp1-pp1-dp4-cp2r-mb1"} <= labels
