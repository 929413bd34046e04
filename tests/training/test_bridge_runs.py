"""Megatron-Bridge's published tables -> workloads, topologies and measured step times."""

from __future__ import annotations

import pytest

from collsim.errors import CollsimError
from collsim.training.bridge_runs import bridge_measured_s, bridge_workload, recipe_of, topology_of
from collsim.training.reference import Predictor, load_runs, to_reference

RAW = {r["id"]: r for r in load_runs()}


def test_measured_step_time_from_tokens_per_gpu():
    """25.11, DGX-H100, Llama 3.1 405B on 1024 GPUs: GBS 512 x 8192 tokens at 292 tokens/s
    per GPU = 4,194,304 / (292 x 1024) = 14.03 s a step."""
    r = RAW["bridge-25.11-dgx-h100-llama3.1-405b-1024gpu-fp8-cs"]
    assert bridge_measured_s(r) == pytest.approx(512 * 8192 / (292 * 1024))
    assert bridge_measured_s(r) == pytest.approx(14.03, abs=0.01)


def test_tokens_and_model_tflops_tell_one_flop_count_per_model():
    """Each row publishes tokens/s and model TFLOP/s per GPU; their ratio, the FLOPs per token
    the tables count, is one number per model to within 3.5% (the worst rows disagree by 3%).
    The step time is taken from the tokens, so the tables' FLOP convention (NeMo's formula
    counts the causal attention core at half of Megatron-LM's ``4 s^2 h``) does not enter."""
    per_model: dict[str, list[float]] = {}
    for r in RAW.values():
        if r["source_group"] != "megatron-bridge-perf":
            continue
        m = r["metrics"]
        per_model.setdefault(r["model_name"], []).append(
            m["tflops_per_gpu"] * 1e12 / m["tokens_per_s_per_gpu"]
        )
    assert set(per_model) == {"LLAMA3_8B", "LLAMA3_70B", "LLAMA3.1_405B"}
    for name, values in per_model.items():
        assert max(values) / min(values) < 1.035, name


def test_layout_and_recipe_of_a_bridge_run():
    r = RAW["bridge-26.02-dgx-gb300-llama3.1-405b-256gpu-mxfp8"]
    w = to_reference(r).workload
    p = w.parallel
    assert (p.tp, p.pp, p.cp, p.dp, p.virtual_stages) == (2, 8, 2, 8, 4)
    assert p.sequence_parallel and p.tp_overlap and p.zero == 1 and not p.fsdp
    assert (w.dtype, w.recipe, w.value_dtype) == ("fp8", "mxfp8", "bf16")
    assert w.model.gated_mlp and not w.model.tied_embeddings and w.model.kv_heads == 8
    fsdp = to_reference(RAW["bridge-26.02-dgx-gb200-llama3-70b-64gpu-fp8"]).workload.parallel
    assert fsdp.fsdp and fsdp.zero == 0 and fsdp.tp == 1
    nvfp4 = to_reference(RAW["bridge-26.02-dgx-gb200-llama3-70b-64gpu-nvfp4"]).workload
    assert (nvfp4.dtype, nvfp4.recipe) == ("fp4", "nvfp4")
    # The 25.09 tables have no precision column: FP8 current scaling (bridge_runs.RECIPES).
    assert recipe_of(RAW["bridge-25.09-dgx-h100-llama3-8b-8gpu-na"]) == "fp8-cs"


def test_each_system_runs_on_its_catalog_topology_sized_to_the_run():
    pred = Predictor()
    run = to_reference(RAW["bridge-26.02-dgx-gb200-llama3-70b-64gpu-fp8"])
    assert run.system == "gb200-nvl72"
    topo = pred.model(run.n_gpus, run.system).topology
    assert topo.n_gpus == 64 and topo.name.startswith("gb200")
    assert pred.model(1024, "dgx-h100").topology.n_gpus == 1024


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("system", "DGX-Z9000", "no catalog topology for system 'DGX-Z9000'"),
        ("precision", "FP2", "unknown precision 'FP2'"),
    ],
)
def test_a_bad_record_names_the_run_and_the_field(field, value, needle):
    r = dict(RAW["bridge-26.02-dgx-gb200-llama3-70b-64gpu-fp8"], **{field: value})
    with pytest.raises(CollsimError) as err:
        topology_of(r) if field == "system" else bridge_workload(r)
    assert needle in str(err.value) and r["id"] in str(err.value)
    assert err.value.field == field


def test_a_record_without_tokens_per_gpu_is_refused():
    r = dict(RAW["bridge-26.02-dgx-gb200-llama3-70b-64gpu-fp8"])
    r["metrics"] = dict(r["metrics"], tokens_per_s_per_gpu=None)
    with pytest.raises(CollsimError, match="tokens_per_s_per_gpu"):
        bridge_measured_s(r)


def test_a_vp_column_reading_na_takes_the_recipes_default():
    """The one PP > 1 row whose VP column reads n/a runs the recipe's VP (5 for Llama 3 70B at
    PP4, what every other release prints); a row that prints its VP keeps it."""
    raw = {r["id"]: r for r in load_runs()}
    na = bridge_workload(raw["bridge-26.02.01-dgx-gb300-llama3-70b-64gpu-mxfp8"])["parallel"]
    assert (na["pp"], na["virtual_stages"], na["schedule"]) == (4, 5, "interleaved")
    printed = bridge_workload(raw["bridge-26.04.01-dgx-gb300-llama3-70b-64gpu-mxfp8"])["parallel"]
    assert printed["virtual_stages"] == 5
    tp1 = bridge_workload(raw["bridge-26.04-dgx-gb300-llama3-70b-64gpu-fp8"])["parallel"]
    assert (tp1["pp"], tp1["virtual_stages"]) == (1, 1)
