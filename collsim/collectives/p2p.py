"""Point-to-point: nccl-tests' ``sendrecv``, where rank ``r`` sends its buffer to rank ``r + 1``.

``channels`` is the number of channels NCCL gives the peer (its ``p2pnChannelsPerPeer``): the
buffer is split over them, and the schedule is marked ``point_to_point`` so that each
channel's flow over the network is held to NCCL's per-channel point-to-point rate
(:mod:`collsim.channel_rates`)."""

from __future__ import annotations

import numpy as np

from collsim.collectives.common import BuildSpec
from collsim.collectives.schedule import Schedule, ScheduleBuilder


def build_sendrecv(spec: BuildSpec) -> Schedule:
    """Every rank sends its input to the next rank's output (a ring shift); one op per channel."""
    b = ScheduleBuilder()
    n = spec.nranks
    r = np.arange(n, dtype=np.int64)
    for c, lo, cnt in spec.channel_pieces(spec.count):
        b.transfers(r, (r + 1) % n, cnt, "input", lo, "output", lo, channel=c)
    return spec.finish(b, point_to_point=True)
