"""The contention-free fast path: time a schedule as a longest-path problem, then prove it exact.

Why: on real fabrics the ring edges differ (NVLink inside a server, InfiniBand between servers),
so transfers finish at nearly all-different times and the event replay handles ~4 transfers per
event. Yet most collectives at scale never put two flows on one directed link at the same time.
When that holds, max-min sharing is trivial (every flow runs at its route's bottleneck), local
reductions never wait for their GPU, and the replay reduces to longest paths over the DAG.

1. Durations (:func:`_durations`), exactly as the replay computes them: a network transfer
   starts its flow ``latency`` after its dependencies are met (and not before the transfer it
   follows on its connection has ended) and ends ``wire / bottleneck`` later (a fused
   receive-reduce at the later of that and ``flow start + reduction time``); a copy or
   reduction takes ``bytes / rate``; an in-network reduction ends when its slowest up or down
   flow does. Floating-point operations are grouped as in the replay
   (``max(start + latency, ...) + duration``) so times come out bit-identical.
2. Times (:func:`_times`): the DAG in frontier order, one numpy batch per level (a 1024-rank
   ring has ~2046 levels): ``start = max(end of deps)``, ``end = start + ...``; with per-rank
   start times (:mod:`collsim.engine.skew`) the max also takes the op's release time.
3. Verification: every flow's active interval ``[flow start, flow end)`` is checked against the
   others on each directed link it crosses (:func:`_link_busy`), and local reductions against
   each other on their GPU (:func:`_reductions_overlap`). Sorted by start, a set of
   intervals is disjoint iff each starts no earlier than the previous one ends, so one pass over
   consecutive pairs suffices. Intervals closer than a fraction of the replay's 1e-12 batching
   window count as back to back (the replay handles them in one batch, ending one flow before
   starting the next). Any overlap: :func:`contention_free` returns ``None`` and the caller
   runs the replay, so the answer is always the replay's.

A schedule with a transfer split over several paths (:mod:`collsim.topology.multipath`) goes to
the replay directly: the sub-flows of one transfer share its GPU's and NIC's links.

Links crossed by a single route (all links of a ring) are checked per route, without expanding
flows onto links; only links shared by several routes are expanded, in chunks of link ids, so
memory stays proportional to a chunk rather than to transfers x hops.
"""

from __future__ import annotations

import itertools

import numpy as np

from collsim.collectives.schedule import Schedule, index_dtype
from collsim.engine._csr import gather_rows, ptr_from_lengths
from collsim.engine.fabric import Fabric
from collsim.engine.prepare import CHUNK, IN_NETWORK, LOCAL_REDUCE, NET, Prepared, chunks
from collsim.engine.results import SimResult
from collsim.engine.summarize import Timeline, build_result
from collsim.protocols import Protocol

_TOL = 0.5e-12
"""Relative gap under which a flow starting before the previous one on its link ends still
counts as back to back: half the replay's batching window, so such pairs are one batch there."""

_PAIR_CHUNK = 1 << 22
"""Most (flow, shared link) pairs expanded at once by the shared-link check."""


class _Flows:
    """Every flow that puts bytes on links, in two parts.

    Network transfers have one flow each, on their route: ``net_op`` (the flowing ones, in op
    order) and ``net_route``; their durations are recomputed when needed (:meth:`net_duration`)
    rather than stored. In-network reductions have one flow per up or down path, listed
    explicitly (there are few): ``op``, ``route`` (into an extended route table whose tail,
    from ``net_routes`` on, holds their paths) and ``duration_s``. ``bottleneck`` holds every
    route's slowest link (what its flows run at). Flow order (which breaks ties between equal
    start times) is network flows first, then in-network ones."""

    def __init__(self, prep: Prepared, capacity: np.ndarray) -> None:
        nroutes = prep.route_ptr.shape[0] - 1
        self.net_routes = nroutes
        lengths = np.diff(prep.route_ptr)
        self.bottleneck = np.full(nroutes, np.inf)
        nonempty = lengths > 0
        if nonempty.any():
            self.bottleneck[nonempty] = np.minimum.reduceat(
                capacity[prep.route_links], prep.route_ptr[:-1][nonempty]
            )
        if prep.route_ceiling is not None:  # a flow alone runs at most at its channel's rate
            np.minimum(self.bottleneck, prep.route_ceiling, out=self.bottleneck)
        parts = []
        for part in chunks(prep.cls.shape[0]):
            net = np.flatnonzero(prep.cls[part] == NET) + part.start
            flowing = (lengths[prep.route[net]] > 0) & (prep.wire_bytes(net) > 0)
            parts.append(net[flowing].astype(index_dtype(prep.cls.shape[0])))
        self.net_op = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        self.net_route = prep.route[self.net_op]
        owners, routes, durations, rates = [], [], [], []
        extra_lengths, extra_links = [lengths], [prep.route_links]
        for op, (nlinks, links) in sorted(prep.in_network.items()):
            wire_op = float(prep.wire_bytes(op))
            keep = nlinks > 0 if wire_op > 0 else np.zeros(nlinks.shape[0], dtype=bool)
            if not keep.any():
                continue
            links = links[np.repeat(keep, nlinks)]
            nlinks = nlinks[keep]
            first = ptr_from_lengths(nlinks)[:-1]
            owners.append(np.full(nlinks.shape[0], op, dtype=np.int64))
            routes.append(nroutes + np.arange(nlinks.shape[0], dtype=np.int64))
            rates.append(np.minimum.reduceat(capacity[links], first))
            durations.append(wire_op / rates[-1])
            extra_lengths.append(nlinks)
            extra_links.append(links)
            nroutes += nlinks.shape[0]
        self.op = np.concatenate(owners) if owners else np.zeros(0, np.int64)
        self.route = np.concatenate(routes) if routes else np.zeros(0, np.int64)
        self.duration_s = np.concatenate(durations) if durations else np.zeros(0)
        self.route_ptr = ptr_from_lengths(np.concatenate(extra_lengths))
        self.route_links = np.concatenate(extra_links)
        self.nroutes = nroutes
        self.bottleneck = np.concatenate((self.bottleneck, *rates))  # in-network routes too

    def net_duration(self, prep: Prepared, flows: np.ndarray | slice) -> np.ndarray:
        """Duration at full bottleneck of network flows ``flows`` (positions in ``net_op``)."""
        return prep.wire_bytes(self.net_op[flows]) / self.bottleneck[self.net_route[flows]]


