"""Fixes from an exploratory review of the step model and its CLI: layout rules Megatron-LM
enforces, efficiency overrides, utilisation against the datasheet under faults, calibrated links
on the discrete-event engine, activation width, MoE capacity and expert sharding, weak scaling's
base, and bad measured or candidates files."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from collsim.cli import cli
from collsim.topology.loader import load_topology
from collsim.training.comm import make_timer
from collsim.training.plan import CandidatesIn, plan
from collsim.training.scaling import scale_workload
from collsim.training.step import StepModel
from collsim.training.transformer import layer_costs
from collsim.training.workload import WorkloadError, load_workload, workload_from_dict
from tests.training._step_fixtures import MOE, gpt
from tests.training._step_fixtures import evaluate as _evaluate


@pytest.fixture(scope="module")
def dgx():
    return load_topology("dgx-h100", nodes=2)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        # one micro-batch cannot be interleaved over 4 stages (Megatron-LM: m % p == 0)
        ({"global_batch": 2, "micro_batch": 1,
          "parallel": {"pp": 4, "dp": 1, "schedule": "interleaved", "virtual_stages": 2}},
         "parallel.virtual_stages", "divisible by pp (4)"),
        ({"model": {**MOE}, "parallel": {"ep": 16}}, "parallel.ep", "experts (8)"),
        ({"model": {**MOE, "heads": 16, "kv_heads": 4}, "parallel": {"tp": 8}},
         "parallel.tp", "4 key/value heads"),
    ],
)  # fmt: skip
def test_layouts_megatron_cannot_run_are_errors(dgx, changes, field, words):
    with pytest.raises(WorkloadError) as err:
        _evaluate(dgx, gpt(**changes), 4 if changes["parallel"].get("dp") == 1 else None)
    assert err.value.field == field and words in str(err.value)


def test_interleaved_first_and_last_chunks_may_hold_only_embedding_and_loss(dgx):
    """Llama 3 405B: 126 layers in 16 x 8 chunks, the first chunk only the embedding, the last
    only the loss (Dubey et al. 2024, 3.3.2). Scaled down: 14 layers in 4 x 4 chunks runs, with
    one layer fewer on the first and last stages; 13 would leave a middle chunk empty."""
    inter = {"pp": 4, "dp": 1, "schedule": "interleaved", "virtual_stages": 4}
    w = gpt(model={"layers": 14}, global_batch=8, micro_batch=1, parallel=inter)
    r = _evaluate(dgx, w, 4)
    assert r.step_time_s > 0
    with pytest.raises(WorkloadError) as err:
        _evaluate(dgx, gpt(model={"layers": 13}, global_batch=8, micro_batch=1, parallel=inter), 4)
    assert err.value.field == "parallel.pp" and "at least 14" in str(err.value)
    with pytest.raises(WorkloadError):  # not interleaved: every stage holds a layer
        _evaluate(dgx, gpt(model={"layers": 3}, global_batch=8, micro_batch=1,
                           parallel={"pp": 4, "dp": 1}), 4)  # fmt: skip


def test_an_interleaved_pipeline_is_never_faster_than_its_micro_batches_allow(dgx):
    one = _evaluate(dgx, gpt(global_batch=4, micro_batch=1, parallel={"pp": 4}), 4)
    inter = _evaluate(
        dgx,
        gpt(global_batch=4, micro_batch=1,
            parallel={"pp": 4, "schedule": "interleaved", "virtual_stages": 2}),
        4,
    )  # fmt: skip
    assert inter.step_time_s < one.step_time_s  # m = p: interleaving shrinks the bubble only
    assert inter.step_time_s > 0.5 * one.step_time_s


def test_efficiency_override_and_zero_are_not_the_default(dgx):
    data = gpt(compute={"efficiency": 0.3})
    model = StepModel(dgx, make_timer("analytic", dgx), efficiency=0.9)
    own = model.evaluate(workload_from_dict(data))
    model.force_efficiency = 0.6
    forced = model.evaluate(workload_from_dict(data))
    assert forced.breakdown["compute"] < own.breakdown["compute"]
    same = _evaluate(dgx, gpt(compute={"efficiency": 0.6}))
    assert forced.breakdown["compute"] == pytest.approx(same.breakdown["compute"])
    bad = CliRunner().invoke(cli, ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100",
                                   "--efficiency", "0"])  # fmt: skip
    assert bad.exit_code == 2 and "--efficiency" in bad.output


def test_plan_takes_the_efficiency_given_over_the_workloads():
    w = workload_from_dict(gpt(compute={"efficiency": 0.3}))
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": 1, "gpu_hour_usd": 2}]}
    )
    own, _ = plan(w, cand)
    forced, _ = plan(w, cand, force_efficiency=0.6)
    assert forced[0].result.step_time_s < own[0].result.step_time_s


def test_utilisation_is_against_the_datasheet_when_a_gpu_is_slowed():
    healthy = load_topology("dgx-h100", nodes=1)
    slowed = load_topology("dgx-h100", nodes=1, faults=["gpu:n0.gpu3:slow=2"])
    a, b = _evaluate(healthy, gpt()), _evaluate(slowed, gpt())
    assert b.step_time_s > a.step_time_s
    assert b.mfu == pytest.approx(a.mfu * a.step_time_s / b.step_time_s)
    assert b.peak_flops == pytest.approx(a.peak_flops)


def test_the_des_engine_times_the_calibrated_links(tmp_path):
    from collsim.calibration.fit import fit_samples
    from collsim.calibration.report import dataset_samples

    h100 = [s for s in dataset_samples() if s.name.startswith("h100-8gpu-together-ring-all_r")]
    prof = tmp_path / "h100.yaml"
    fit_samples(h100).save(prof)
    out = {}
    for extra in ([], ["--profile", str(prof)]):
        js = tmp_path / f"s{len(extra)}.json"
        args = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1",
                "--engine", "des", "--json", str(js), *extra]  # fmt: skip
        assert CliRunner().invoke(cli, args).exit_code == 0
        import json

        out[bool(extra)] = json.loads(js.read_text())["breakdown"]["dp_comm"]
    assert out[True] != pytest.approx(out[False])


def test_the_des_engine_chooses_with_the_profile_counted_once(tmp_path):
    """With a profile the des engine runs on the calibrated links, and the tuner that picks its
    algorithm prices the topology's own links under the profile's parameters -- the same
    prediction as the analytic timer's, not the profile applied twice."""
    from collsim.calibration.fit import fit_samples
    from collsim.calibration.report import dataset_samples

    h100 = [s for s in dataset_samples() if s.name.startswith("h100-8gpu-together-ring-all_r")]
    prof = fit_samples(h100)
    topo = load_topology("dgx-h100", nodes=1)
    gpus = [g.name for g in topo.gpus]
    params = prof.params()
    des = make_timer("des", topo, params=params, simulated=prof.apply_to_topology(topo))
    analytic = make_timer("analytic", topo, params=params)
    size = 64 << 20
    assert des.choose("all_reduce", gpus, size, "nccl")[1] == pytest.approx(
        analytic.choose("all_reduce", gpus, size, "nccl")[1], rel=1e-12
    )
    # and the engine times the scaled links: slower than the datasheet's
    plain = make_timer("des", topo)
    assert des.time_s("all_reduce", gpus, size) > plain.time_s("all_reduce", gpus, size)


