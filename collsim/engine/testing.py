"""Reference schedules built directly with :class:`ScheduleBuilder`, for engine tests and the
engine's benchmark, so the engine can be checked independently of the algorithm library.

:func:`ring_all_reduce` is the textbook ring: each rank first copies its input to its output,
then ``n - 1`` reduce-scatter steps (fused receive-reduce) and ``n - 1`` all-gather steps, each
step one transfer per rank to its right-hand neighbour. Built in a handful of numpy batches, so
a 1024-rank ring (two million transfers) takes well under a second.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.schedule import Schedule, ScheduleBuilder
from collsim.errors import ScheduleError


def _chunks(count: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sizes and offsets of ``count`` elements split in ``n`` near-equal chunks."""
    sizes = np.full(n, count // n, dtype=np.int64)
    sizes[: count % n] += 1
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return sizes, offsets


def ring_all_reduce(nranks: int, count: int, elem_bytes: int = 4) -> Schedule:
    """Ring all-reduce of ``count`` elements per rank on ranks ``0..nranks-1`` (one channel).

    Op ids: ``0..n-1`` are the local input->output copies; transfer ``s * n + r + n`` is rank
    ``r``'s send at step ``s`` (``s < n - 1``: reduce-scatter, else all-gather). Each send waits
    for the data it forwards (step ``s - 1`` from rank ``r - 1``) and for its own previous send.
    """
    n = int(nranks)
    if n < 1 or count < 0:
        raise ScheduleError("need nranks >= 1 and count >= 0", field="nranks", value=nranks)
    builder = ScheduleBuilder()
    ranks = np.arange(n, dtype=np.int64)
    copies = builder.transfers(ranks, ranks, count, "input", 0, "output", 0)
    sizes, offsets = _chunks(count, n)
    prev_recv = prev_send = None
    for phase, shift in (("reduce_scatter", 0), ("all_gather", 1)):
        for s in range(n - 1):
            chunk = (ranks + shift - s) % n
            right = (ranks + 1) % n
            if prev_send is None:
                deps = np.stack((copies, copies[right]), axis=1)
            else:
                deps = np.stack((prev_recv, prev_send), axis=1)
            ids = builder.transfers(
                ranks,
                right,
                sizes[chunk],
                "output",
                offsets[chunk],
                "output",
                offsets[chunk],
                reduce=phase == "reduce_scatter",
                deps=deps,
            )
            prev_send = ids
            prev_recv = ids[(ranks - 1) % n]  # what rank r received this step came from r - 1
    return builder.build("all_reduce", "ring", n, count, elem_bytes)
