"""Data-parallel communication of one step, and the other per-step overheads of the step model.

* Gradients reduced in buckets that overlap the last micro-batch's backward (PyTorch DDP; Li et al.
  2020, arXiv:2006.15704): ``n`` buckets of ``c`` seconds each in a backward of ``W`` expose
  ``max(n c - W (1 - 1/n), c)``; without overlap, one collective of all gradients.
* ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054): stages 1-2 reduce-scatter gradients and
  all-gather updated weights (the all-reduce's volume, ``2 (n-1)/n`` bytes per byte); stage 3 /
  FSDP all-gathers weights in the forward and again in the backward and reduce-scatters
  gradients (``3 (n-1)/n``: 1.5x), per micro-batch, in prefetch buckets (never finer than one
  call per weight matrix) that overlap compute.
* Local SGD (communicate every ``k`` steps) divides the exposed time by ``k``; asynchronous
  training hides it behind ``staleness`` steps of compute. Compression divides gradient bytes
  by its ratio and costs ``2 x bytes / codec`` (encode + decode).
* Stragglers: per-GPU compute multipliers (mean 1, coefficient of variation ``cv``, seeded);
  the synchronous step waits for the slowest GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from collsim.analysis.layout import Groups, Layout
from collsim.analysis.workload import DTYPE_BYTES, WorkloadIn


def expected_max_multiplier(n: int, cv: float, distribution: str, seed: int, samples: int) -> float:
    """E[max over ``n`` GPUs] of compute multipliers with mean 1 and coefficient of variation
    ``cv`` (lognormal or normal, clipped at 0.05), by seeded Monte Carlo."""
    if cv <= 0 or n <= 1:
        return 1.0
    rng = np.random.default_rng(seed)
    best = np.empty(samples)
    chunk = max(1, 2_000_000 // n)
    for start in range(0, samples, chunk):
        k = min(chunk, samples - start)
        if distribution == "lognormal":
            sigma = math.sqrt(math.log1p(cv * cv))
            draws = rng.lognormal(-sigma * sigma / 2, sigma, size=(k, n))
        else:
            draws = np.clip(rng.normal(1.0, cv, size=(k, n)), 0.05, None)
        best[start : start + k] = draws.max(axis=1)
    return float(best.mean())


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
) -> tuple[float, float, dict[str, Any]]:
    """Exposed data-parallel time, compression time and details (bytes moved per GPU)."""
    if lay.dp <= 1:
        return 0.0, 0.0, {"dp_bytes_per_gpu": 0.0}
    tr = w.training
    elem = DTYPE_BYTES[w.dtype]
    grad_bytes = params_gpu * DTYPE_BYTES[tr.grad_reduce_dtype or w.dtype]
    weight_bytes = params_gpu * elem
    ratio = tr.compression.ratio
    codec = 0.0
    if ratio > 1:
        codec = 2 * grad_bytes / (tr.compression.codec_gbps * 1e9)
        grad_bytes /= ratio
    n = lay.dp
    share = (n - 1) / n
    dp = groups.dp
    if lay.zero >= 3:
        # Gathers coalesce parameters up to the prefetch bucket, but never split a tensor:
        # at most one call per weight matrix (4 per transformer layer).
        tensors = 4 * crit["layers"] if w.model.kind == "transformer" else crit["layers"]
        nb = max(1, min(math.ceil(weight_bytes / max(tr.prefetch_bucket, 1)), int(tensors)))
        ag = nb * coll("all_gather", dp, weight_bytes / nb, algo)
        rs = nb * coll("reduce_scatter", dp, grad_bytes / nb, algo)
        if tr.dp_overlap:
            fwd_exposed = max(ag, crit["fwd"]) + ag / nb - crit["fwd"]
            bwd_exposed = max(ag + rs, crit["bwd"]) + (ag + rs) / nb - crit["bwd"]
        else:
            fwd_exposed, bwd_exposed = ag, ag + rs
        exposed = m * (fwd_exposed + bwd_exposed)
        moved = m * share * (2 * weight_bytes + grad_bytes)
    else:
        reduce = "all_reduce" if lay.zero == 0 else "reduce_scatter"
        if tr.dp_overlap:
            nb = max(1, math.ceil(grad_bytes / max(tr.bucket, 1)))
            total = nb * coll(reduce, dp, grad_bytes / nb, algo)
            exposed = overlapped_buckets(total, nb, crit["bwd"])
        else:
            exposed = coll(reduce, dp, grad_bytes, algo)
        moved = share * grad_bytes * (2 if lay.zero == 0 else 1)
        if lay.zero >= 1:
            exposed += coll("all_gather", dp, weight_bytes, algo)
            moved += share * weight_bytes
    if tr.sync.mode == "local_sgd":
        exposed /= tr.sync.period
        codec /= tr.sync.period
    elif tr.sync.mode == "async":
        hidden = tr.sync.staleness * m * crit["total"]
        exposed = max(0.0, exposed - hidden)
    return exposed, codec, {"dp_bytes_per_gpu": moved}
