"""In-network all-reduce: NVLink SHARP (NVLS) on NVSwitch, SHARP on InfiniBand switches.

Every rank pushes its slice into the fabric, the switch sums the slices and multicasts the sum
back (NCCL's ``NVLS`` / ``CollNet`` algorithms). Each pipeline chunk of each channel is one
``NETWORK_REDUCE`` over all ranks; chunks carry no dependencies on each other, so the engine
overlaps one chunk's reduction with the next one's upload as the hardware does. Each rank sends
and receives the buffer once, independently of ``n``.
"""

from __future__ import annotations

from collsim.collectives.common import BuildSpec
from collsim.collectives.schedule import Schedule, ScheduleBuilder


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """One NETWORK_REDUCE over all ranks per chunk and channel."""
    b = ScheduleBuilder()
    ranks = tuple(range(spec.nranks))
    for c, lo, cnt in spec.channel_pieces(spec.count):
        bounds = spec.chunks(lo, cnt).tolist()
        for k in range(len(bounds) - 1):
            off, size = bounds[k], bounds[k + 1] - bounds[k]
            b.network_reduce(ranks, ranks, size, "input", off, "output", off, channel=c)
    return spec.finish(b, in_network=True)