def _durations(prep: Prepared, flows: _Flows) -> np.ndarray:
    """Per op, the time from flow start (after latency; dependencies met for local ops) to end."""
    duration = np.zeros(prep.cls.shape[0])
    for part in chunks(flows.net_op.shape[0]):
        duration[flows.net_op[part]] = flows.net_duration(prep, part)
    np.maximum.at(duration, flows.op, flows.duration_s)
    local = prep.cls != NET
    local &= prep.cls != IN_NETWORK
    duration[local] = prep.local_s[local]
    del local
    if prep.route_flush_s_per_byte is not None:  # a flushed receive holds after its flow
        for part in chunks(duration.shape[0]):
            duration[part] += prep.tail_s(np.arange(part.start, part.stop))
    # Fused receive-reduce: fs + max(a, b) == max(fs + a, fs + b), rounding being monotone.
    fused = np.flatnonzero(prep.fused)
    duration[fused] = np.maximum(duration[fused], prep.local_s[fused])
    return duration


def _times(
    prep: Prepared, duration: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Start, flow start and end of every op, level by level; ``None`` if some op is never
    released. A transfer that follows another on its connection (``after``) is processed once
    that one has ended too: its flow starts at ``max(start + latency, that end)``.

    Memory (a 4096-rank ring has 33 million ops): ``duration`` becomes the end times in place
    (each op's entry is read once, when it is released, and overwritten by its end), and the
    dependency counters are ``prep.waiting`` itself, counted down and restored afterwards
    (:func:`_restore_waiting`) for the replay should the times be rejected."""
    n = prep.cls.shape[0]
    waiting = prep.waiting
    # Dependencies met, or the issuing rank entered the collective if that is later (skew.py):
    # accumulated as dependencies end, final (the op's start) once the op is released.
    start_s = np.zeros(n) if prep.release_s is None else prep.release_s.copy()
    if prep.after is not None:
        waiting += prep.after >= 0
    flow_s = np.full(n, np.nan)
    end_s = duration
    succ_ptr, succ_idx = prep.succ_ptr, prep.succ_idx
    frontier = np.flatnonzero(waiting == 0)
    reached = 0
    while frontier.shape[0]:
        reached += frontier.shape[0]
        flow = start_s[frontier] + prep.latency_s(frontier)
        if prep.after is not None:  # not before the transfer it follows has ended
            pred = prep.after[frontier]
            follows = pred >= 0
            flow[follows] = np.maximum(flow[follows], end_s[pred[follows]])
        end = flow + end_s[frontier]
        flow_s[frontier] = flow
        end_s[frontier] = end
        positions, lengths = gather_rows(succ_ptr, frontier)
        targets = succ_idx[positions]
        np.maximum.at(start_s, targets, np.repeat(end, lengths))
        np.subtract.at(waiting, targets, 1)
        if prep.follow_ptr is not None:
            fpos, _ = gather_rows(prep.follow_ptr, frontier)
            followers = prep.follow_idx[fpos]
            waiting[followers] -= 1  # one predecessor each: no repeats
            targets = np.concatenate((targets, followers))
        if targets.shape[0] == 0:
            break
        frontier = np.sort(targets[waiting[targets] == 0])
        if frontier.shape[0] > 1:  # an op released by several deps is listed once each
            frontier = frontier[np.r_[True, frontier[1:] != frontier[:-1]]]
    if reached != n:
        return None
    return start_s, flow_s, end_s


def _restore_waiting(prep: Prepared) -> None:
    """Put back the dependency counters :func:`_times` counted down: each op's count is the
    number of times it is listed as a successor."""
    n = prep.waiting.shape[0]
    prep.waiting = np.bincount(prep.succ_idx, minlength=n).astype(np.int32)


def _group_order(keys: np.ndarray, nkeys: int) -> np.ndarray:
    """Stable argsort of small non-negative integer ``keys`` (radix sort when they fit 16 bits)."""
    if nkeys <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def _overlap(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> bool:
    """Whether intervals, sorted by group then start, overlap within a group (see module doc)."""
    if group.shape[0] < 2:
        return False
    same = group[1:] == group[:-1]
    return bool(np.any(same & (start[1:] < end[:-1] - _TOL * end[:-1])))


def _route_chunks(counts: np.ndarray) -> list[tuple[int, int]]:
    """Ranges of consecutive routes holding at most ~:data:`CHUNK` flows each (at least one
    route per range), given the flows per route."""
    bounds = [0]
    total = np.cumsum(counts)
    while bounds[-1] < counts.shape[0]:
        lo = bounds[-1]
        base = total[lo - 1] if lo else 0
        bounds.append(max(lo + 1, int(np.searchsorted(total, base + CHUNK, "right"))))
    return list(itertools.pairwise(bounds))


def _unbound_couplings(flows: _Flows, capacity: np.ndarray, couplings: np.ndarray) -> np.ndarray:
    """Per link, whether it is a coupling (a cable's two directions sharing a capacity) that no
    flows can fill: the fastest flow each way together fit in it. Flows that share neither a
    direction nor a route meet only there, one each way at a time, so they then keep their own
    rates (as the replay's max-min sharing gives them) and may overlap on it."""
    free = np.zeros(capacity.shape[0], dtype=bool)
    if couplings.shape[0] == 0:
        return free
    used = np.zeros(flows.nroutes, dtype=bool)
    used[flows.net_route] = True
    used[flows.route] = True
    rate = np.where(used, flows.bottleneck, 0.0)  # each route's flows run at its bottleneck
    fastest = np.zeros(capacity.shape[0])
    entry_route = np.repeat(np.arange(flows.nroutes), np.diff(flows.route_ptr))
    np.maximum.at(fastest, flows.route_links, rate[entry_route])
    link, a, b = couplings.T
    free[link] = fastest[a] + fastest[b] <= capacity[link]
    return free


def _link_busy(
    prep: Prepared, flows: _Flows, flow_s: np.ndarray, nlinks: int, unbound: np.ndarray
) -> np.ndarray | None:
    """Per-link busy time, or ``None`` if two flows share a link at some moment (except on the
    ``unbound`` couplings, where they keep their rates).

    Busy time is summed per link in time order, as the replay accumulates it, so it is
    bit-identical: ``np.bincount`` adds its weights in input order. Flows are handled a range
    of routes (or, for links several routes cross, a range of links) at a time, so memory
    stays proportional to that range rather than to all transfers.
    """
    route_busy = np.zeros(flows.nroutes)
    counts = np.bincount(flows.net_route, minlength=flows.net_routes)
    for lo, hi in _route_chunks(counts):
        sel = np.flatnonzero((flows.net_route >= lo) & (flows.net_route < hi))
        start = flow_s[flows.net_op[sel]]
        end = start + flows.net_duration(prep, sel)
        key = flows.net_route[sel] - lo
        order = np.argsort(start, kind="stable")
        grouped = order[_group_order(key[order], hi - lo)]
        if _overlap(key[grouped], start[grouped], end[grouped]):
            return None
        del grouped
        busy_each = end - start  # what the replay credits a link for each flow on it
        route_busy[lo:hi] = np.bincount(key[order], weights=busy_each[order], minlength=hi - lo)
    start = flow_s[flows.op]  # in-network flows: one per route
    route_busy[flows.route] = (start + flows.duration_s) - start

    entry_route = np.repeat(np.arange(flows.nroutes), np.diff(flows.route_ptr))
    uses = np.bincount(flows.route_links, minlength=nlinks)
    busy = np.zeros(nlinks)
    private = uses[flows.route_links] == 1
    busy[flows.route_links[private]] = route_busy[entry_route[private]]
    shared = ~private
    if not shared.any():
        return busy
    # Links several routes cross: expand (flow, link) pairs, a chunk of links at a time.
    links, local = np.unique(flows.route_links[shared], return_inverse=True)
    entry_route = entry_route[shared]
    flows_per_route = np.bincount(
        np.concatenate((flows.net_route, flows.route)).astype(np.int64), minlength=flows.nroutes
    )
    load = np.bincount(local, weights=flows_per_route[entry_route], minlength=links.shape[0])
    lo = 0
    while lo < links.shape[0]:
        hi = max(lo + 1, int(np.searchsorted(np.cumsum(load[lo:]), _PAIR_CHUNK, "right")) + lo)
        hi = min(hi, lo + (1 << 16), links.shape[0])
        in_chunk = (local >= lo) & (local < hi)
        crossing = np.zeros(flows.nroutes, dtype=bool)
        crossing[entry_route[in_chunk]] = True
        # The flows on these links, network ones first as in the flow order, then by start.
        net = np.flatnonzero(crossing[flows.net_route])
        extra = np.flatnonzero(crossing[flows.route])
        route = np.concatenate((flows.net_route[net], flows.route[extra])).astype(np.int64)
        start = np.concatenate((flow_s[flows.net_op[net]], flow_s[flows.op[extra]]))
        end = start + np.concatenate((flows.net_duration(prep, net), flows.duration_s[extra]))
        order = np.argsort(start, kind="stable")
        ptr = ptr_from_lengths(np.bincount(entry_route[in_chunk], minlength=flows.nroutes))
        positions, lengths = gather_rows(ptr, route[order])  # flows in time order
        pair_link = (local[in_chunk] - lo)[positions]
        pair_flow = np.repeat(order, lengths)
        by_link = _group_order(pair_link, hi - lo)
        f = pair_flow[by_link]
        check = ~unbound[links[lo:hi]][pair_link[by_link]]
        if _overlap(pair_link[by_link][check], start[f][check], end[f][check]):
            return None
        busy_each = end - start
        busy[links[lo:hi]] = np.bincount(pair_link, weights=busy_each[pair_flow], minlength=hi - lo)
        lo = hi
    return busy


def _reductions_overlap(
    prep: Prepared, rank: np.ndarray, start_s: np.ndarray, end_s: np.ndarray
) -> bool:
    """Whether two local reductions would share a GPU (the replay serialises them).

    Exact comparisons, and equal starts count as overlap: the replay's order between them
    (and so which one waits) is then not read off the times."""
    ops = np.flatnonzero(prep.cls == LOCAL_REDUCE)
    if ops.shape[0] < 2:
        return False
    ops = ops[np.argsort(start_s[ops], kind="stable")]
    ops = ops[np.argsort(rank[ops], kind="stable")]
    same = rank[ops][1:] == rank[ops][:-1]
    s, e = start_s[ops], end_s[ops]
    return bool(np.any(same & ((s[1:] < e[:-1]) | (s[1:] == s[:-1]))))


def contention_free(
    schedule: Schedule, fabric: Fabric, protocol: Protocol, prep: Prepared
) -> SimResult | None:
    """The replay's result computed without events, or ``None`` if resources are ever shared
    (two flows on one directed link, two reductions on one GPU) and the replay must run."""
    if prep.path_ptr is not None:
        # Some transfer is split over paths that share its first and last links (the GPU's
        # NIC): its own sub-flows contend there, so the replay shares them.
        return None
    capacity = np.asarray(fabric.capacity_bytes_per_s, dtype=np.float64)
    flows = _Flows(prep, capacity)
    times = _times(prep, _durations(prep, flows))
    if times is None:
        _restore_waiting(prep)
        return None
    start_s, flow_s, end_s = times
    if _reductions_overlap(prep, schedule.arrays["src"], start_s, end_s):
        _restore_waiting(prep)
        return None
    couplings = np.asarray(getattr(fabric, "couplings", np.zeros((0, 3))), dtype=np.int64)
    unbound = _unbound_couplings(flows, capacity, couplings)
    busy = _link_busy(prep, flows, flow_s, capacity.shape[0], unbound)
    if busy is None:
        _restore_waiting(prep)
        return None
    prep.drop_dag()  # exact: the replay will not run, and the records need no dependencies
    for part in chunks(flow_s.shape[0]):  # local operations have no flow
        cls = prep.cls[part]
        flow_s[part][(cls != NET) & (cls != IN_NETWORK)] = np.nan
    in_network_bytes = np.zeros(capacity.shape[0])
    if flows.op.shape[0]:
        hops = np.diff(flows.route_ptr)[flows.net_routes :]
        wire = np.repeat(prep.wire_bytes(flows.op), hops)
        tail = flows.route_links[flows.route_ptr[flows.net_routes] :]
        np.add.at(in_network_bytes, tail, wire)
    del flows
    timeline = Timeline(start_s, flow_s, end_s, busy, in_network_bytes)
    return build_result(schedule, fabric, protocol, prep, timeline, "contention_free")
