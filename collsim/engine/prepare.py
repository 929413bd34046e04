"""Everything the replay needs that does not change with time, computed once and vectorised.

Checks the schedule against the fabric, classifies operations, looks up each *distinct* rank
pair's route once (a 1024-rank ring all-reduce has two million transfers but 1024 pairs), and
builds the successor lists (CSR) that dependency counters are decremented through.

Memory: a 4096-rank ring all-reduce has 33.5 million operations, so every per-op array costs
134-268 MB. Per op only what cannot be recomputed cheaply is stored, in narrow types (op ids
and CSR offsets int32 below 2**31, routes int32); payload and wire bytes are recomputed from the
schedule's ``count`` column and latencies looked up per route when needed (same floating-point
operations, so the same values), and per-op passes run in chunks of :data:`CHUNK` ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collsim.collectives.schedule import (
    NETWORK_REDUCE,
    REDUCTION,
    TRANSFER,
    Schedule,
    index_dtype,
    int_dtype,
)
from collsim.engine._csr import ptr_from_lengths
from collsim.engine.fabric import Fabric
from collsim.engine.skew import check_rank_slowdown, check_rank_start, op_release_s, slow_local
from collsim.errors import ScheduleError
from collsim.nvls import NVLS_LATENCY_S
from collsim.protocols import Protocol, step_latency_s
from collsim.transports import PROTOCOL_INDEX, append_links, route_overhead_s

# Operation classes, as the replay dispatches them.
NET, COPY, LOCAL_REDUCE, IN_NETWORK = 0, 1, 2, 3


CHUNK = 1 << 22
"""Ops per chunk of the chunked per-op passes (keeps their temporaries ~100 MB)."""


def chunks(n: int) -> list[slice]:
    """Slices covering ``0..n`` in pieces of at most :data:`CHUNK`."""
    return [slice(lo, min(lo + CHUNK, n)) for lo in range(0, n, CHUNK)]


@dataclass(eq=False)
class Prepared:
    """Static per-operation arrays (one entry per op) and the distinct routes."""

    cls: np.ndarray  # NET / COPY / LOCAL_REDUCE / IN_NETWORK
    fused: np.ndarray  # network transfer with receive-reduce
    count: np.ndarray  # the schedule's element counts (payload = count * elem_bytes)
    elem_bytes: int
    protocol: Protocol
    local_s: np.ndarray  # duration of a local copy / reduction; fused reduce time for NET
    route: np.ndarray  # index into routes for NET ops, -1 otherwise
    route_ptr: np.ndarray
    route_links: np.ndarray
    route_latency_s: np.ndarray  # per route: max(path, protocol hop latency), step_latency_s
    in_network: dict[int, tuple[np.ndarray, np.ndarray]]  # op -> (links per flow, links)
    in_network_latency_s: dict[int, float]  # op -> max(path, protocol hop latency)
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    waiting: np.ndarray  # unmet dependencies per op (engines decrement their own copies)
    in_network_traffic: dict[int, float] = field(default_factory=dict)
    """op -> bytes each of its flows carries per payload byte (an NVSwitch: ``1 + 1/n``)."""
    route_share: np.ndarray | None = None
    """Where some route is several paths: per entry of ``route_links`` (then each route's links
    crossed by any of its paths, once), the share of the route's bytes that crosses it."""
    path_ptr: np.ndarray | None = None
    """Where some route is several paths (:mod:`collsim.topology.multipath`): route ``r``'s
    paths are ``path_ptr[r]:path_ptr[r + 1]``; ``None``: each route is one path, its links."""
    path_weight: np.ndarray | None = None  # per path, its share of the route's bytes
    path_link_ptr: np.ndarray | None = None  # CSR of each path's links
    path_links: np.ndarray | None = None
    release_s: np.ndarray | None = None  # earliest start per op (rank start times), if any
    after: np.ndarray | None = None  # the op a transfer's flow follows on its connection, or -1
    follow_ptr: np.ndarray | None = None  # CSR: the transfers following each op (``after``)
    follow_idx: np.ndarray | None = None
    route_flush_s_per_byte: np.ndarray | None = None
    """Per route, the serial GPUDirect receive flush per payload byte (Simple transfers into a
    flushing NIC, :func:`route_flush`), held after the flow (:meth:`tail_s`); ``None``: no
    route flushes."""
    route_ceiling: np.ndarray | None = None
    """Per route, the wire bytes/s one transfer's flow on it may reach (its channel's, see
    :func:`channel_ceiling`); ``None``: no ceiling."""

    def drop_dag(self) -> None:
        """Free the dependency structure (successor and follower lists, counters, ``after``),
        ~1 GB at 33 million ops, once every op has been timed and only records remain to be
        built. The object can then no longer be replayed (nothing would ever be released)."""
        self.succ_ptr = self.succ_idx = self.waiting = np.zeros(0, dtype=np.int32)
        self.after = self.follow_ptr = self.follow_idx = None

    def payload_bytes(self, ops: np.ndarray | slice) -> np.ndarray:
        """Payload bytes of ``ops`` (ids or a slice)."""
        return self.count[ops].astype(np.float64) * self.elem_bytes

    def wire_bytes(self, ops: np.ndarray | slice) -> np.ndarray:
        """Bytes the protocol puts on the wire for ``ops`` (each flow of an in-network op)."""
        wire = self.protocol.wire_bytes(self.payload_bytes(ops))
        if self.in_network_traffic:
            ids = np.arange(self.cls.shape[0])[ops] if isinstance(ops, slice) else np.asarray(ops)
            if ids.ndim == 0:
                return wire * self.in_network_traffic.get(int(ids), 1.0)
            wire = np.array(wire, dtype=np.float64)
            for i in np.flatnonzero(self.cls[ids] == IN_NETWORK):
                wire[i] *= self.in_network_traffic.get(int(ids[i]), 1.0)
        return wire

    def tail_s(self, ops: np.ndarray) -> np.ndarray | None:
        """Time a network transfer of ``ops`` holds after its flow ends, before it completes:
        the receive's GPUDirect flushes (:func:`route_flush`), in series with the flow, so
        that the transfer it is followed by on its connection and its successors wait for them
        (a latency would overlap the transfer before it); ``None`` where nothing flushes."""
        if self.route_flush_s_per_byte is None:
            return None
        tail = np.zeros(ops.shape[0])
        net = self.cls[ops] == NET
        ids = ops[net]
        tail[net] = self.route_flush_s_per_byte[self.route[ids]] * self.payload_bytes(ids)
        return tail

    def latency_s(self, ops: np.ndarray) -> np.ndarray:
        """Latency before the flows of ``ops`` start (0 for local operations)."""
        cls = self.cls[ops]
        net = cls == NET
        latency = np.zeros(ops.shape[0])
        latency[net] = self.route_latency_s[self.route[ops[net]]]
        if self.in_network:
            for i in np.flatnonzero(cls == IN_NETWORK):
                latency[i] = self.in_network_latency_s[int(ops[i])]
        return latency


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


