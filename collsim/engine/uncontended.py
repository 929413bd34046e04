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
   each other on their GPU (:func:`_reductions_overlap`). Sorted by start, a set of intervals
   is disjoint iff each interval starts no earlier than the previous one ends, so one pass over
   consecutive pairs suffices. Intervals closer than a fraction of the replay's 1e-12 batching
   window count as back to back (the replay handles them in one batch, ending one flow before
   starting the next). Any overlap: :func:`contention_free` returns ``None`` and the caller
   runs the replay, so the answer is always the replay's.

Links crossed by a single route (all links of a ring) are checked per route, without expanding
flows onto links; only links shared by several routes are expanded, in chunks of link ids, so
memory stays proportional to a chunk rather than to transfers x hops.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.schedule import Schedule
from collsim.engine._csr import gather_rows, ptr_from_lengths
from collsim.engine.fabric import Fabric
from collsim.engine.prepare import IN_NETWORK, LOCAL_REDUCE, NET, Prepared
from collsim.engine.results import SimResult
from collsim.engine.summarize import Timeline, build_result
from collsim.protocols import Protocol

_TOL = 0.5e-12
"""Relative gap under which a flow starting before the previous one on its link ends still
counts as back to back: half the replay's batching window, so such pairs are one batch there."""

_PAIR_CHUNK = 1 << 22
"""Most (flow, shared link) pairs expanded at once by the shared-link check."""


class _Flows:
    """Every flow that puts bytes on links: its route (into an extended route table whose tail
    holds the in-network flows' paths), owning operation and duration at full bottleneck."""

    def __init__(self, prep: Prepared, capacity: np.ndarray) -> None:
        nroutes = prep.route_ptr.shape[0] - 1
        self.net_routes = nroutes  # routes at or after this index are in-network flows
        lengths = np.diff(prep.route_ptr)
        bottleneck = np.full(nroutes, np.inf)
        nonempty = lengths > 0
        if nonempty.any():
            bottleneck[nonempty] = np.minimum.reduceat(
                capacity[prep.route_links], prep.route_ptr[:-1][nonempty]
            )
        net = np.flatnonzero(prep.cls == NET)
        route = prep.route[net]
        wire = prep.wire_bytes[net]
        flowing = (lengths[route] > 0) & (wire > 0)
        net, route = net[flowing], route[flowing]
        self.net_flows = net.shape[0]  # flows at or after this index are in-network flows
        owners, routes, durations = [net], [route], [wire[flowing] / bottleneck[route]]
        extra_lengths, extra_links = [lengths], [prep.route_links]
        for op, (nlinks, links) in sorted(prep.in_network.items()):
            wire_op = prep.wire_bytes[op]
            keep = nlinks > 0 if wire_op > 0 else np.zeros(nlinks.shape[0], dtype=bool)
            if not keep.any():
                continue
            links = links[np.repeat(keep, nlinks)]
            nlinks = nlinks[keep]
            first = ptr_from_lengths(nlinks)[:-1]
            owners.append(np.full(nlinks.shape[0], op, dtype=np.int64))
            routes.append(nroutes + np.arange(nlinks.shape[0], dtype=np.int64))
            durations.append(wire_op / np.minimum.reduceat(capacity[links], first))
            extra_lengths.append(nlinks)
            extra_links.append(links)
            nroutes += nlinks.shape[0]
        self.op = np.concatenate(owners)
        self.route = np.concatenate(routes)
        self.duration_s = np.concatenate(durations)
        self.route_ptr = ptr_from_lengths(np.concatenate(extra_lengths))
        self.route_links = np.concatenate(extra_links)
        self.nroutes = nroutes


def _durations(prep: Prepared, flows: _Flows) -> np.ndarray:
    """Per op, the time from flow start (after latency; dependencies met for local ops) to end."""
    duration = np.zeros(prep.cls.shape[0])
    np.maximum.at(duration, flows.op, flows.duration_s)
    local = prep.cls != NET
    local &= prep.cls != IN_NETWORK
    duration[local] = prep.local_s[local]
    # Fused receive-reduce: fs + max(a, b) == max(fs + a, fs + b), rounding being monotone.
    np.maximum(duration, np.where(prep.fused, prep.local_s, 0.0), out=duration)
    return duration


