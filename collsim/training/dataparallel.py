"""Data-parallel communication of one step, and the other per-step overheads of the step model.

* Gradients reduced in buckets that overlap the last micro-batch's backward (PyTorch DDP; Li et al.
  2020, arXiv:2006.15704): ``n`` buckets of ``c`` seconds each in a backward of ``W`` expose
  ``max(n c - W (1 - 1/n), c)``; without overlap, one collective of all gradients.
* ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054): stages 1-2 reduce-scatter gradients and
  all-gather updated weights (the all-reduce's volume, ``2 (n-1)/n`` bytes per byte); stage 3 /
  FSDP all-gathers weights in the forward and again in the backward and reduce-scatters
  gradients (``3 (n-1)/n``: 1.5x), per micro-batch and per layer (per tensor with DeepSpeed),
  exposed layer by layer: :mod:`collsim.training.zero3`. Stage 2 keeps only its shard of the
  gradients, so with gradient accumulation it reduce-scatters every micro-batch's (DeepSpeed).
* Expert parallelism: expert gradients are reduced only among the ``dp / ep`` GPUs holding the
  same experts (DeepSpeed-MoE's expert-data-parallel group), the rest over the whole DP group.
* Local SGD (communicate every ``k`` steps) divides the exposed gradient communication by
  ``k``; asynchronous training hides it behind ``staleness`` steps of compute. Both need every
  replica to hold its whole state (the workload refuses them with ZeRO, whose shards must meet
  every step). Compression divides gradient bytes by its ratio and costs
  ``2 x bytes / codec`` (encode + decode) per gradient reduction: once a step, or once per
  micro-batch where stages 2-3 reduce every micro-batch's gradients.
* Stragglers: per-GPU compute multipliers (mean 1, coefficient of variation ``cv``, seeded);
  the synchronous step waits for the slowest GPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from collsim.training.layout import Groups, Layout
from collsim.training.workload import DTYPE_BYTES, WorkloadIn
from collsim.training.zero3 import zero3


@functools.lru_cache(maxsize=1024)
def expected_max_multiplier(n: int, cv: float, distribution: str, seed: int, samples: int) -> float:
    """E[max over ``n`` GPUs] of compute multipliers with mean 1 and coefficient of variation
    ``cv`` (lognormal or normal, clipped at 0.05), by seeded Monte Carlo (cached: a plan asks
    for the same cluster size once per layout)."""
    if cv <= 0 or n <= 1:
        return 1.0
    rng = np.random.default_rng(seed)
    best = np.empty(samples)
    chunk = max(1, 2_000_000 // n)
    for start in range(0, samples, chunk):
        k = min(chunk, samples - start)
        best[start : start + k] = _multipliers(rng, cv, distribution, (k, n)).max(axis=1)
    return float(best.mean())


def straggler_multiplier(sync: Any, strag: Any, replicas: int, per_replica: int) -> float:
    """E[the step's compute multiplier] with ``replicas`` data-parallel replicas of
    ``per_replica`` GPUs (TP x CP x PP), which meet every step whatever the sync mode.

    Synchronous: the slowest of all GPUs, every step. Asynchronous (staleness >= 1): each
    replica waits only for its own slowest GPU. Local SGD over ``k`` steps: each replica runs
    ``k`` steps at its own pace (each waiting for its slowest GPU), then all wait for the
    slowest replica: ``E[max over replicas of the mean over k steps of max over its GPUs]``,
    by seeded Monte Carlo."""
    n = replicas * per_replica
    if strag.cv <= 0 or n <= 1:
        return 1.0
    args = (strag.cv, strag.distribution, strag.seed, strag.samples)
    if sync.mode == "async" and sync.staleness > 0:
        return expected_max_multiplier(per_replica, *args)
    if sync.mode != "local_sgd" or sync.period <= 1 or replicas <= 1:
        return expected_max_multiplier(n, *args)
    return _local_sgd_multiplier(sync.period, replicas, per_replica, *args)


@functools.lru_cache(maxsize=256)
def _local_sgd_multiplier(
    k: int, replicas: int, per_replica: int, cv: float, distribution: str, seed: int, samples: int
) -> float:
    """E[max over replicas of the mean over ``k`` steps of max over the replica's GPUs].

    Each step's replica maximum is drawn directly, as the quantile ``U^(1/p)`` of one GPU's
    distribution (the maximum of ``p`` independent draws), and summed step by step: time
    ``k x samples x replicas``, memory ``samples x replicas`` whatever ``k`` and ``p``."""
    from scipy.special import ndtri

    rng = np.random.default_rng(seed)
    total = np.zeros((samples, replicas))
    sigma = math.sqrt(math.log1p(cv * cv))  # the lognormal's
    for _ in range(k):
        u = rng.random((samples, replicas))
        z = -ndtri(-np.expm1(np.log(u) / per_replica))  # the standard normal quantile U^(1/p)
        if distribution == "lognormal":
            total += np.exp(sigma * z - sigma * sigma / 2)
        else:
            total += np.maximum(1.0 + cv * z, 0.05)
    return float((total / k).max(axis=1).mean())


def _multipliers(
    rng: np.random.Generator, cv: float, distribution: str, shape: tuple[int, ...]
) -> np.ndarray:
    """Compute multipliers with mean 1 and coefficient of variation ``cv``: lognormal, or
    normal clipped at 0.05."""
    if distribution == "lognormal":
        sigma = math.sqrt(math.log1p(cv * cv))
        return rng.lognormal(-sigma * sigma / 2, sigma, size=shape)
    return np.clip(rng.normal(1.0, cv, size=shape), 0.05, None)


def overlapped_buckets(total_s: float, n_buckets: int, window_s: float) -> float:
    """Exposed time of ``n_buckets`` equal collectives (``total_s`` in all) issued as gradients
    become ready uniformly over a backward of ``window_s``: ``max(T - W(1-1/n), T/n)``."""
    if total_s <= 0:
        return 0.0
    n = max(1, n_buckets)
    return max(total_s - window_s * (1 - 1 / n), total_s / n)


def data_parallel(
    coll: Callable[[str, list[str], float, str], float],
    w: WorkloadIn,
    lay: Layout,
    groups: Groups,
    params_gpu: float,
    crit: dict[str, float],
    m: int,
    algo: str,
    tensors: list[list[float]] | None = None,
    expert_params_gpu: float = 0.0,
    expert_tails: list[int] | None = None,
) -> tuple[float, float, dict[str, Any]]:
    """Exposed data-parallel time, compression time and details (bytes moved per GPU).
    ``tensors``: the parameter tensors per layer of the stage (ZeRO-3, :mod:`.zero3`);
    ``expert_params_gpu``: the part of ``params_gpu`` that is experts (reduced over
    ``groups.dp_expert``); ``expert_tails``: ZeRO-3's expert tensors per layer
    (:func:`collsim.training.zero3.expert_tails`)."""
    detail: dict[str, Any] = {}
    if lay.shards <= 1:  # no other GPU holds these weights (dp x cp = 1)
        return 0.0, 0.0, {"dp_bytes_per_gpu": 0.0, "dp_total_s": 0.0}
    tr = w.training
    ratio = tr.compression.ratio
    codec = 2 * params_gpu * DTYPE_BYTES[w.grad_dtype] / (tr.compression.codec_gbps * 1e9)
    codec = codec * (m if lay.zero >= 2 else 1) if ratio > 1 else 0.0
    # ZeRO's weight all-gathers are needed whatever the sync period (``gathers`` seconds,
    # ``gathered`` bytes); only the gradients' reduction (``reduces``, ``moved``) can wait.
    gathers = gathered = 0.0
    if lay.zero >= 3:
        gathers, reduces, detail = zero3(coll, w, lay, groups, tensors or [], crit, m, algo,
                                         expert_tails)  # fmt: skip
        # Bytes each GPU moves: the gathers it receives (persistent tensors none, regathered
        # ones three times); its gradients, dense over all DP, experts' among their holders.
        holders = len(groups.dp_expert)
        spread = (params_gpu - expert_params_gpu) * (lay.shards - 1) / lay.shards
        spread += expert_params_gpu * (holders - 1) / holders
        gathered = detail.pop("zero3_gathered_bytes_per_gpu")
        moved = m * spread * DTYPE_BYTES[w.grad_dtype] / max(ratio, 1.0)
    else:
        # Dense gradients over the DP group, experts' over the GPUs holding the same experts;
        # both are reduced in the same backward, so they share its window for overlap.
        found = [_reduce_and_gather(coll, w, lay, params, group, m, algo)
                 for params, group in ((params_gpu - expert_params_gpu, groups.dp),
                                       (expert_params_gpu, groups.dp_expert))]  # fmt: skip
        total, buckets, gathers, moved, gathered = (sum(x) for x in zip(*found, strict=True))
        one = overlapped_buckets(total, int(buckets), crit["bwd"]) if tr.dp_overlap else total
        reduces = (m if lay.zero == 2 else 1) * one
        full = (m if lay.zero == 2 else 1) * total  # before overlap with the backward
    if lay.zero >= 3:
        full = reduces  # ZeRO-3's exposed part per layer is all :mod:`.zero3` reports
    if tr.sync.mode == "local_sgd":
        full /= tr.sync.period
        reduces /= tr.sync.period
        codec /= tr.sync.period
        moved /= tr.sync.period
    elif tr.sync.mode == "async":
        hidden = tr.sync.staleness * m * crit["total"]
        reduces = max(0.0, reduces - hidden)
    # dp_total_s: the data-parallel seconds before overlap (exposed + hidden) for the breakdown
    detail = {"dp_bytes_per_gpu": moved + gathered, "dp_total_s": gathers + full, **detail}
    return gathers + reduces, codec, detail


def _reduce_and_gather(
    coll: Callable[[str, list[str], float, str], float],
    w: WorkloadIn,
    lay: Layout,
    params: float,
    group: list[str],
    m: int,
    algo: str,
) -> tuple[float, float, float, float, float]:
    """ZeRO 0-2 over ``group`` for ``params`` of it: one backward's gradient reduction (seconds,
    in buckets when it may overlap), its bucket count, the weight all-gather (seconds), and the
    bytes each GPU sends in a step for the reductions and for the all-gather.

    Stage 0 all-reduces the gradients once a step, in buckets that may overlap the last
    backward. Stages 1-2 reduce-scatter them and all-gather the updated weights; stage 2 holds
    only its shard of the gradients, so with ``m`` micro-batches it reduce-scatters each one's
    (each overlapping its own backward)."""
    n = len(group)
    if n <= 1 or params <= 0:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    tr = w.training
    grad_bytes = params * DTYPE_BYTES[w.grad_dtype] / max(tr.compression.ratio, 1.0)
    share = (n - 1) / n
    reduce = "all_reduce" if lay.zero == 0 else "reduce_scatter"
    bucket = tr.bucket_bytes(lay.zero, n, DTYPE_BYTES[w.grad_dtype])
    nb = max(1, math.ceil(grad_bytes / bucket)) if tr.dp_overlap else 1
    total = nb * coll(reduce, group, grad_bytes / nb, algo)
    rounds = m if lay.zero == 2 else 1
    moved = rounds * share * grad_bytes * (2 if lay.zero == 0 else 1)
    gather = gathered = 0.0
    if lay.zero >= 1:
        gather = coll("all_gather", group, params * DTYPE_BYTES[w.value_dtype], algo)
        gathered = share * params * DTYPE_BYTES[w.value_dtype]
    return total, float(nb), gather, moved, gathered
