"""Turn per-operation times into :class:`SimResult` records.

Both engine paths end here: the event replay (:mod:`collsim.engine.replay`) and the
contention-free fast path (:mod:`collsim.engine.uncontended`) each fill a :class:`Timeline`, and
:func:`build_result` turns it into the same records, so the two cannot drift apart in layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsim.collectives.schedule import NETWORK_REDUCE, TRANSFER, Schedule, index_dtype
from collsim.engine.fabric import Fabric
from collsim.engine.prepare import NET, Prepared, chunks
from collsim.engine.results import LinkRecords, SimResult, TransferRecords
from collsim.errors import ScheduleError
from collsim.metrics import canonical_collective
from collsim.protocols import Protocol


@dataclass(eq=False)
class Timeline:
    """What an engine path computed, one entry per operation or per link.

    ``start_s``: dependencies met (for a local reduction: when its GPU took it up);
    ``flow_start_s``: latency over, bytes on the wire (NaN for local operations); ``end_s``:
    complete. ``busy_s``: per link, time with at least one flow on it;
    ``in_network_link_bytes``: per link, wire bytes of in-network reductions.
    """

    start_s: np.ndarray
    flow_start_s: np.ndarray
    end_s: np.ndarray
    busy_s: np.ndarray
    in_network_link_bytes: np.ndarray


def _collective_name(name: str) -> str:
    try:
        return canonical_collective(name)
    except ScheduleError:
        return name  # a custom schedule: keep its name, bus factor lookups will say so


def build_result(
    schedule: Schedule,
    fabric: Fabric,
    protocol: Protocol,
    prep: Prepared,
    timeline: Timeline,
    engine_path: str,
) -> SimResult:
    """Transfer, link and rank records plus the headline numbers of ``timeline``.

    ``engine_path`` ("replay" or "contention_free") is recorded in ``meta["engine_path"]``.
    """
    a = schedule.arrays
    end_s = timeline.end_s
    time_s = float(end_s.max()) if end_s.size else 0.0

    is_xfer = a["kind"] == TRANSFER
    n_xfer = int(np.count_nonzero(is_xfer))
    # Fancy-indexing millions of rows is costly (time and memory): when every op is a
    # transfer, use views and fill the timeline's own arrays in place.
    if n_xfer == len(schedule):
        sel: slice | np.ndarray = slice(None)
        op_id = np.arange(n_xfer, dtype=index_dtype(n_xfer))
    else:
        sel = op_id = np.flatnonzero(is_xfer)
    del is_xfer
    is_net = prep.cls[sel] == NET
    all_net = bool(is_net.all())
    nroutes = prep.route_ptr.shape[0] - 1
    # Local copies use an extra empty route at the end of the route table.
    route = prep.route[sel] if all_net else np.where(is_net, prep.route[sel], nroutes)
    route_ptr = np.append(prep.route_ptr, prep.route_ptr[-1])
    flow_start = timeline.flow_start_s[sel]  # a view when every op is a transfer
    wire = prep.wire_bytes(sel)
    if not all_net:
        local = ~is_net
        flow_start[local] = timeline.start_s[sel][local]
        wire[local] = 0.0
        del local
    del is_net
    transfers = TransferRecords(
        op_id=op_id,
        src=a["src"][sel],
        dst=a["dst"][sel],
        bytes=prep.payload_bytes(sel),
        wire_bytes=wire,
        start_s=timeline.start_s[sel],
        flow_start_s=flow_start,
        end_s=end_s[sel],
        route=route,
        route_ptr=route_ptr,
        route_links=prep.route_links,
    )

    nlinks = len(fabric.link_names)
    route_bytes = np.bincount(transfers.route, weights=transfers.wire_bytes, minlength=nroutes + 1)[
        :nroutes
    ]
    per_link = np.repeat(route_bytes, np.diff(prep.route_ptr))
    if prep.route_share is not None:  # routes split over paths: each link's share of the bytes
        per_link = per_link * prep.route_share
    link_bytes = np.bincount(prep.route_links, weights=per_link, minlength=nlinks)
    link_bytes = link_bytes + timeline.in_network_link_bytes
    capacity = np.asarray(fabric.capacity_bytes_per_s, dtype=np.float64)
    busy_s = timeline.busy_s.copy()
    if time_s > 0:
        utilization = link_bytes / (capacity * time_s)
        busy_fraction = busy_s / time_s
    else:
        utilization = np.zeros(nlinks)
        busy_fraction = np.zeros(nlinks)
    links = LinkRecords(
        name=tuple(fabric.link_names),
        capacity_bytes_per_s=capacity,
        bytes=link_bytes,
        busy_s=busy_s,
        utilization=utilization,
        busy_fraction=busy_fraction,
    )

    rank_finish = np.zeros(schedule.nranks)
    p2p = a["kind"] != NETWORK_REDUCE
    for part in chunks(len(schedule)):
        keep = p2p[part]
        np.maximum.at(rank_finish, a["src"][part][keep], end_s[part][keep])
        np.maximum.at(rank_finish, a["dst"][part][keep], end_s[part][keep])
    for op in np.flatnonzero(~p2p):
        members = [*schedule.groups[a["src"][op]], *schedule.groups[a["dst"][op]]]
        np.maximum.at(rank_finish, np.asarray(members, dtype=np.int64), end_s[op])

    return SimResult(
        collective=_collective_name(schedule.collective),
        algorithm=schedule.algorithm,
        nranks=schedule.nranks,
        size_bytes=schedule.size_bytes,
        protocol=protocol.name,
        time_s=time_s,
        transfers=transfers,
        links=links,
        rank_finish_s=rank_finish,
        op_start_s=timeline.start_s,
        op_end_s=end_s,
        meta={"channels": schedule.channels, **schedule.meta, "engine_path": engine_path},
    )