def flows_per_channel(meta: dict) -> int:
    """Concurrent flows one channel's thread block drives into (and out of) a rank: a tree
    all-reduce (``meta["trees"]``, two per channel) receives from its child and its parent at
    once, reduce and broadcast overlapping, on each tree; every other schedule one."""
    trees = int(meta.get("trees", 0))
    return 2 * trees if trees else 1


def channel_ceiling(
    fabric: Fabric, protocol: Protocol, meta: dict | None = None
) -> np.ndarray | None:
    """Wire bytes/s a transfer's flow may reach, per link class (nvlink, pci, net): what one
    NCCL channel of ``protocol`` moves (the fabric's ``channel_payload_bytes_per_s``, point to
    point where the schedule's ``meta`` says so; ``meta["both_ways"]``: its ranks send and
    receive at once, which slows channels staged through host memory, shared by the block's
    :func:`flows_per_channel`) times the channels the
    transfer stands for (``meta["channels_per_transfer"]``, 1 by default), over the protocol's
    payload fraction.
    ``None`` where the fabric has no ceiling. The analytic model caps its flows with the same."""
    meta = meta or {}
    per_channel = getattr(fabric, "channel_payload_bytes_per_s", None)
    p2p = bool(meta.get("point_to_point", False))
    if per_channel is None:
        rates = None
    elif meta.get("both_ways"):  # host-staged classes copy slower (channel_rates)
        rates = per_channel(
            protocol.name, p2p, both_ways=True, flows_per_channel=flows_per_channel(meta)
        )
    else:
        rates = per_channel(protocol.name, p2p)
    if rates is None:
        return None
    width = float(meta.get("channels_per_transfer", 1.0))
    return np.asarray(rates, dtype=np.float64) * width / protocol.bandwidth_fraction


def _route_kind(link_kind: np.ndarray, ptr: np.ndarray, links: np.ndarray) -> np.ndarray:
    """The slowest link kind (largest code) on each route; NVLink (0) for empty routes."""
    lengths = np.diff(ptr)
    kinds = np.zeros(lengths.shape[0], dtype=np.int64)
    nonempty = lengths > 0
    if nonempty.any():
        kinds[nonempty] = np.maximum.reduceat(link_kind[links], ptr[:-1][nonempty])
    return kinds