def _times(
    prep: Prepared, duration: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Start, flow start and end of every op, level by level; ``None`` if some op is never
    released. A transfer that follows another on its connection (``after``) is processed once
    that one has ended too: its flow starts at ``max(start + latency, that end)``."""
    n = prep.cls.shape[0]
    waiting = prep.waiting.copy()  # the replay's own counters stay untouched
    # Dependencies met, or the issuing rank entered the collective if that is later (skew.py).
    ready_s = np.zeros(n) if prep.release_s is None else prep.release_s.copy()
    pred_end_s = np.full(n, -np.inf)  # end of the op each one follows on its connection
    if prep.after is not None:
        waiting += prep.after >= 0
    start_s = np.full(n, np.nan)
    flow_s = np.full(n, np.nan)
    end_s = np.full(n, np.nan)
    latency, succ_ptr, succ_idx = prep.latency_s, prep.succ_ptr, prep.succ_idx
    frontier = np.flatnonzero(waiting == 0)
    reached = 0
    while frontier.shape[0]:
        reached += frontier.shape[0]
        start = ready_s[frontier]
        flow = np.maximum(start + latency[frontier], pred_end_s[frontier])
        end = flow + duration[frontier]
        start_s[frontier] = start
        flow_s[frontier] = flow
        end_s[frontier] = end
        positions, lengths = gather_rows(succ_ptr, frontier)
        targets = succ_idx[positions]
        np.maximum.at(ready_s, targets, np.repeat(end, lengths))
        np.subtract.at(waiting, targets, 1)
        if prep.follow_ptr is not None:
            fpos, flen = gather_rows(prep.follow_ptr, frontier)
            followers = prep.follow_idx[fpos]
            pred_end_s[followers] = np.repeat(end, flen)
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


def _link_busy(
    flows: _Flows, flow_start: np.ndarray, flow_end: np.ndarray, nlinks: int
) -> np.ndarray | None:
    """Per-link busy time, or ``None`` if two flows share a link at some moment.

    Busy time is summed per link in time order, as the replay accumulates it, so it is
    bit-identical: ``np.bincount`` adds its weights in input order.
    """
    busy_each = flow_end - flow_start  # what the replay credits a link for each flow on it
    order = np.argsort(flow_start, kind="stable")
    route = flows.route[order]
    grouped = order[_group_order(route, flows.nroutes)]
    if _overlap(flows.route[grouped], flow_start[grouped], flow_end[grouped]):
        return None
    route_busy = np.bincount(route, weights=busy_each[order], minlength=flows.nroutes)

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
    flows_per_route = np.bincount(flows.route, minlength=flows.nroutes)
    load = np.bincount(local, weights=flows_per_route[entry_route], minlength=links.shape[0])
    lo = 0
    while lo < links.shape[0]:
        hi = max(lo + 1, int(np.searchsorted(np.cumsum(load[lo:]), _PAIR_CHUNK, "right")) + lo)
        hi = min(hi, lo + (1 << 16), links.shape[0])
        in_chunk = (local >= lo) & (local < hi)
        ptr = ptr_from_lengths(np.bincount(entry_route[in_chunk], minlength=flows.nroutes))
        positions, lengths = gather_rows(ptr, route)  # flows in time order
        pair_link = (local[in_chunk] - lo)[positions]
        pair_flow = np.repeat(order, lengths)
        by_link = _group_order(pair_link, hi - lo)
        f = pair_flow[by_link]
        if _overlap(pair_link[by_link], flow_start[f], flow_end[f]):
            return None
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
    capacity = np.asarray(fabric.capacity_bytes_per_s, dtype=np.float64)
    flows = _Flows(prep, capacity)
    times = _times(prep, _durations(prep, flows))
    if times is None:
        return None
    start_s, flow_s, end_s = times
    if _reductions_overlap(prep, schedule.arrays["src"], start_s, end_s):
        return None
    flow_start_s = np.full(start_s.shape[0], np.nan)
    on_wire = (prep.cls == NET) | (prep.cls == IN_NETWORK)
    flow_start_s[on_wire] = flow_s[on_wire]
    fs = flow_start_s[flows.op]
    busy = _link_busy(flows, fs, fs + flows.duration_s, capacity.shape[0])
    if busy is None:
        return None
    in_network_bytes = np.zeros(capacity.shape[0])
    if flows.op.shape[0] > flows.net_flows:
        hops = np.diff(flows.route_ptr)[flows.net_routes :]
        wire = np.repeat(prep.wire_bytes[flows.op[flows.net_flows :]], hops)
        tail = flows.route_links[flows.route_ptr[flows.net_routes] :]
        np.add.at(in_network_bytes, tail, wire)
    timeline = Timeline(start_s, flow_start_s, end_s, busy, in_network_bytes)
    return build_result(schedule, fabric, protocol, prep, timeline, "contention_free")