def test_fp32_activations_take_twice_the_bytes_of_16_bit_ones():
    m = workload_from_dict(gpt()).model
    half = layer_costs(m, tp=1, sequence_parallel=False, recompute="none", elem_bytes=2)
    full = layer_costs(m, tp=1, sequence_parallel=False, recompute="none", elem_bytes=4)
    assert full.act_bytes == pytest.approx(2 * half.act_bytes)
    # FP8 keeps 16-bit activations: the step model passes its 16-bit value type (test_step_numbers)
    assert workload_from_dict(gpt(dtype="fp8")).value_dtype == "bf16"


def test_moe_capacity_pads_the_all_to_all_and_the_experts():
    def costs(cf):
        model = workload_from_dict(
            gpt(model={**MOE, "experts": {**MOE["experts"], "capacity_factor": cf}})
        ).model
        return layer_costs(model, tp=1, sequence_parallel=False, recompute="none",
                           elem_bytes=2, moe=True)  # fmt: skip

    one, padded = costs(1.0), costs(1.25)
    assert padded.moe_tokens_bytes == pytest.approx(1.25 * one.moe_tokens_bytes)
    assert padded.fwd_flops > one.fwd_flops


def test_zero_shards_expert_state_over_the_expert_data_parallel_group_only(dgx):
    """16 GPUs, 8 experts: with ep 8 each GPU holds one expert, whose state ZeRO shards over the
    2 GPUs holding that expert; with ep 1 each holds all 8, sharded 16 ways. Either way the
    optimizer state per GPU is the same, while the weights shrink with ep."""

    def moe(ep):
        return _evaluate(dgx, gpt(model={**MOE}, global_batch=32, micro_batch=1,
                                  parallel={"tp": 1, "pp": 1, "ep": ep, "zero": 1}))  # fmt: skip

    one, eight = moe(1), moe(8)
    assert eight.memory.weights < 0.5 * one.memory.weights
    assert eight.memory.optimizer == pytest.approx(one.memory.optimizer)