def _transport_overhead(
    fabric: Fabric, protocol: Protocol, ptr: np.ndarray, links: np.ndarray
) -> np.ndarray | float:
    """Per route, the net transport's per-step overhead for ``protocol`` (the fabric's
    ``transport_overhead_s``, where it has one: :class:`collsim.topology.fabric.TopologyFabric`)."""
    table = getattr(fabric, "transport_overhead_s", None)
    row = PROTOCOL_INDEX.get(protocol.name.lower())
    if table is None or row is None:
        return 0.0
    return route_overhead_s(np.asarray(table[row], dtype=np.float64), ptr, links)


def route_flush(
    fabric: Fabric,
    protocol: str,
    ptr: np.ndarray,
    links: np.ndarray,
    trees: int = 0,
    per_link_scale: np.ndarray | None = None,
) -> np.ndarray | None:
    """Per route, the serial GPUDirect receive flush per payload byte (the fabric's
    ``flush_s_per_byte``, largest over the route's links: a route enters one receiving NIC),
    for Simple only (NCCL flushes Simple network receives: ``p == NCCL_PROTO_SIMPLE``,
    src/transport/net.cc); ``None`` where nothing flushes. ``trees``: the concurrent trees of
    one channel in the schedule (``meta["trees"]``): NCCL runs one tree per channel (its double
    binary tree's two trees on different channels, ``src/graph/connect.cc``), so a channel's
    flushes follow each other on its one connection where the schedule gives each channel both
    trees with half its bytes at once: each tree's bytes pay the flushes of all of them. The
    analytic model adds the same to its flows' seconds per byte (:mod:`collsim.model.flows`),
    each link's figure times ``per_link_scale`` (a calibration's bandwidth efficiency divides
    it, as it divides the time of the link's bytes)."""
    table = getattr(fabric, "flush_s_per_byte", None)
    if table is None or protocol.lower() != "simple":
        return None
    table = np.asarray(table, dtype=np.float64)
    if not np.any(table > 0):
        return None
    if per_link_scale is not None:
        table = table * per_link_scale
    return route_overhead_s(table, ptr, links) * max(1, int(trees))


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
    is_xfer = kind == TRANSFER
    local = is_xfer & (src == dst)
    cls = np.full(n, NET, dtype=np.int8)
    cls[local] = COPY
    cls[(kind == REDUCTION) | (local & a["reduce"])] = LOCAL_REDUCE
    cls[kind == NETWORK_REDUCE] = IN_NETWORK
    del is_xfer, local
    fused = (cls == NET) & a["reduce"]
    prep = Prepared(
        cls=cls,
        fused=fused,
        count=a["count"],
        elem_bytes=schedule.elem_bytes,
        protocol=protocol,
        local_s=np.zeros(n),
        route=np.full(n, -1, dtype=np.int32),
        route_ptr=np.zeros(1, np.int64),
        route_links=np.zeros(0, np.int64),
        route_latency_s=np.zeros(0),
        in_network={},
        in_network_latency_s={},
        succ_ptr=np.zeros(1, np.int64),
        succ_idx=np.zeros(0, np.int64),
        waiting=np.zeros(n, np.int32),
    )
    _local_times(prep, schedule, fabric, rank_slowdown)
    if rank_start_s is not None:
        prep.release_s = op_release_s(schedule, check_rank_start(rank_start_s, schedule.nranks))
    _routes(prep, schedule, fabric, protocol)
    _dag(prep, schedule)
    return prep


def _local_times(
    prep: Prepared, schedule: Schedule, fabric: Fabric, rank_slowdown: np.ndarray | None
) -> None:
    """Fill ``prep.local_s``: copies and reductions at the GPU's copy / reduce rate (of the
    issuing rank), fused receive-reduces at the receiver's reduce rate; stretched by
    ``rank_slowdown``."""
    src, dst = schedule.arrays["src"], schedule.arrays["dst"]
    reduce_rate = np.asarray(fabric.reduce_bytes_per_s, dtype=np.float64)
    copy_rate = np.asarray(fabric.copy_bytes_per_s, dtype=np.float64)
    for part in chunks(len(schedule)):
        cls, fused, local_s = prep.cls[part], prep.fused[part], prep.local_s[part]
        for code, rate in ((COPY, copy_rate), (LOCAL_REDUCE, reduce_rate)):
            ops = np.flatnonzero(cls == code) + part.start
            local_s[ops - part.start] = prep.payload_bytes(ops) / rate[src[ops]]
        ops = np.flatnonzero(fused) + part.start
        local_s[ops - part.start] = prep.payload_bytes(ops) / reduce_rate[dst[ops]]
    if rank_slowdown is not None:
        slowdown = check_rank_slowdown(rank_slowdown, schedule.nranks)
        prep.local_s = slow_local(prep.local_s, slowdown, schedule, prep.fused)


