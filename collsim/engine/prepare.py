"""Everything the replay needs that does not change with time, computed once and vectorised.

Checks the schedule against the fabric, classifies operations, looks up each *distinct* rank
pair's route once (a 1024-rank ring all-reduce has two million transfers but 1024 pairs), and
builds the successor lists (CSR) that dependency counters are decremented through.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsim.collectives.schedule import NETWORK_REDUCE, REDUCTION, TRANSFER, Schedule
from collsim.engine._csr import ptr_from_lengths
from collsim.engine.fabric import Fabric
from collsim.engine.skew import check_rank_slowdown, check_rank_start, op_release_s, slow_local
from collsim.errors import ScheduleError
from collsim.protocols import Protocol

# Operation classes, as the replay dispatches them.
NET, COPY, LOCAL_REDUCE, IN_NETWORK = 0, 1, 2, 3


@dataclass(eq=False)
class Prepared:
    """Static per-operation arrays (one entry per op) and the distinct routes."""

    cls: np.ndarray  # NET / COPY / LOCAL_REDUCE / IN_NETWORK
    fused: np.ndarray  # network transfer with receive-reduce
    payload_bytes: np.ndarray
    wire_bytes: np.ndarray
    latency_s: np.ndarray  # path + protocol hop latency (network transfers, in-network ops)
    local_s: np.ndarray  # duration of a local copy / reduction; fused reduce time for NET
    route: np.ndarray  # index into routes for NET ops, -1 otherwise
    route_ptr: np.ndarray
    route_links: np.ndarray
    in_network: dict[int, tuple[np.ndarray, np.ndarray]]  # op -> (links per flow, links)
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    waiting: np.ndarray  # unmet dependencies per op (the replay decrements it in place)
    release_s: np.ndarray | None = None  # earliest start per op (rank start times), if any
    after: np.ndarray | None = None  # the op a transfer's flow follows on its connection, or -1
    follow_ptr: np.ndarray | None = None  # CSR: the transfers following each op (``after``)
    follow_idx: np.ndarray | None = None


def _check_ranks(values: np.ndarray, nranks: int, what: str) -> None:
    if values.size and (values.min() < 0 or values.max() >= nranks):
        bad = values[(values < 0) | (values >= nranks)][0]
        raise ScheduleError(f"{what} rank outside 0..{nranks - 1}", field=what, value=int(bad))


def validate(schedule: Schedule, fabric: Fabric) -> None:
    """Raise ``ScheduleError`` if ``schedule`` cannot run on ``fabric``."""
    if schedule.nranks > fabric.nranks:
        raise ScheduleError(
            f"schedule has {schedule.nranks} ranks but the fabric only {fabric.nranks}",
            field="nranks",
            value=schedule.nranks,
        )
    capacity = np.asarray(fabric.capacity_bytes_per_s, dtype=np.float64)
    if capacity.shape != (len(fabric.link_names),) or np.any(~(capacity > 0)):
        raise ScheduleError("every link needs a positive capacity", field="fabric")
    kind = schedule.arrays["kind"]
    if kind.size and not np.isin(kind, (TRANSFER, REDUCTION, NETWORK_REDUCE)).all():
        raise ScheduleError("unknown operation kind", field="kind")
    if np.any(schedule.arrays["count"] < 0):
        raise ScheduleError("negative element count", field="count")
    if schedule.elem_bytes <= 0:
        raise ScheduleError("elem_bytes must be positive", field="elem_bytes")
    p2p = kind != NETWORK_REDUCE
    _check_ranks(schedule.arrays["src"][p2p], schedule.nranks, "src")
    _check_ranks(schedule.arrays["dst"][p2p], schedule.nranks, "dst")
    red = kind == REDUCTION
    if np.any(schedule.arrays["src"][red] != schedule.arrays["dst"][red]):
        raise ScheduleError("a REDUCTION must have src == dst", field="dst")
    ngroups = len(schedule.groups)
    for op in np.flatnonzero(kind == NETWORK_REDUCE):
        for g in (schedule.arrays["src"][op], schedule.arrays["dst"][op]):
            if not 0 <= g < ngroups:
                raise ScheduleError("in-network reduction names a missing group", field="groups")
            _check_ranks(np.asarray(schedule.groups[g], dtype=np.int64), schedule.nranks, "group")


def _route_kind(link_kind: np.ndarray, ptr: np.ndarray, links: np.ndarray) -> np.ndarray:
    """The slowest link kind (largest code) on each route; NVLink (0) for empty routes."""
    lengths = np.diff(ptr)
    kinds = np.zeros(lengths.shape[0], dtype=np.int64)
    nonempty = lengths > 0
    if nonempty.any():
        kinds[nonempty] = np.maximum.reduceat(link_kind[links], ptr[:-1][nonempty])
    return kinds


def prepare(
    schedule: Schedule,
    fabric: Fabric,
    protocol: Protocol,
    *,
    rank_start_s: np.ndarray | None = None,
    rank_slowdown: np.ndarray | None = None,
) -> Prepared:
    """Classify operations, time their fixed parts and resolve routes (see module doc).

    ``rank_start_s`` / ``rank_slowdown``: per-rank entry times and local-work slowdown factors
    (stragglers, :mod:`collsim.engine.skew`); ``None`` changes nothing."""
    validate(schedule, fabric)
    a = schedule.arrays
    n = len(schedule)
    kind, src, dst = a["kind"], a["src"], a["dst"]
    payload = a["count"].astype(np.float64) * schedule.elem_bytes
    is_xfer = kind == TRANSFER
    local = is_xfer & (src == dst)
    cls = np.full(n, NET, dtype=np.int8)
    cls[local] = COPY
    cls[(kind == REDUCTION) | (local & a["reduce"])] = LOCAL_REDUCE
    cls[kind == NETWORK_REDUCE] = IN_NETWORK
    fused = (cls == NET) & a["reduce"]

    reduce_rate = np.asarray(fabric.reduce_bytes_per_s, dtype=np.float64)
    copy_rate = np.asarray(fabric.copy_bytes_per_s, dtype=np.float64)
    local_s = np.zeros(n)
    for code, rate in ((COPY, copy_rate), (LOCAL_REDUCE, reduce_rate)):
        m = cls == code
        local_s[m] = payload[m] / rate[src[m]]
    local_s[fused] = payload[fused] / reduce_rate[dst[fused]]
    if rank_slowdown is not None:
        slowdown = check_rank_slowdown(rank_slowdown, schedule.nranks)
        local_s = slow_local(local_s, slowdown, schedule, fused)
    release_s = None
    if rank_start_s is not None:
        release_s = op_release_s(schedule, check_rank_start(rank_start_s, schedule.nranks))

    link_kind = np.asarray(fabric.link_kind, dtype=np.int64)
    latency = np.zeros(n)
    route = np.full(n, -1, dtype=np.int64)
    net = np.flatnonzero(cls == NET)
    keys, inverse = np.unique(src[net] * fabric.nranks + dst[net], return_inverse=True)
    if net.size:
        route_ptr, route_links, route_lat = fabric.routes(
            keys // fabric.nranks, keys % fabric.nranks
        )
    else:
        route_ptr, route_links, route_lat = np.zeros(1, np.int64), np.zeros(0, np.int64), ()
    route_ptr = np.asarray(route_ptr, dtype=np.int64)
    route_links = np.asarray(route_links, dtype=np.int64)
    hop = protocol.hop_latency(_route_kind(link_kind, route_ptr, route_links))
    route[net] = inverse
    latency[net] = (np.asarray(route_lat, dtype=np.float64) + hop)[inverse]

    in_network: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for op in np.flatnonzero(cls == IN_NETWORK):
        srcs = np.asarray(schedule.groups[src[op]], dtype=np.int64)
        dsts = np.asarray(schedule.groups[dst[op]], dtype=np.int64)
        up_ptr, up_links, down_ptr, down_links, lat = fabric.in_network(srcs, dsts)
        links = np.concatenate((up_links, down_links)).astype(np.int64)
        nlinks = np.concatenate((np.diff(up_ptr), np.diff(down_ptr))).astype(np.int64)
        worst = int(link_kind[links].max()) if links.size else 0
        latency[op] = float(lat) + float(protocol.hop_latency(worst))
        in_network[int(op)] = (nlinks, links)

    ndeps = np.diff(schedule.dep_ptr)
    owner = np.repeat(np.arange(n, dtype=np.int64), ndeps)
    order = np.argsort(schedule.dep_idx, kind="stable")
    after = follow_ptr = follow_idx = None
    if "after" in a:  # only network transfers follow another on a connection
        after = np.where(cls == NET, a["after"], -1).astype(np.int64)
        if (after >= 0).any():
            followers = np.flatnonzero(after >= 0)
            by_pred = np.argsort(after[followers], kind="stable")
            follow_ptr = ptr_from_lengths(np.bincount(after[followers], minlength=n))
            follow_idx = followers[by_pred]
        else:
            after = None
    return Prepared(
        cls=cls,
        fused=fused,
        payload_bytes=payload,
        wire_bytes=protocol.wire_bytes(payload),
        latency_s=latency,
        local_s=local_s,
        route=route,
        route_ptr=route_ptr,
        route_links=route_links,
        in_network=in_network,
        succ_ptr=ptr_from_lengths(np.bincount(schedule.dep_idx, minlength=n)),
        succ_idx=owner[order],
        waiting=ndeps.astype(np.int64),
        release_s=release_s,
        after=after,
        follow_ptr=follow_ptr,
        follow_idx=follow_idx,
    )