def test_weak_scaling_grows_the_batch_from_the_first_size_that_runs():
    topo = load_topology("selene", nodes=16)
    w = load_workload("gpt3-175b")  # TP8 x PP8: no layout on 4 nodes (32 GPUs)
    model = StepModel(topo, make_timer("analytic", topo))
    _, results, skipped = scale_workload(model, w, [4, 8, 16], "weak")
    assert skipped and skipped[0].startswith("4 node")
    base = model.evaluate(w, 64)
    assert results[0].step_time_s == pytest.approx(base.step_time_s)
    assert results[0].tokens_per_step == base.tokens_per_step


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("step_time_s\n1.0\n-3\n", "positive"),
        ("step_time_s\nnan\n", "positive"),
        ("a,step_time_s\n1\n", "no step_time_s value"),
        ("step_time_s,step_time_s\n1.0,2.0\n", "2 columns named step_time_s"),
    ],
)
def test_bad_measured_step_times_are_one_line_errors(tmp_path, text, words):
    path = tmp_path / "m.csv"
    path.write_text(text)
    args = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1", "--measured", str(path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and words in result.output and str(path) in result.output


@pytest.mark.parametrize(
    "cluster",
    [
        {"topology": "dgx-h100", "nodes": [], "gpu_hour_usd": 2},
        {"topology": "dgx-h100", "nodes": 1, "gpu_hour_usd": math.inf},
    ],
)
def test_bad_candidates_are_refused(cluster):
    with pytest.raises(Exception) as err:
        CandidatesIn.model_validate({"clusters": [cluster]})
    assert "nodes" in str(err.value) or "gpu_hour_usd" in str(err.value)


def test_plan_says_why_layouts_cannot_run():
    w = workload_from_dict(gpt(global_batch=30))  # 30 sequences do not split over 4 replicas
    cand = CandidatesIn.model_validate(
        {"tokens": 1e9, "clusters": [{"topology": "dgx-h100", "nodes": [1, 1], "gpu_hour_usd": 2}],
         "search": {"tp": [1, 2]}}
    )  # fmt: skip
    options, rejected = plan(w, cand)
    assert len({o.nodes for o in options}) == len(options)  # node 1 listed twice: tried once
    assert "global_batch" in rejected.summary()


def test_capacity_padding_is_time_not_model_flops(dgx):
    def run(cf):
        model = {**MOE, "experts": {**MOE["experts"], "capacity_factor": cf}}
        return _evaluate(dgx, gpt(model=model, parallel={"ep": 8}))

    tight, padded = run(1.0), run(2.0)
    assert padded.model_flops == pytest.approx(tight.model_flops)
    assert padded.step_time_s > tight.step_time_s and padded.mfu < tight.mfu


def test_the_optimizer_step_updates_the_expert_state_each_gpu_owns(dgx):
    def run(ep):
        return _evaluate(dgx, gpt(model={**MOE}, global_batch=32, micro_batch=1,
                                  parallel={"ep": ep, "zero": 1}))  # fmt: skip

    assert run(8).breakdown["optimizer"] == pytest.approx(run(1).breakdown["optimizer"])


