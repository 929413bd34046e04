"""Kernel times from shapes: a transformer layer's GEMMs priced by their (m, n, k) per GPU.

One constant GEMM efficiency cannot tell a TP8 layer at micro-batch 1 (narrow matrices, few
tiles per SM) from a TP1 layer at micro-batch 4. Here each GEMM of a layer, after tensor,
sequence and context parallelism shard it, is timed as

    ``max(2 m n k / (rate x shape_efficiency), bytes / memory bandwidth)``

* ``rate``: the GPU's measured best matmul rate in the GEMM's dtype times the step model's
  calibrated efficiency (what frameworks lose around the kernels);
* ``shape_efficiency`` (:func:`gemm_efficiency`): a GEMM runs as output tiles of ``tm x tn``,
  one per SM at a time; a partial last tile computes padding (tile quantisation) and a partial
  last wave leaves SMs idle (wave quantisation), both as NVIDIA's "Matrix Multiplication
  Background User's Guide" (Deep Learning Performance documentation, sections "Tile
  Quantization" and "Wave Quantization") describes them: efficiency = ``m n / (waves x SMs x
  tm x tn)``. cuBLAS's heuristics pick among tile shapes; the best of :data:`TILES` is taken.
  The measured best matmul rate is reached at shapes whose waves are full, so the surface is
  relative to it (1 for large, well-shaped GEMMs);
* the roofline's memory side: the operands and the result cross HBM once
  (``(m k + k n + m n) x bytes per element``), what bounds skinny GEMMs.

The backward of ``Y = X W`` (X: m x k, W: k x n) runs two GEMMs of the forward's FLOPs on other
shapes: the input gradient ``dX = dY W^T`` (m x k from n) and the weight gradient
``dW = X^T dY`` (k x n from m): :func:`layer_gemms` lists all three per linear layer.

A layer also cannot run faster than its kernels can be launched: with eager PyTorch each of its
~:data:`KERNELS_PER_LAYER` kernels costs the launching CPU thread ``HOST_LAUNCH_S``, so
:func:`launch_floor_s` bounds a layer's forward and backward from below (it binds only for
small layers; the GPU otherwise runs ahead of the CPU's launches).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from collsim.model.params import HOST_LAUNCH_S
from collsim.training.transformer import ffn_width, kv_width
from collsim.training.workload import TransformerIn

TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128))
"""Output tile shapes (rows x columns of C) cuBLAS's large-GEMM kernels use: 256x128 is the
guide's example tile for A100 FP16 GEMMs; 128x256 and 128x128 are the other CUTLASS defaults on
Ampere and Hopper (CUTLASS profiler kernel names). Blackwell's 2-SM tiles (256 x 256 over a pair
of SMs) have the same area per SM as 128x256."""

KERNELS_PER_LAYER = (20, 40)
"""Kernels one transformer layer launches forward and backward with Megatron-LM / Transformer
Engine (4 linear GEMMs, norms, rotary embedding, attention, activation, bias/dropout/residual,
casts; the backward about twice as many): an a-priori count, not fitted."""


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply ``C (m x n) = A (m x k) B (k x n)``, run ``count`` times."""

    m: float
    n: float
    k: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def gemm_efficiency(m: float, n: float, sms: int | None) -> float:
    """Share of the best matmul rate a GEMM with an ``m x n`` output reaches: tile and wave
    quantisation, best over :data:`TILES` (1 without an SM count: no quantisation modelled)."""
    if sms is None or m <= 0 or n <= 0:
        return 1.0
    best = 0.0
    for tm, tn in TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / sms)
        best = max(best, m * n / (waves * sms * tm * tn))
    return best


