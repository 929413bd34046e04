"""Megatron-Bridge's published pre-training tables (``source_group: megatron-bridge-perf`` in
``data/steptime/runs.json``) -> workloads on catalog topologies, and their measured step times.

The tables (github.com/NVIDIA-NeMo/Megatron-Bridge, ``docs/performance-summary*.md``) give, per
NeMo container release, system and model: GPUs, precision, global and micro batch, sequence
length, FSDP, TP, PP, CP, VP, EP, tokens/s/GPU and "Model TFLOP/sec/GPU". The step time follows
from the tokens: ``t = global_batch x seq_len / (tokens/s/GPU x GPUs)``.

What the tables leave unstated is filled in the same way for every run (:data:`BRIDGE_ASSUMPTIONS`),
never per run to improve a fit.
"""

from __future__ import annotations

from typing import Any

from collsim.errors import CollsimError

BRIDGE_GROUP = "megatron-bridge-perf"

SYSTEM_TOPOLOGY = {
    "DGX-H100": "dgx-h100",
    "DGX-B200": "hgx-b200",
    "DGX-GB200": "gb200-nvl72",
    "DGX-GB300": "gb300-nvl72",
}
"""Catalog topology of each system the tables name (a DGX B200 is the HGX B200 board: 8 B200,
NVLink 5 through NVSwitch, 8 x 400G ConnectX-7)."""

RECIPES = {
    "FP8": "fp8",
    "FP8-CS": "fp8-cs",
    "FP8-CS (FP8-MX)": "fp8-cs",
    "MXFP8": "mxfp8",
    "NVFP4": "nvfp4",
    None: "fp8-cs",
}
"""The table's precision column -> recipe: ``fp8`` delayed scaling (Transformer Engine's
``DelayedScaling``), ``fp8-cs`` per-tensor current scaling, ``mxfp8`` block-scaled FP8 (32-element
blocks, Blackwell), ``nvfp4`` block-scaled FP4. The 25.09 tables have no precision column, but
their rows print a second figure in parentheses for "an alternative quantization granularity",
as the 25.11 tables do for ``FP8-CS (FP8-MX)``, and their figures match those rows within 2%:
they are FP8 current scaling."""

RECIPE_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp8-cs": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
"""Workload ``dtype`` each recipe runs its linear layers' GEMMs at."""

RECIPE_VP = {("LLAMA3_70B", 4): 5}
"""Virtual pipeline stages of a row whose VP column reads ``n/a`` with PP > 1 (one row: 26.02.01,
GB300, Llama 3 70B MXFP8, PP4 at micro-batch 2): the recipe's default, the 5 every other
release prints for that model at PP4 (its measured time, 6.83 s, is within 2% of the VP5
micro-batch-1 row's; without interleaving its 3/11 bubble would add ~30%)."""

BRIDGE_ASSUMPTIONS = (
    "Megatron-Bridge tables: model shapes from the records (Llama 3 / 3.1: SwiGLU MLP, grouped-"
    "query attention, untied embeddings, vocabulary 128,000, FlashAttention)",
    "sequence parallelism wherever TP > 1, and TP communication overlapped with the GEMMs "
    "(Megatron-Bridge's Llama recipes set sequence_parallel and tp_comm_overlap with TP > 1)",
    "DDP rows: Megatron's distributed optimizer (ZeRO-1: optimizer states sharded over DP) with "
    "gradient reduce-scatter and parameter all-gather overlapped (the recipes' "
    "overlap_grad_reduce / overlap_param_gather); 'Megatron FSDP' rows: ZeRO-3 sharding over DP",
    "no activation recomputation (the tables state none)",
    "a VP column reading n/a with PP > 1 is the recipe's default (RECIPE_VP)",
    "context parallelism as ring attention (Megatron-Core's default cp_comm_type 'p2p': K/V "
    "passed around the CP ring behind each step's attention)",
    "the 25.09 tables (no precision column) are FP8 current scaling (see RECIPES)",
)


def _need(r: dict[str, Any], field: str) -> Any:
    value = r.get(field)
    if value is None:
        raise CollsimError(
            f"run {r.get('id', '?')} has no {field}", field=field, value=r.get("id", "?")
        )
    return value


def topology_of(r: dict[str, Any]) -> str:
    """Catalog topology name of a Bridge record's system."""
    system = r.get("system")
    if system not in SYSTEM_TOPOLOGY:
        raise CollsimError(
            f"run {r.get('id', '?')}: no catalog topology for system {system!r} (known: "
            f"{', '.join(SYSTEM_TOPOLOGY)})",
            field="system",
            value=system,
        )
    return SYSTEM_TOPOLOGY[system]


def recipe_of(r: dict[str, Any]) -> str:
    """The precision recipe of a Bridge record (see :data:`RECIPES`)."""
    precision = r.get("precision")
    if precision not in RECIPES:
        raise CollsimError(
            f"run {r.get('id', '?')}: unknown precision {precision!r}",
            field="precision",
            value=precision,
        )
    return RECIPES[precision]


def bridge_workload(r: dict[str, Any]) -> dict[str, Any]:
    """The workload (as a workload-file dict) of a Bridge record."""
    n = int(_need(r, "num_gpus"))
    tp, pp = int(r.get("tp") or 1), int(r.get("pp") or 1)
    cp = int(r.get("cp") or 1)
    v = int(r.get("virtual_pipeline_stages") or RECIPE_VP.get((r.get("model_name"), pp), 1))
    fsdp = str(r.get("data_parallel_sharding") or "").startswith("Megatron FSDP")
    recipe = recipe_of(r)
    return {
        "name": r["id"],
        "model": {
            "layers": _need(r, "layers"),
            "hidden": _need(r, "hidden"),
            "heads": _need(r, "heads"),
            "kv_heads": r.get("kv_heads"),
            "ffn": r.get("ffn"),
            "gated_mlp": True,
            "vocab": r.get("vocab") or 128000,
            "seq_len": _need(r, "seq_len"),
            "tied_embeddings": False,
            "flash_attention": True,
        },
        "global_batch": int(_need(r, "global_batch_size")),
        "micro_batch": int(r.get("micro_batch_size") or 1),
        "dtype": RECIPE_DTYPE[recipe],
        "precision": recipe,
        "parallel": {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "cp_comm": "p2p",
            "dp": n // (tp * pp * cp),
            "schedule": "interleaved" if v > 1 else "1f1b",
            "virtual_stages": v,
            "sequence_parallel": tp > 1,
            "tp_overlap": tp > 1,
            "fsdp": fsdp,
            "zero": 0 if fsdp else 1,
        },
        "recompute": "none",
        "training": {"dp_overlap": True},
    }


def bridge_measured_s(r: dict[str, Any]) -> float:
    """Step time implied by the published tokens/s/GPU."""
    tok = _need(r, "metrics").get("tokens_per_s_per_gpu")
    if not tok:
        raise CollsimError(
            f"run {r['id']} has no tokens_per_s_per_gpu", field="metrics", value=r["id"]
        )
    return r["global_batch_size"] * r["seq_len"] / (float(tok) * int(r["num_gpus"]))
