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
    model: TransformerIn, *, tokens: float, tp: int, moe: bool = False, experts_local: int = 1
) -> list[Gemm]:
    """The forward linear GEMMs of one layer on one tensor-parallel rank, for ``tokens`` rows
    (micro-batch x sequence / context parallelism; with sequence parallelism the input is
    all-gathered to these rows first): QKV (column-parallel), output projection (row-parallel),
    the MLP's up (and gate) and down projections. An MoE layer's experts: each of its
    ``experts_local`` experts on this GPU runs its MLP on its share of the routed tokens (top-k
    copies, padded to the capacity factor) -- a grouped GEMM of that many small problems."""
    h = model.hidden
    kv = h if model.kv_heads is None else h * model.kv_heads // model.heads
    f = model.ffn if model.ffn is not None else 4 * h
    up = (2 if model.gated_mlp else 1) * f
    out = [Gemm(tokens, (h + 2 * kv) / tp, h), Gemm(tokens, h, h / tp)]
    if moe and model.experts is not None:
        e = model.experts
        rows = tokens * e.top_k * e.capacity_factor / e.count
        out += [Gemm(rows, up / tp, h, experts_local), Gemm(rows, h, f / tp, experts_local)]
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
        local = model.experts.count // ep if (moe and model.experts is not None) else 1
        gemms = layer_gemms(model, tokens=tokens, tp=tp, moe=moe, experts_local=local)
        if moe and model.experts is not None:  # tokens from all EP ranks reach local experts
            gemms = gemms[:2] + [Gemm(g.m * ep, g.n, g.k, g.count) for g in gemms[2:]]
        f, b = linear_seconds(gemms, rate_flops_s, mem_bw_bytes_s, elem_bytes, sms)
        fwd += count * f
        bwd += count * b
    return fwd, bwd