def gemm_seconds(
    g: Gemm, rate_flops_s: float, mem_bw_bytes_s: float, elem_bytes: float, sms: int | None
) -> float:
    """Roofline time of ``g`` (all ``count`` runs): compute at ``rate x`` its shape's efficiency,
    or its operands' and result's HBM traffic, whichever is longer."""
    if g.count <= 0 or g.m <= 0 or g.n <= 0 or g.k <= 0:
        return 0.0
    compute = 2.0 * g.m * g.n * g.k / (rate_flops_s * gemm_efficiency(g.m, g.n, sms))
    memory = (g.m * g.k + g.k * g.n + g.m * g.n) * elem_bytes / mem_bw_bytes_s
    return g.count * max(compute, memory)


def backward(g: Gemm) -> tuple[Gemm, Gemm]:
    """The input gradient (``m x k`` from ``n``) and weight gradient (``k x n`` from ``m``)."""
    return Gemm(g.m, g.k, g.n, g.count), Gemm(g.k, g.n, g.m, g.count)


def layer_gemms(
    model: TransformerIn, *, tokens: float, tp: int, moe: bool = False, ep: int = 1
) -> list[Gemm]:
    """The forward linear GEMMs of one layer on one tensor-parallel rank, for ``tokens`` rows
    (micro-batch x sequence / context parallelism; with sequence parallelism the input is
    all-gathered to these rows first): QKV (column-parallel), output projection (row-parallel),
    the MLP's up (and gate) and down projections. An MoE layer's experts: each of the
    ``count / ep`` experts on this GPU runs its MLP on its share of the tokens of all ``ep``
    ranks (top-k copies, padded or imbalanced by the load factor) -- a grouped GEMM of that many
    small problems."""
    h, kv, f = model.hidden, kv_width(model), ffn_width(model)
    up = (2 if model.gated_mlp else 1) * f
    out = [Gemm(tokens, (h + 2 * kv) / tp, h), Gemm(tokens, h, h / tp)]
    if moe and model.experts is not None:
        e = model.experts
        rows = tokens * ep * e.top_k * e.load_factor / e.count
        local = e.count // ep
        out += [Gemm(rows, up / tp, h, local), Gemm(rows, h, f / tp, local)]
    else:
        out += [Gemm(tokens, up / tp, h), Gemm(tokens, h, f / tp)]
    return out


def linear_seconds(
    gemms: Iterable[Gemm],
    rate_flops_s: float,
    mem_bw_bytes_s: float,
    elem_bytes: float,
    sms: int | None,
) -> tuple[float, float]:
    """Forward and backward seconds of ``gemms`` (the backward: both gradients of each)."""
    fwd = bwd = 0.0
    for g in gemms:
        fwd += gemm_seconds(g, rate_flops_s, mem_bw_bytes_s, elem_bytes, sms)
        bwd += sum(gemm_seconds(b, rate_flops_s, mem_bw_bytes_s, elem_bytes, sms)
                   for b in backward(g))  # fmt: skip
    return fwd, bwd


def launch_floor_s(layers: float) -> tuple[float, float]:
    """The shortest forward and backward ``layers`` can take, kernel launches being serial on
    the launching CPU thread (:data:`KERNELS_PER_LAYER` x ``HOST_LAUNCH_S`` each)."""
    fwd, bwd = KERNELS_PER_LAYER
    return layers * fwd * HOST_LAUNCH_S, layers * bwd * HOST_LAUNCH_S


def stage_linear_seconds(
    model: TransformerIn,
    *,
    tokens: float,
    tp: int,
    ep: int,
    dense_layers: int,
    moe_layers: int,
    rate_flops_s: float,
    mem_bw_bytes_s: float,
    elem_bytes: float,
    sms: int | None,
) -> tuple[float, float]:
    """Forward and backward seconds of the linear GEMMs of a pipeline stage's layers (dense and
    MoE) for ``tokens`` rows each: :func:`layer_gemms` priced by :func:`linear_seconds`."""
    fwd = bwd = 0.0
    for count, moe in ((dense_layers, False), (moe_layers, True)):
        if count <= 0:
            continue
        gemms = layer_gemms(model, tokens=tokens, tp=tp, moe=moe, ep=ep)
        f, b = linear_seconds(gemms, rate_flops_s, mem_bw_bytes_s, elem_bytes, sms)
        fwd += count * f
        bwd += count * b
    return fwd, bwd


