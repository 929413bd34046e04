"""Memory per GPU on every pipeline stage, optimizer state by precision, grouped-query attention
activations, and what `plan` keeps of a workload's layout (FSDP, refused combinations)."""

from __future__ import annotations

import pytest
import yaml

from collsim.topology.loader import load_topology
from collsim.training.layout import memory_per_gpu, optimizer_state_bytes, resolve_layout
from collsim.training.plan import CandidatesIn, plan
from collsim.training.transformer import layer_costs
from collsim.training.workload import workload_from_dict
from tests.training._step_fixtures import evaluate, gpt


@pytest.fixture(scope="module")
def dgx4():
    return load_topology("dgx-h100", nodes=4)


def test_memory_is_the_fullest_stage_not_only_the_first_and_last(dgx4):
    """10 layers on 4 stages are 2, 3, 3, 2: a middle stage holds the most weights; its memory
    (with its own 3 micro-batches in flight) is what the GPU must fit."""
    data = gpt(model={"layers": 10, "hidden": 8192, "heads": 64, "vocab": 32000,
                      "seq_len": 4096, "flash_attention": True},
               global_batch=64, micro_batch=1, parallel={"tp": 8, "pp": 4})  # fmt: skip
    res = evaluate(dgx4, data)
    eight = evaluate(dgx4, gpt(**{**data, "model": {**data["model"], "layers": 8}}))
    assert res.memory.total > eight.memory.total  # 3-layer stages need more than 2-layer ones
    w = workload_from_dict(data)
    lay = resolve_layout(w, 32)
    c = layer_costs(w.model, tp=8, sequence_parallel=False, recompute="none", elem_bytes=2)
    stage1 = memory_per_gpu(w, lay, res.details["params_per_gpu"], c.act_bytes_recompute,
                            c.act_bytes - c.act_bytes_recompute, 3, 80e9, stage=1)  # fmt: skip
    assert res.memory.weights == pytest.approx(stage1.weights)
    assert res.memory.activations == pytest.approx(3 * 3 * c.act_bytes)  # 3 layers x 3 in flight


def test_micro_batches_in_flight_fall_along_the_pipeline():
    w = workload_from_dict(gpt(global_batch=64, micro_batch=1, parallel={"pp": 4}))
    lay = resolve_layout(w, 4)
    acts = [memory_per_gpu(w, lay, 1e6, 1.0, 0.0, 2, 80e9, stage=i).activations for i in range(4)]
    assert acts == [8.0, 6.0, 4.0, 2.0]  # 2 layers x (p - i) micro-batches of 1 byte
    inter = workload_from_dict(gpt(global_batch=64, micro_batch=1,
                                   parallel={"pp": 4, "schedule": "interleaved",
                                             "virtual_stages": 2}))  # fmt: skip
    lay = resolve_layout(inter, 4)
    first = memory_per_gpu(inter, lay, 1e6, 1.0, 0.0, 2, 80e9, stage=0).activations
    assert first == pytest.approx(2 * (4 + 3 / 2))  # p + (p - 1)/v micro-batches (Narayanan)


def test_32_bit_weights_are_their_own_master_copy():
    mixed = workload_from_dict(gpt())
    fp32 = workload_from_dict(gpt(dtype="fp32"))
    assert optimizer_state_bytes(mixed) == 12 and optimizer_state_bytes(fp32) == 8
    lay = resolve_layout(fp32, 1)
    mem = memory_per_gpu(fp32, lay, 1e9, 0.0, 0.0, 8, 80e9)
    assert mem.weights + mem.gradients + mem.optimizer == pytest.approx(16e9)  # Adam, fp32


