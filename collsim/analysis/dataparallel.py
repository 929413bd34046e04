"""Data-parallel communication of one step, and the other per-step overheads of the step model.

* Gradients reduced in buckets that overlap the last micro-batch's backward (PyTorch DDP; Li et al.
  2020, arXiv:2006.15704): ``n`` buckets of ``c`` seconds each in a backward of ``W`` expose
  ``max(n c - W (1 - 1/n), c)``; without overlap, one collective of all gradients.
* ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054): stages 1-2 reduce-scatter gradients and
  all-gather updated weights (the all-reduce's volume, ``2 (n-1)/n`` bytes per byte); stage 3 /
  FSDP all-gathers weights in the forward and again in the backward and reduce-scatters
  gradients (``3 (n-1)/n``: 1.5x), per micro-batch and per layer (per tensor with DeepSpeed),
  exposed layer by layer: :mod:`collsim.analysis.zero3`.
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
from collsim.analysis.zero3 import zero3


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
    tensors: list[list[float]] | None = None,
) -> tuple[float, float, dict[str, Any]]:
    """Exposed data-parallel time, compression time and details (bytes moved per GPU).
    ``tensors``: the parameter tensors per layer of the stage (ZeRO-3, :mod:`.zero3`)."""
    detail: dict[str, Any] = {}
    if lay.dp <= 1:
        return 0.0, 0.0, {"dp_bytes_per_gpu": 0.0}
    tr = w.training
    elem = DTYPE_BYTES[w.dtype]
    grad_bytes = params_gpu * DTYPE_BYTES[w.grad_dtype]
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
        exposed, detail = zero3(coll, w, lay, groups, tensors or [], crit, m, algo)
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
    return exposed, codec, {"dp_bytes_per_gpu": moved, **detail}