FLASH_FRACTIONS: tuple[tuple[tuple[str, ...], tuple[float, float]], ...] = (
    (("GB300", "B300"), (0.75, 0.65)),
    (("GB200", "B200"), (0.71, 0.62)),
    ((), (0.75, 0.65)),
)
"""Forward and backward fused-attention rates (cuDNN's, what Transformer Engine runs) as
fractions of the GPU's best 16-bit matmul, for long sequences and head dimension 128, by GPU
model name (first match; the last row is the default):

* Hopper and earlier: on an H100 SXM at sequence 8k, cuDNN's backward runs at 518 TFLOP/s and
  FlashAttention-3's forward at 614 (Shah et al. 2024, arXiv:2407.08608, Fig. 5-6; pytorch/
  benchmark commit ff65cb67), 0.65 and 0.77 of the H100's best BF16 matmul (794.5): 0.75 forward
  (cuDNN a little under FlashAttention-3), 0.65 backward. FlashAttention-2 on an A100 reaches
  50-73% of the peak (Dao 2023, arXiv:2307.08691), about the same fractions of its best matmul.
* Blackwell (B200, GB200): the tensor cores doubled but not the exponential units, so the
  forward is bound by the softmax's exponentials (FlashAttention-4, Dao-AILab and Together AI,
  2026): it reaches 1,613 TFLOP/s on a B200, 1.3x cuDNN 9.13, so cuDNN ~1,240 = 0.71
  of the B200's best matmul (1,745); the backward keeps Hopper's cuDNN backward/forward ratio
  (0.87): 0.62.
* Blackwell Ultra (B300, GB300) doubles the exponential throughput ("2x attention-layer
  acceleration", NVIDIA, "Inside NVIDIA Blackwell Ultra", 2025): the softmax bound lifts, Hopper's
  fractions apply."""


def flash_fractions(gpu_model: str) -> tuple[float, float]:
    """:data:`FLASH_FRACTIONS` for a GPU model name (the last row matches any)."""
    return next(
        f for names, f in FLASH_FRACTIONS if not names or any(n in gpu_model for n in names)
    )


FLASH_HALF_SEQ = 256
"""Sequence length at which the attention kernel runs at half its long-sequence rate: the same
benchmark's forward at 512 tokens (430 TFLOP/s) and 2k (566) fit ``s / (s + 256)`` within 2%."""


def attention_seconds(
    core_flops: float,
    seq: float,
    head_dim: float,
    matmul_flops_s: float,
    fractions: tuple[float, float] = FLASH_FRACTIONS[-1][1],
    causal: bool = True,
) -> tuple[float, float]:
    """Forward and backward seconds of a FlashAttention core of ``core_flops`` forward FLOPs
    (``4 s^2 h`` per sequence, the whole score matrix) at query length ``seq``: a causal mask
    skips half of the blocks, and the kernel runs at ``fractions`` (:func:`flash_fractions`,
    forward and backward) of the 16-bit
    best matmul ``matmul_flops_s``, less at short sequences (:data:`FLASH_HALF_SEQ`) and small
    heads (head dimension 64: 0.8 of 128's rate, FlashAttention-3's forward tables)."""
    if core_flops <= 0:
        return 0.0, 0.0
    flops = core_flops / 2 if causal else core_flops
    shape = seq / (seq + FLASH_HALF_SEQ) * min(1.0, 0.6 + 0.4 * head_dim / 128)
    fwd_frac, bwd_frac = fractions
    return (
        flops / (fwd_frac * shape * matmul_flops_s),
        2 * flops / (bwd_frac * shape * matmul_flops_s),
    )