def test_grouped_query_attention_keeps_smaller_keys_and_values():
    """Korthikanti's 24 s b h (TP-split) holds 4 s b h of K and V; with 8 KV heads of 64 they are
    1/8 of that: 24 - 4 + 0.5."""
    full = workload_from_dict(gpt(model={"layers": 2, "hidden": 8192, "heads": 64,
                                         "vocab": 32000, "seq_len": 4096}))  # fmt: skip
    gqa = workload_from_dict(gpt(model={"layers": 2, "hidden": 8192, "heads": 64, "kv_heads": 8,
                                        "vocab": 32000, "seq_len": 4096}))  # fmt: skip
    kw = {"tp": 1, "sequence_parallel": False, "recompute": "selective", "elem_bytes": 2}
    a = layer_costs(full.model, **kw).act_bytes_recompute
    b = layer_costs(gqa.model, **kw).act_bytes_recompute
    sbh = 4096 * 8192
    assert a - b == pytest.approx(sbh * (4 - 0.5))


def test_plan_keeps_fsdp_and_counts_refused_combinations():
    data = gpt(model={"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096,
                      "flash_attention": True},
               global_batch=512, micro_batch=1, parallel={"fsdp": True})  # fmt: skip
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": [4], "gpu_hour_usd": 2}]}
    )
    options, _ = plan(workload_from_dict(data), cand)
    assert options and options[0].result.layout.fsdp and options[0].result.fits
    seq = gpt(parallel={"tp": 2, "sequence_parallel": True, "tp_overlap": True})
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": [1], "gpu_hour_usd": 2}],
         "search": {"tp": [1, 2]}}
    )  # fmt: skip
    options, _ = plan(workload_from_dict(seq), cand, keep="all")
    # tp1 runs without sequence parallelism or its overlap (nothing to split), tp2 with both
    assert {(o.result.layout.tp, o.result.layout.sequence_parallel) for o in options} == {
        (1, False),
        (2, True),
    }


def test_a_searched_zero_stage_is_that_stage_for_an_fsdp_workload():
    """zero 0 searched for an FSDP workload is plain data parallelism, 3 is FSDP: two layouts,
    not the same FSDP layout twice."""
    data = gpt(parallel={"fsdp": True})
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": [1], "gpu_hour_usd": 2}],
         "search": {"zero": [0, 1, 3]}}
    )  # fmt: skip
    options, _ = plan(workload_from_dict(data), cand, keep="all")
    labels = [o.result.layout.label() for o in options]
    assert len(labels) == len(set(labels)) == 3
    assert sum(o.result.layout.fsdp for o in options) == 1


def test_plan_says_why_a_searched_value_cannot_run():
    """A searched micro-batch larger than the global batch is refused by the workload rules: the
    plan counts it with the reason instead of dropping it unseen."""
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": [1], "gpu_hour_usd": 2}],
         "search": {"micro_batch": [2, 64]}}
    )  # fmt: skip
    options, rejected = plan(workload_from_dict(gpt()), cand)
    assert options and "multiple of micro_batch (64)" in rejected.summary()
    # The example names the refused layout as the accepted ones would be named.
    (examples,) = [v for why, v in rejected.reasons.items() if "micro_batch (64)" in why]
    assert examples == ["tp1-pp1-zero0-mb64-none"]


def test_the_last_stage_keeps_the_losss_fp32_logits():
    """Korthikanti et al. 2022, 4.3: the cross entropy keeps the logits in fp32, 4 s b V / t
    bytes, on the last stage only (every micro-batch's under GPipe)."""
    from collsim.training.transformer import loss_logits_bytes

    w = workload_from_dict(gpt(global_batch=64, micro_batch=2, parallel={"tp": 2, "pp": 2}))
    lay = resolve_layout(w, 4)
    logits = loss_logits_bytes(w.model, lay.tp, lay.micro)
    assert logits == 4 * 1024 * 2 * 32000 / 2
    args = (w, lay, 1e6, 1.0, 0.0, 4, 80e9)
    first = memory_per_gpu(*args, stage=0, logits_bytes=logits).activations
    last = memory_per_gpu(*args, stage=1, logits_bytes=logits).activations
    assert first == 4 * 2 * 2  # 4 layers x p micro-batches of 2 x 1 byte: no logits
    assert last == 4 * 1 * 2 + logits
    gpipe = workload_from_dict(gpt(global_batch=64, micro_batch=2,
                                   parallel={"tp": 2, "pp": 2, "schedule": "gpipe"}))  # fmt: skip
    lay = resolve_layout(gpipe, 4)
    held = memory_per_gpu(gpipe, lay, 1e6, 0.0, 0.0, 4, 80e9, stage=1, logits_bytes=logits)
    assert held.activations == lay.m * logits


