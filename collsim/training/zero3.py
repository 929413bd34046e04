"""ZeRO-3 / FSDP communication of one step, layer by layer (Rajbhandari et al. 2020, ZeRO,
arXiv:1910.02054, section 7; Zhao et al. 2023, PyTorch FSDP, arXiv:2304.11277).

Every data-parallel rank holds ``1/n`` of each parameter tensor. Per micro-batch, each layer's
weights are all-gathered before its forward and again before its backward (or its recomputed
forward), and its gradients are reduce-scattered after its backward: ``3 (n-1)/n`` bytes per
parameter byte, 1.5x data parallelism's all-reduce. DeepSpeed keeps tensors under
``training.persistence_threshold`` elements (biases, layer norms) whole on every rank, never
gathered, and with full recomputation gathers the tensors the recomputed forward released a
third time for the backward (:func:`regathered`: a GPT layer's first three matrices once
``8 h^2`` exceeds ``training.max_reuse_distance``). What makes ZeRO-3 slow at scale is not that
volume but its shape:

* **granularity**: the collectives are per layer, not per step. DeepSpeed (``zero: 3``) gathers
  every parameter tensor above the threshold with its own collective -- a GPT layer has 12: four
  weight matrices and eight bias / layer-norm vectors of ``h`` elements -- and reduce-scatters
  gradients in buckets of ``training.bucket`` bytes (a tensor larger than the bucket alone; the
  2021 code issued one per tensor: a bucket under the smallest tensor); FSDP (``fsdp: true``)
  flattens each layer into one unit: one all-gather and one reduce-scatter per layer. Each
  collective spans all ``n`` data-parallel ranks, across nodes: a ring's ``n - 1`` steps cost
  ``n - 1`` latencies, so at 1000+ ranks a bias vector's gather costs as much as milliseconds of
  compute, and a weight matrix's shard moves at the bandwidth the ring reaches at that size.
  Each collective is timed by the step model's timer at its own size on the real group.
  DeepSpeed (2021) called PyTorch's list all-gather, which copies the gathered buffer into ``n``
  output tensors one launch at a time: ``n`` x :data:`LIST_COPY_S` per collective, on the
  communication stream and the launching CPU thread (likewise the list reduce-scatter's input):
  a per-collective cost that grows with the data-parallel size and never overlaps compute.
* **overlap** (``training.dp_overlap``): without it every collective is exposed. With it, a
  layer's collectives run while the neighbouring layer computes (prefetch one layer ahead;
  reduce-scatters behind the next layer's backward): per layer ``max(0, comm - compute)`` is
  exposed, forward and backward separately. DeepSpeed only prefetches tensors up to its
  prefetch bucket (``training.prefetch_bucket``, the memory it may fill with gathered-ahead
  parameters): a larger tensor is gathered on demand when its module runs, fully exposed. FSDP
  prefetches the whole next unit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collsim.model.params import HOST_LAUNCH_S
from collsim.training.layout import Groups, Layout
from collsim.training.transformer import ffn_width, is_moe_layer, kv_width
from collsim.training.workload import DTYPE_BYTES, WorkloadIn

Coll = Callable[[str, list[str], float, str], float]

LIST_COPY_S = HOST_LAUNCH_S
"""Seconds per output tensor of a list all-gather (``torch.distributed.all_gather(list, t)``,
what DeepSpeed's ZeRO-3 called per parameter in 2021): PyTorch's NCCL backend gathers into a
flat buffer, then copies it into the ``n`` output tensors one ``copy_`` launch at a time on the
communication stream, so each gather costs ``n`` launches (a typical CUDA launch + dispatch
cost, a priori, not fitted) that serialise the stream and occupy the launching CPU thread:
never hidden behind compute. FSDP gathers into one flat tensor (no copies)."""


def transformer_tensors(w: WorkloadIn, tp: int, ep: int, moe: bool) -> list[float]:
    """Elements of each parameter tensor of one transformer layer on one TP rank, in forward
    order: layer norm (weight, bias), QKV (weight, bias), projection (weight, bias), layer norm,
    MLP matrices and biases. They sum to :func:`collsim.training.transformer.layer_params` / tp
    (experts divided over EP)."""
    m = w.model
    h = m.hidden
    kv, f = kv_width(m), ffn_width(m)
    mlp = [float(h * f)] * (3 if m.gated_mlp else 2) + [float(f), float(h)]
    if moe and m.experts is not None:
        mlp = [x * m.experts.count / ep for x in mlp]
    out = [h, h, h * (h + 2 * kv), h + 2 * kv, h * h, h, h, h, *mlp]
    return [float(x) / tp for x in out]


def expert_tails(w: WorkloadIn, lay: Layout, index: int, layers: range) -> list[int]:
    """Per layer of :func:`stage_tensors`, how many of its last tensors are experts' (the MLP of
    an MoE layer): those are sharded, gathered and reduced among the GPUs holding the same
    experts (DeepSpeed-MoE's expert-data-parallel group), the rest over all data parallelism."""
    m = w.model
    if m.kind == "generic":
        return [0 for _ in layers]
    mlp = 5 if m.gated_mlp else 4
    tails = [mlp if is_moe_layer(m, i) and m.experts is not None else 0 for i in layers]
    has_embed = index == 0 or (index == lay.pp - 1 and (lay.pp > 1 or not m.tied_embeddings))
    return [*tails, 0] if has_embed else tails


def stage_tensors(w: WorkloadIn, lay: Layout, index: int, layers: range) -> list[list[float]]:
    """Parameter tensors (elements per TP rank) of pipeline stage ``index``, one list per layer,
    with the embeddings as a layer of their own on the first / last stage."""
    m = w.model
    if m.kind == "generic":
        return [[m.params / m.layers / lay.tp] for _ in layers]
    out = [transformer_tensors(w, lay.tp, lay.ep, is_moe_layer(m, i)) for i in layers]
    embed: list[float] = []
    if index == 0:
        embed += [m.vocab * m.hidden / lay.tp, m.seq_len * m.hidden / lay.tp]
    if index == lay.pp - 1 and (lay.pp > 1 or not m.tied_embeddings):
        embed.append(m.vocab * m.hidden / lay.tp)
    if embed:
        out.append(embed)
    return out


def buckets(sizes: list[float], limit: float) -> list[float]:
    """Consecutive tensors coalesced into buckets of at most ``limit`` bytes (a larger tensor
    alone): the sizes of the collectives issued."""
    out: list[float] = []
    cur = 0.0
    for s in sizes:
        if cur and cur + s > limit:
            out.append(cur)
            cur = 0.0
        cur += s
    if cur:
        out.append(cur)
    return out


@dataclass
class LayerComm:
    """One layer's ZeRO-3 collectives for one micro-batch (seconds)."""

    demand: float
    """All-gathers that cannot be prefetched (gathered on demand): always exposed, per pass."""
    prefetch: float
    """All-gathers that can be prefetched behind compute, per pass."""
    reduce_scatter: float
    copies: float = 0.0
    """Per-rank copies of one pass's list all-gathers (:data:`LIST_COPY_S`): always exposed."""
    rs_copies: float = 0.0
    """The same for the reduce-scatters (list inputs flattened)."""
    regather_demand: float = 0.0
    """On-demand gathers the backward repeats after a recomputed forward (:func:`regathered`)."""
    regather_prefetch: float = 0.0
    """Prefetchable gathers the backward repeats."""
    regather_copies: float = 0.0
    """Their list copies."""
    gathers: int = 0
    """All-gathers issued per micro-batch (both passes and the repeats)."""
    gathered_bytes: float = 0.0
    """Bytes each GPU receives in them per micro-batch (``(n-1)/n`` of each gathered tensor)."""

    def plus(self, other: LayerComm) -> LayerComm:
        """Both groups' collectives of one layer (issued one after the other)."""
        mine, theirs = dataclasses.astuple(self), dataclasses.astuple(other)
        return LayerComm(*(a + b for a, b in zip(mine, theirs, strict=True)))


def regathered(tensors: list[float], max_reuse: float, later: float = 0.0) -> list[bool]:
    """Which of a layer's gathered tensors (elements, forward order) DeepSpeed gathers a third
    time in the backward of a fully recomputed layer. Each forward use, the recomputed one
    included, releases a tensor unless its next use comes within ``max_reuse`` fetched elements
    (the coordinator's trace of the first step: ``stage3_max_reuse_distance``). After the
    recomputed forward uses tensor ``k``, the rest of the layer is recomputed and its backward
    runs in reverse order before ``k``'s own: twice the elements of the tensors after ``k``.
    A GPT layer of hidden size ``h`` thus regathers its QKV, projection and first MLP matrices
    (18, 16 and 8 h^2 apart) once ``8 h^2`` exceeds 1e9 (h >= 11180), keeping only the last
    matrix (DeepSpeed 2021, ``partitioned_param_coordinator``: ``release_sub_module`` after every
    forward, ``fetch_sub_module`` before the backward). Without recomputation the forward's
    gathers are released long before the backward, which gathers everything again anyway.
    ``later``: elements gathered after these in the same layer by another group (an MoE
    layer's experts, after its attention)."""
    out = []
    after = sum(tensors) + later
    for t in tensors:
        after -= t
        out.append(2 * after > max_reuse)
    return out


def gathered_tensors(w: WorkloadIn, tensors: list[float]) -> list[float]:
    """The tensors DeepSpeed gathers per pass: those at or above the persistence threshold."""
    return [t for t in tensors if t >= w.training.persistence_threshold]


def layer_comm(
    coll: Coll,
    dp: list[str],
    w: WorkloadIn,
    tensors: list[float],
    algo: str,
    *,
    recomputed: bool = False,
    later: float = 0.0,
) -> LayerComm:
    """Time one layer's all-gathers (per tensor above the persistence threshold, or one flat
    unit with FSDP; with ``recomputed``, a layer the backward recomputes in full, the repeats of
    :func:`regathered`, ``later`` elements being gathered after these in the layer) and its
    gradient reduce-scatters on the data-parallel group ``dp``."""
    tr = w.training
    if not tensors:
        return LayerComm(0.0, 0.0, 0.0)
    elem = DTYPE_BYTES[w.value_dtype]
    gelem = DTYPE_BYTES[w.grad_dtype] / tr.compression.ratio
    if w.parallel.fsdp:
        gathered = [sum(tensors)]
        again = [False]
        grads = [sum(tensors) * gelem]
    else:
        # Tensors under the persistence threshold stay whole on every rank: no gather.
        gathered = gathered_tensors(w, tensors)
        again = (
            regathered(gathered, tr.max_reuse_distance, later)
            if recomputed
            else [False] * len(gathered)
        )
        grads = buckets(
            [t * gelem for t in reversed(tensors)],
            tr.bucket_bytes(3, len(dp), DTYPE_BYTES[w.grad_dtype]),
        )
    demand = prefetch = re_demand = re_prefetch = 0.0
    for elements, repeat in zip(gathered, again, strict=True):
        size = elements * elem
        t = coll("all_gather", dp, size, algo)
        if w.parallel.fsdp or size <= tr.prefetch_bucket:
            prefetch += t
            re_prefetch += t if repeat else 0.0
        else:
            demand += t
            re_demand += t if repeat else 0.0
    rs = sum(coll("reduce_scatter", dp, g, algo) for g in grads)
    copy = 0.0 if w.parallel.fsdp else tr.gather_copy_s * len(dp)
    repeats = sum(again)
    passes = sum(t * (2 + r) for t, r in zip(gathered, again, strict=True))
    received = passes * elem * (len(dp) - 1) / len(dp)
    return LayerComm(
        demand, prefetch, rs, copy * len(gathered), copy * len(grads),
        re_demand, re_prefetch, copy * repeats, 2 * len(gathered) + repeats, received,
    )  # fmt: skip


def exposed_per_layer(c: LayerComm, fwd_s: float, bwd_s: float, overlap: bool) -> float:
    """Exposed seconds of one layer's collectives, forward + backward, one micro-batch:
    on-demand gathers and copies in full, prefetched gathers and reduce-scatters beyond the
    layer's compute (``max(0, comm - compute)``) with overlap, everything without. The
    backward gathers what the forward did (for its recomputation, or its own use) and the
    repeats."""
    copies = 2 * c.copies + c.rs_copies + c.regather_copies
    repeats = c.regather_demand + c.regather_prefetch
    if not overlap:
        return 2 * (c.demand + c.prefetch) + repeats + c.reduce_scatter + copies
    fwd = c.demand + max(0.0, c.prefetch - fwd_s)
    bwd = (
        c.demand
        + c.regather_demand
        + max(0.0, c.prefetch + c.regather_prefetch + c.reduce_scatter - bwd_s)
    )
    return fwd + bwd + copies


def zero3(
    coll: Coll,
    w: WorkloadIn,
    lay: Layout,
    groups: Groups,
    tensors: list[list[float]],
    crit: dict[str, float],
    m: int,
    algo: str,
    tails: list[int] | None = None,
) -> tuple[float, float, dict[str, Any]]:
    """Exposed ZeRO-3 seconds of one step (``m`` micro-batches): the weight gathers' and what
    the gradients' reduce-scatters add to them; and details. ``tensors``: the stage's parameter
    tensors per layer, the last ``tails[i]`` of layer ``i`` experts' (:func:`expert_tails`:
    over ``groups.dp_expert``); ``crit``: its per-micro-batch compute (``fwd``, ``bwd``,
    ``layers``), spread evenly over its transformer layers."""
    n_layers = max(1.0, crit["layers"])
    fwd_l, bwd_l = crit["fwd"] / n_layers, crit["bwd"] / n_layers
    exposed = gathers = total = received = 0.0
    calls = 0
    cache: dict[tuple[float, ...], LayerComm] = {}
    for i, layer in enumerate(tensors):
        tail = tails[i] if tails else 0
        # Dense tensors over all DP; experts' among their holders (none to move if one holds them).
        parts = [(groups.dp, layer[: len(layer) - tail])]
        if tail and len(groups.dp_expert) > 1:
            parts.append((groups.dp_expert, layer[len(layer) - tail :]))
        # A transformer layer recomputed in full (not the embeddings' pseudo-layer) regathers,
        # its reuse distances running over both groups' tensors in forward order.
        recomputed = w.recomputes == "full" and i < crit["layers"]
        key = (*layer, tail, recomputed)
        if key not in cache:
            later = [sum(gathered_tensors(w, p)) for _, p in parts[1:]] + [0.0]
            found = [
                layer_comm(coll, group, w, tensors_, algo, recomputed=recomputed, later=after)
                for (group, tensors_), after in zip(parts, later, strict=True)
            ]
            cache[key] = found[0] if len(found) == 1 else found[0].plus(found[1])
        c = cache[key]
        # The embeddings' pseudo-layer has no compute of its own to hide behind.
        f, b = (fwd_l, bwd_l) if i < crit["layers"] else (0.0, 0.0)
        exposed += exposed_per_layer(c, f, b, w.training.dp_overlap)
        no_rs = dataclasses.replace(c, reduce_scatter=0.0, rs_copies=0.0)
        gathers += exposed_per_layer(no_rs, f, b, w.training.dp_overlap)
        total += exposed_per_layer(c, 0.0, 0.0, False)
        calls += c.gathers
        received += c.gathered_bytes
    return (
        m * gathers,
        m * (exposed - gathers),
        {
            "zero3_comm_s": m * total,
            "zero3_gathers_per_micro_batch": calls,
            "zero3_gathered_bytes_per_gpu": m * received,
        },
    )
