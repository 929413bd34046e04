"""Direct (one-shot) algorithms: every rank talks to every other rank in one step.

Latency-optimal for small messages on all-to-all fabrics (NVSwitch): NCCL's and TensorRT-LLM's
"one-shot" all-reduce, and the fully connected all-gather / reduce-scatter of MSCCL. Transfers are
issued in ``n - 1`` shifted rounds (round ``k``: ``r -> r + k``) so no destination is hit twice at
once, but rounds carry no dependencies between them.

Reductions are staged: the first arriving contribution lands directly in the owner's output, the
others in scratch, and local REDUCTIONs add them (with the owner's own input) into the output.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.common import BuildSpec, add_reductions, self_copy
from collsim.collectives.schedule import Schedule, ScheduleBuilder


def direct_reduce(
    b: ScheduleBuilder,
    n: int,
    *,
    src_off: np.ndarray,
    count: int,
    out_off: int,
    stride: int,
    channel: int,
) -> None:
    """Every rank ``j`` receives everyone's ``input[src_off[j]:+count]`` and sums it into its
    ``output[out_off:]``. Scratch slot of round ``k`` at ``(k - 2) * stride + src_off[j]``.
    """
    j = np.arange(n, dtype=np.int64)
    if n == 1:
        self_copy(b, j, count, "input", src_off, "output", out_off, np.full((1, 0), -1), channel)
        return
    rounds = []
    for k in range(1, n):
        off = out_off if k == 1 else (k - 2) * stride + src_off
        buf = "output" if k == 1 else "scratch"
        rounds.append(
            b.transfers((j - k) % n, j, count, "input", src_off, buf, off, channel=channel)
        )
    seed = rounds[0]
    add_reductions(
        b, j, np.full(n, count), "input", src_off, "output", np.full(n, out_off), seed[:, None],
        channel,
    )  # fmt: skip
    for k in range(2, n):
        deps = np.stack([seed, rounds[k - 1]], axis=1)
        add_reductions(
            b, j, np.full(n, count), "scratch", (k - 2) * stride + src_off, "output",
            np.full(n, out_off), deps, channel,
        )  # fmt: skip


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """One-shot all-reduce: each rank sends its whole buffer to every other rank."""
    b = ScheduleBuilder()
    n = spec.nranks
    for c, lo, cnt in spec.channel_pieces(spec.count):
        direct_reduce(
            b, n, src_off=np.full(n, lo), count=cnt, out_off=lo, stride=spec.count, channel=c
        )
    return spec.finish(b)


def build_reduce_scatter(spec: BuildSpec) -> Schedule:
    """Direct reduce-scatter: rank ``j`` receives block ``j`` from every rank and sums it."""
    b = ScheduleBuilder()
    n, blk = spec.nranks, spec.block
    for c, lo, cnt in spec.channel_pieces(blk):
        src_off = np.arange(n, dtype=np.int64) * blk + lo
        direct_reduce(b, n, src_off=src_off, count=cnt, out_off=lo, stride=n * blk, channel=c)
    return spec.finish(b)


def build_all_gather(spec: BuildSpec) -> Schedule:
    """Direct all-gather: each rank sends its input to every other rank (and copies its own)."""
    b = ScheduleBuilder()
    n, blk = spec.nranks, spec.block
    r = np.arange(n, dtype=np.int64)
    for c, lo, cnt in spec.channel_pieces(blk):
        self_copy(b, r, cnt, "input", lo, "output", r * blk + lo, np.full((n, 0), -1), c)
        for k in range(1, n):
            b.transfers(r, (r + k) % n, cnt, "input", lo, "output", r * blk + lo, channel=c)
    return spec.finish(b)