def test_outputs_never_overwrite_inputs(tmp_path):
    measured = tmp_path / "m.csv"
    measured.write_text("step_time_s\n2.2\n")
    args = ["step", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1",
            "--measured", str(measured), "--json", str(measured)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "would overwrite an input" in result.output
    assert measured.read_text() == "step_time_s\n2.2\n"


def test_plan_calibrates_only_the_clusters_of_the_profiles_system(tmp_path):
    from collsim.calibration.fit import fit_samples
    from collsim.calibration.report import dataset_samples

    prof = tmp_path / "h100.yaml"
    fit_samples([s for s in dataset_samples() if s.name.startswith("h100-8gpu")][:1]).save(prof)
    from collsim.cli.step import load_profile

    params, _ = load_profile(str(prof))
    cand = CandidatesIn.model_validate({"tokens": 1e9, "clusters": [
        {"topology": "dgx-h100", "nodes": 1, "gpu_hour_usd": 2},
        {"topology": "dgx-a100", "nodes": 1, "gpu_hour_usd": 1}]})  # fmt: skip
    options, rejected = plan(workload_from_dict(gpt()), cand, params=params, profile=str(prof))
    assert {o.topology for o in options} == {"dgx-h100", "dgx-a100"}
    assert any("dgx-a100: not calibrated" in n for n in rejected.notes)


def test_two_outputs_on_one_path_are_refused(tmp_path):
    """--plot and --json on one file: the second would silently replace the first."""
    out = tmp_path / "s.png"
    args = ["scale", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100", "--nodes", "1,2",
            "--plot", str(out), "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "'--json'" in result.output and "--plot" in result.output
    assert not out.exists()


def test_zero3_holds_a_gathered_layer_and_its_prefetch(tmp_path):
    """Four 51.5B-parameter layers under FSDP on 512 GPUs: the shards are small, but a layer is
    gathered whole (103 GB in bf16) while the next is prefetched, so it cannot fit in 80 GB;
    it used to be reported as fitting in 9.9 GB."""
    spec = tmp_path / "fat.yaml"
    spec.write_text(
        "name: fat-layers\n"
        "model: {layers: 4, hidden: 65536, heads: 512, vocab: 32000, seq_len: 512,"
        " flash_attention: true}\n"
        "global_batch: 512\nmicro_batch: 1\ndtype: bf16\n"
        "parallel: {tp: 1, pp: 1, fsdp: true}\nrecompute: full\n"
    )
    result = CliRunner().invoke(cli, ["step", "-w", str(spec), "-t", "dgx-h100", "--nodes", "64"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("memory per GPU"))
    assert "DOES NOT FIT" in line
    weights = float(line.split("weights ")[1].split(",")[0])
    assert weights == pytest.approx(2 * 51.5e9 * 2 / 1e9 + 0.8, rel=0.03)


@pytest.mark.parametrize(
    ("parallel", "words"),
    [
        ({"schedule": "interleaved", "virtual_stages": 4}, "needs pp > 1"),
        ({"fsdp": True, "zero": 1}, "zero: 1 contradicts it"),
    ],
)
def test_contradictory_layouts_are_refused(parallel, words):
    """Both used to be accepted silently (v4 printed in a 1-stage layout; fsdp taken as ZeRO-3)."""
    with pytest.raises(WorkloadError, match=words):
        workload_from_dict({"name": "x", "model": {"layers": 2, "hidden": 64, "heads": 4,
                            "seq_len": 16}, "global_batch": 8, "parallel": parallel})  # fmt: skip


def test_a_generic_job_counts_samples_not_tokens():
    """resnet50's throughput was printed in tokens/s."""
    result = CliRunner().invoke(cli, ["step", "-w", "resnet50", "-t", "dgx-a100", "--nodes", "1"])
    line = next(x for x in result.output.splitlines() if x.startswith("throughput"))
    assert line.endswith("samples/s")


def test_scale_json_has_what_the_table_shows(tmp_path):
    """scale --json held no layout or breakdown per point, unlike its printed table."""
    out = tmp_path / "s.json"
    result = CliRunner().invoke(cli, ["scale", "-w", "gpt-1.3b-ddp", "-t", "dgx-h100",
                                      "--nodes", "1,2", "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())["points"]
    assert [p["layout"] for p in points] == ["tp1-pp1-dp8-mb8", "tp1-pp1-dp16-mb8"]
    assert all(p["breakdown"]["compute"] > 0 for p in points)


def test_interleaving_takes_layers_that_do_not_divide_evenly(dgx):
    """Llama 3 405B runs 126 layers on 16 interleaved stages; collsim refused any layer count
    not divisible by pp x virtual_stages. Stages now take one layer more or less, and the
    slowest sets the pace: 30 layers on 4 stages (8, 8, 7, 7) take as long per micro-batch as
    32 (8 each) less a little bubble, and longer than 28 (7 each)."""

    def step(layers: int) -> float:
        par = {"pp": 4, "schedule": "interleaved", "virtual_stages": 2}
        w = gpt(model={"layers": layers}, global_batch=16, micro_batch=1, parallel=par)
        return _evaluate(dgx, w, 4).step_time_s

    t28, t30, t32 = step(28), step(30), step(32)
    assert t28 < t30 <= t32


def test_tensor_parallel_overlap_hides_what_compute_covers(dgx):
    """`tp_overlap` (Transformer Engine userbuffers) hides sequence parallelism's collectives
    behind the layers' GEMMs: less TP time exposed, at most all of it, compute unchanged; and,
    as in Megatron-LM, it needs sequence parallelism."""
    par = {"tp": 8, "pp": 1, "sequence_parallel": True}
    base = gpt(global_batch=16, micro_batch=1, parallel=par)
    plain = _evaluate(dgx, base, 16)
    hidden = _evaluate(dgx, gpt(**{**base, "parallel": {**par, "tp_overlap": True}}), 16)
    tp, compute = plain.breakdown["tp_comm"], plain.breakdown["compute"]
    assert tp > 0
    assert max(0.0, tp - compute) <= hidden.breakdown["tp_comm"] < tp
    assert hidden.breakdown["compute"] == pytest.approx(compute)
    assert hidden.step_time_s == pytest.approx(
        plain.step_time_s - (tp - hidden.breakdown["tp_comm"])
    )
    with pytest.raises(WorkloadError, match="tp_overlap needs tp > 1 and sequence_parallel"):
        _evaluate(dgx, gpt(**{**base, "parallel": {"tp": 8, "tp_overlap": True}}), 16)


def test_zero_1_and_2_default_to_megatron_core_buckets(dgx):
    """ZeRO-1/2 took PyTorch DDP's 25 MB bucket: at large DP, hundreds of reduce-scatters each
    paying a ring's latency. Unset, the bucket is Megatron-Core's max(40M, 1M x DP) parameters
    for a distributed optimizer; DDP keeps 25 MB; a given bucket is used as given."""
    from collsim.training.workload import workload_from_dict

    w = workload_from_dict(gpt())
    assert w.training.bucket is None
    assert w.training.bucket_bytes(0, 128, 4) == 25_000_000
    assert w.training.bucket_bytes(1, 16, 4) == 40_000_000 * 4
    assert w.training.bucket_bytes(2, 128, 2) == 128_000_000 * 2
    assert w.training.bucket_bytes(3, 128, 2) == 25_000_000
    given = workload_from_dict(gpt(training={"bucket": "8MB"}))
    assert given.training.bucket_bytes(1, 128, 4) == 8_000_000

    from collsim.training.workload import DTYPE_BYTES

    def dp(bucket: int | None) -> float:
        tr = {"dp_overlap": True, **({"bucket": bucket} if bucket else {})}
        w = gpt(global_batch=16, micro_batch=1, training=tr, parallel={"zero": 1})
        return _evaluate(dgx, w, 16).breakdown["dp_comm"]  # DP 16

    elem = DTYPE_BYTES[workload_from_dict(gpt(parallel={"zero": 1})).grad_dtype]
    assert dp(None) == dp(40_000_000 * elem) != dp(25_000_000)


def test_uneven_stages_keep_the_end_stages_lighter():
    """The first stage holds the embedding and the most activations, the last the logits: the
    layers that do not divide evenly go to the middle stages, as Llama 3 405B's 126 layers on 16
    stages (7 on the first and last, 8 elsewhere); they went to the first stages."""
    from collsim.training.step import stage_layer_counts

    assert stage_layer_counts(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layer_counts(30, 4) == [7, 8, 8, 7]
    assert stage_layer_counts(7, 3) == [2, 3, 2] and stage_layer_counts(5, 2) == [3, 2]
    assert sum(stage_layer_counts(1001, 64)) == 1001


def test_default_buckets_hold_compressed_gradients():
    from collsim.training.workload import workload_from_dict

    w = workload_from_dict(gpt(training={"compression": {"ratio": 4}}))
    assert w.training.bucket_bytes(0, 8, 4) == 25_000_000 // 4
    assert w.training.bucket_bytes(1, 8, 4) == 40_000_000
    given = workload_from_dict(gpt(training={"bucket": "8MB", "compression": {"ratio": 4}}))
    assert given.training.bucket_bytes(1, 8, 4) == 8_000_000