@pytest.mark.parametrize(
    ("cluster", "search", "field", "message"),
    [
        ({"nodes": 0}, {}, "clusters.0.nodes.0", "greater than or equal to 1"),
        ({"nodes": []}, {}, "clusters.0.nodes", "at least 1 item"),
        ({"nodes": 2}, {"tp": []}, "search.tp", "at least 1 item"),
    ],
)
def test_candidates_name_an_empty_or_bad_choice(tmp_path, cluster, search, field, message):
    """``nodes: 0`` was 'Input should be a valid list'; ``search: {tp: []}`` searched the
    workload's own tp as if the key were absent."""
    from collsim.errors import CollsimError
    from collsim.training.plan import load_candidates

    path = tmp_path / "c.yaml"
    doc = {"clusters": [{"topology": "dgx-h100", "gpu_hour_usd": 2, **cluster}], "search": search}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CollsimError) as err:
        load_candidates(path)
    assert err.value.field == field and message in err.value.message


def test_a_candidates_topology_file_is_found_next_to_it(tmp_path, monkeypatch):
    """A relative topology file in a candidates file is looked up beside it (as a sweep spec's
    are), not in whatever folder plan runs from; the cluster keeps the name as written."""
    from collsim.topology.loader import resolve
    from collsim.training.plan import load_candidates

    (tmp_path / "mine.yaml").write_text(resolve("dgx-h100").read_text())
    doc = {"clusters": [{"topology": "mine.yaml", "nodes": 1, "gpu_hour_usd": 2}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path.parent)
    (cluster,) = load_candidates(tmp_path / "c.yaml").clusters
    assert cluster.source == str((tmp_path / "mine.yaml").resolve())
    assert cluster.label == cluster.topology == "mine.yaml"


def test_plan_discards_by_memory_before_pricing_and_loses_nothing(monkeypatch):
    """plan checks each layout's memory before pricing it (StepModel.evaluate_if_fits): the same
    numbers as the full evaluation (StepModel.memory too), so the same options survive and the
    same ones are counted out, and no layout that does not fit is priced."""
    from collections import Counter

    from collsim.training.comm import make_timer
    from collsim.training.plan import Rejected, layouts
    from collsim.training.step import StepModel

    data = gpt(model={"layers": 40, "hidden": 5120, "heads": 40, "vocab": 32000, "seq_len": 2048},
               global_batch=64, micro_batch=1)  # fmt: skip
    w = workload_from_dict(data)
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": [1], "gpu_hour_usd": 2}],
         "search": {"tp": [1, 2, 8], "pp": [1, 4], "zero": [0, 1, 3]}}
    )  # fmt: skip
    topo = load_topology("dgx-h100", nodes=1)
    model = StepModel(topo, make_timer("analytic", topo))
    fit: Counter = Counter()
    unfit = 0
    for v in layouts(w, cand.search, Rejected()):
        if v.parallel.tp * v.parallel.pp > 8:
            continue  # cannot run on 8 GPUs: plan says why (test above)
        full = model.evaluate(v, 8)
        assert model.memory(v, 8) == full.memory
        if full.fits:
            fit[(full.layout.label(), v.recompute, full.step_time_s)] += 1
        else:
            unfit += 1
    assert fit and unfit  # both kinds occur

    priced = StepModel._evaluate  # every pricing goes through it; None: stopped before pricing

    def fitting_only(self, v, n, **kw):
        res = priced(self, v, n, **kw)
        assert res is None or res.fits, f"plan priced {res.layout.label()}, which does not fit"
        return res

    monkeypatch.setattr(StepModel, "_evaluate", fitting_only)
    options, rejected = plan(w, cand, keep="all")
    got = Counter(
        (o.result.layout.label(), o.result.details["recompute"], o.result.step_time_s)
        for o in options
    )
    assert got == fit
    assert rejected.memory == unfit