def _routes(prep: Prepared, schedule: Schedule, fabric: Fabric, protocol: Protocol) -> None:
    """Route every network transfer (one lookup per distinct rank pair, numbered in sorted pair
    order) and every in-network reduction; their latencies."""
    a = schedule.arrays
    nranks = fabric.nranks
    parts = chunks(len(schedule))

    def pair_keys(part: slice) -> tuple[np.ndarray, np.ndarray]:
        net = np.flatnonzero(prep.cls[part] == NET) + part.start
        return net, a["src"][net].astype(np.int64) * nranks + a["dst"][net]

    keys = _distinct(np.concatenate([_distinct(pair_keys(part)[1]) for part in parts] or [[]]))
    keys = keys.astype(np.int64)
    link_kind = np.asarray(fabric.link_kind, dtype=np.int64)
    if keys.size:
        if getattr(fabric, "multipath", False):
            route_ptr, route_links, route_lat = _paths(prep, fabric, keys // nranks, keys % nranks)
        else:
            route_ptr, route_links, route_lat = fabric.routes(keys // nranks, keys % nranks)
        prep.route_ptr = np.asarray(route_ptr, dtype=np.int64)
        prep.route_links = np.asarray(route_links, dtype=np.int64)
        kinds = _route_kind(link_kind, prep.route_ptr, prep.route_links)
        transport = _transport_overhead(fabric, protocol, prep.route_ptr, prep.route_links)
        if schedule.meta.get("point_to_point", False):
            transport = transport + _through_proxies(prep, fabric, keys // nranks, keys % nranks)
        prep.route_latency_s = step_latency_s(route_lat, protocol.hop_latency(kinds), transport)
        prep.route_flush_s_per_byte = route_flush(
            fabric, protocol.name, prep.route_ptr, prep.route_links,
            int(schedule.meta.get("trees", 0)),
        )  # fmt: skip
        # Only a fabric with host-staged classes asks (a sort of the transfers' ranks).
        both = bool(getattr(fabric, "host_staged", ())) and schedule.copies_both_ways()
        meta = {**schedule.meta, "both_ways": both}
        ceiling = channel_ceiling(fabric, protocol, meta)
        if ceiling is not None:
            prep.route_ceiling = ceiling[kinds]
        prep.route = prep.route.astype(int_dtype(-1, keys.size, np.int32))
        for part in parts:
            net, pair = pair_keys(part)
            distinct, inverse = np.unique(pair, return_inverse=True)
            prep.route[net] = np.searchsorted(keys, distinct)[inverse]

    nbytes = int(schedule.count) * int(schedule.elem_bytes)
    nvls_all_reduce = getattr(fabric, "nvls_all_reduce", None)
    nvls_chunks = getattr(fabric, "in_network_chunks", None)
    for op in np.flatnonzero(prep.cls == IN_NETWORK):
        srcs = np.asarray(schedule.groups[a["src"][op]], dtype=np.int64)
        dsts = np.asarray(schedule.groups[a["dst"][op]], dtype=np.int64)
        up_ptr, up_links, down_ptr, down_links, lat = fabric.in_network(srcs, dsts)
        links = np.concatenate((up_links, down_links)).astype(np.int64)
        nlinks = np.concatenate((np.diff(up_ptr), np.diff(down_ptr))).astype(np.int64)
        worst = int(link_kind[links].max()) if links.size else 0
        # An NVLS all-reduce takes NCCL's NVLS latency in place of the per-hop one, and its
        # channels pay one route trip per chunk they move (:mod:`collsim.nvls`; NVLS+tree's on
        # its node reduce): every op of the call (every chunk's node reduce) waits for them.
        nvls = nvls_all_reduce is not None and nvls_all_reduce(srcs, dsts)
        hop = NVLS_LATENCY_S if nvls else protocol.hop_latency(worst)
        serial = nvls_chunks(srcs, dsts, nbytes) * lat if nvls_chunks is not None else 0.0
        prep.in_network_latency_s[int(op)] = float(step_latency_s(lat, hop) + serial)
        prep.in_network[int(op)] = (nlinks, links)
        traffic = getattr(fabric, "in_network_traffic", None)
        if traffic is not None:
            prep.in_network_traffic[int(op)] = float(traffic(srcs, dsts))


def _through_proxies(
    prep: Prepared, fabric: Fabric, src: np.ndarray, dst: np.ndarray
) -> np.ndarray | float:
    """Put each point-to-point route (and each of its paths) through its sender's and its
    receiver's proxy links (the fabric's ``proxy_links``: a per-GPU message-rate capacity,
    :mod:`collsim.transports`); the proxy's per-message time each route adds to its latency."""
    proxy_links = getattr(fabric, "proxy_links", None)
    found = None if proxy_links is None else proxy_links(src, dst, prep.route_ptr, prep.route_links)
    if found is None:
        return 0.0
    extra, message_s = found
    if prep.path_ptr is not None:  # every path of a pair crosses the pair's proxies
        owner = np.repeat(np.arange(extra.shape[0]), np.diff(prep.path_ptr))
        prep.path_link_ptr, prep.path_links = append_links(
            prep.path_link_ptr, prep.path_links, extra[owner]
        )
        _, prep.route_share = append_links(
            prep.route_ptr, prep.route_share, extra, np.ones(extra.shape)
        )
    prep.route_ptr, prep.route_links = append_links(prep.route_ptr, prep.route_links, extra)
    return message_s


def _paths(
    prep: Prepared, fabric: Fabric, src: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Routes of a fabric that may split flows (``fabric.paths``). Where every pair has one
    path, exactly what ``fabric.routes`` gives; otherwise each route's links are those any of
    its paths crosses (once, with ``route_share``) and ``prep`` keeps the paths."""
    pair_ptr, weight, ptr, links, latency = fabric.paths(src, dst)  # type: ignore[attr-defined]
    pair_ptr = np.asarray(pair_ptr, dtype=np.int64)
    ptr = np.asarray(ptr, dtype=np.int64)
    links = np.asarray(links, dtype=np.int64)
    npaths = np.diff(pair_ptr)
    if np.all(npaths == 1):
        return ptr, links, latency
    prep.path_ptr = pair_ptr
    prep.path_weight = np.asarray(weight, dtype=np.float64)
    prep.path_link_ptr, prep.path_links = ptr, links
    # Each route's links, once each, with the share of its bytes crossing them.
    owner = np.repeat(np.repeat(np.arange(npaths.shape[0]), npaths), np.diff(ptr))
    share = np.repeat(prep.path_weight, np.diff(ptr))
    nlinks = int(links.max()) + 1 if links.size else 1
    pair_link, where = np.unique(owner * nlinks + links, return_inverse=True)
    route_share = np.bincount(where, weights=share, minlength=pair_link.shape[0])
    prep.route_share = route_share
    lengths = np.bincount(pair_link // nlinks, minlength=npaths.shape[0])
    return ptr_from_lengths(lengths), pair_link % nlinks, latency


def _distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct ``values``, by sorting (numpy 2.3+'s ``np.unique`` hashes instead, which
    is ~10x slower on the millions of rank-pair keys of a large schedule)."""
    values = np.sort(values)
    return values[np.r_[True, values[1:] != values[:-1]]] if values.size else values


def _dag(prep: Prepared, schedule: Schedule) -> None:
    """Successor lists, dependency counters and the ``after`` followers (CSR, narrow ids)."""
    n = len(schedule)
    ids = index_dtype(n)
    ndeps = np.diff(schedule.dep_ptr)
    prep.waiting = ndeps.astype(np.int32)
    owner = np.repeat(np.arange(n, dtype=ids), ndeps)
    del ndeps
    order = np.argsort(schedule.dep_idx, kind="stable")
    prep.succ_idx = owner[order]
    del owner, order
    lengths = np.bincount(schedule.dep_idx, minlength=n)
    prep.succ_ptr = ptr_from_lengths(lengths, index_dtype(schedule.dep_idx.shape[0]))
    if "after" not in schedule.arrays:
        return
    # Only network transfers and in-network reductions follow another on a connection.
    flows = (prep.cls == NET) | (prep.cls == IN_NETWORK)
    given = schedule.arrays["after"]
    if given.dtype == ids and not np.any((given >= 0) & ~flows):
        after = given  # shared with the schedule, read only (saves n ids on large schedules)
    else:
        after = np.where(flows, given, -1).astype(ids)
    del flows
    followers = np.flatnonzero(after >= 0)
    if not followers.size:
        return
    pred = after[followers]
    prep.follow_idx = followers[np.argsort(pred, kind="stable")].astype(ids)
    prep.follow_ptr = ptr_from_lengths(np.bincount(pred, minlength=n), ids)
    prep.after = after
