"""Low-precision training recipes as Transformer Engine runs them: which work runs at the FP8/FP4
tensor-core rate, which stays in 16 bits, and what the quantisation costs.

Transformer Engine (TE) runs only the *linear layers* (QKV, attention output projection, the MLP's
matrices: ``te.Linear`` / ``LayerNormLinear`` / ``LayerNormMLP``) in FP8 or FP4, their forward
(fprop), data-gradient (dgrad) and weight-gradient (wgrad) GEMMs alike; the attention core
(FlashAttention / cuDNN fused attention) and the output layer and loss stay in BF16 (TE user
guide, "Using FP8 with Transformer Engine"; Megatron-Core keeps the output layer a plain BF16
``ColumnParallelLinear``; Micikevicius et al. 2022, "FP8 Formats for Deep Learning",
arXiv:2209.05433, section 4). Weights and activations are held in BF16 between the GEMMs
(:attr:`collsim.training.workload.WorkloadIn.value_dtype`).

Before each low-precision GEMM its 16-bit inputs are quantised by memory-bound kernels: read the
BF16 tensor (2 bytes an element), write the low-precision copy and, because the wgrad/dgrad GEMMs
need the other operand layout, a transposed (or column-wise quantised) copy. The scaling recipe
sets what more is read (:data:`CAST_BYTES_PER_ELEMENT`):

* ``fp8`` -- delayed scaling (TE ``DelayedScaling``): the scale comes from an amax history of
  earlier steps, so quantising is one pass: read 2 + write 1 + write 1 (transpose) = 4 bytes
  an element.
* ``fp8-cs`` -- per-tensor current scaling (``Float8CurrentScaling``): the tensor's own amax is
  computed first, one more read of the input: 6 bytes an element.
* ``mxfp8`` -- MXFP8 block scaling (``MXFP8BlockScaling``, Blackwell: one E8M0 scale per 32
  elements, row- and column-wise copies): read 2 + write 1 + 1 + scales 2/32 = 4.0625 bytes.
* ``nvfp4`` -- NVFP4 (``NVFP4BlockScaling``: FP4 E2M1 values, one FP8 scale per 16 elements,
  row- and column-wise copies; the wgrad inputs also pass a random Hadamard transform, one more
  read and write of the 16-bit tensor): read 2 + write 0.5 + 0.5 + scales 2/16 + 2 + 2 =
  7.125 bytes.

These byte counts are the kernels' minimum traffic read off the recipes' definitions (TE
``transformer_engine/common/recipe``), not measured times; the element counts per layer are in
:func:`cast_elements_per_token`.
"""

from __future__ import annotations

from typing import Any, Literal

Recipe = Literal["bf16", "fp16", "fp32", "tf32", "fp8", "fp8-cs", "mxfp8", "nvfp4"]

CAST_BYTES_PER_ELEMENT: dict[str, float] = {
    "fp8": 4.0,
    "fp8-cs": 6.0,
    "mxfp8": 4.0 + 2 / 32,
    "nvfp4": 2.0 + 0.5 + 0.5 + 2 / 16 + 4.0,
}
"""HBM bytes moved to quantise one 16-bit element for a low-precision GEMM (module docstring)."""

HIGH_PRECISION_LAYER_SHARE: dict[str, float] = {"nvfp4": 0.15}
"""Share of the linear layers a recipe keeps in 16 bits. NVFP4 pretraining keeps selected
layers (the last blocks) in BF16 for stability ("selective high-precision layers", NVIDIA,
"Pretraining Large Language Models with NVFP4", arXiv:2509.25149, 2025); collsim takes 0.15, an
assumption of the order that paper describes, not a fitted value. FP8 recipes quantise every
linear layer of the transformer blocks."""

LOW_PRECISION = frozenset({"fp8", "fp4"})
"""Training data types whose GEMMs run below 16 bits (the linear layers only)."""


def default_recipe(dtype: str) -> str:
    """The recipe a workload without ``precision`` runs: delayed-scaling FP8 for ``fp8`` (TE's
    default recipe), NVFP4 for ``fp4``, else the data type itself (no quantisation)."""
    return {"fp8": "fp8", "fp4": "nvfp4"}.get(dtype, dtype)


def linear_flops_per_s(recipe: str, low_flops_s: float, wide_flops_s: float) -> float:
    """Effective FLOP/s of the linear layers under ``recipe``: the low-precision rate, blended
    (harmonically, as their times add) with the 16-bit rate for the share the recipe keeps wide
    (:data:`HIGH_PRECISION_LAYER_SHARE`)."""
    share = HIGH_PRECISION_LAYER_SHARE.get(recipe, 0.0)
    return 1.0 / ((1.0 - share) / low_flops_s + share / wide_flops_s)


def cast_elements_per_token(
    hidden: int, kv_dim: int, ffn: int, gated: bool, tp: int, sequence_parallel: bool
) -> tuple[float, float]:
    """Elements quantised per token of one layer on one TP rank: (forward, backward).

    Forward, each linear layer's input: QKV's and the MLP's first matrix's (``h``; ``h / t`` with
    sequence parallelism, where TE quantises the local shard and all-gathers it in FP8), the
    projection's (``h / t``) and the MLP's second matrix's (``ffn / t``). Backward, each linear
    layer's output gradient: QKV's (``(h + 2 h_kv) / t``), the projection's and the second MLP
    matrix's (``h``, ``h / t`` with sequence parallelism) and the first MLP matrix's
    (``ffn / t``, twice for a gated MLP)."""
    full = hidden / tp if sequence_parallel else hidden
    fwd = 2 * full + hidden / tp + ffn / tp
    bwd = (hidden + 2 * kv_dim) / tp + 2 * full + (2 if gated else 1) * ffn / tp
    return fwd, bwd


def cast_seconds(
    model: Any, recipe: str, tp: int, sequence_parallel: bool, cp: int, micro: int, mem_bw: float
) -> tuple[float, float]:
    """Seconds of one layer's quantisation kernels for one micro-batch of ``micro`` sequences
    on one GPU (forward, backward): the recipe's bytes per element
    (:data:`CAST_BYTES_PER_ELEMENT`) over the elements its linear layers quantise
    (:func:`cast_elements_per_token`) at the HBM bandwidth ``mem_bw``; none for a 16-bit recipe.
    ``model`` is a transformer's workload section (hidden, heads, kv_heads, ffn, gated_mlp,
    seq_len)."""
    per_elem = CAST_BYTES_PER_ELEMENT.get(recipe)
    if per_elem is None:
        return 0.0, 0.0
    kv = model.hidden if model.kv_heads is None else model.hidden * model.kv_heads // model.heads
    ffn = model.ffn if model.ffn is not None else 4 * model.hidden
    fwd, bwd = cast_elements_per_token(
        model.hidden, kv, ffn, model.gated_mlp, tp, sequence_parallel
    )
    scale = micro * model.seq_len / cp * per_elem / mem_bw
    return fwd * scale, bwd * scale
