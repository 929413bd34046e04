"""The event replay compiled with numba: :mod:`collsim.engine.replay`'s loop at machine speed.

Under contention every batch is small (a flow ends, its successor starts a latency later) and the
Python replay pays ~140 us of interpreter and numpy overhead per batch whatever it does; a
2-million-transfer ring spends minutes there. This module runs the very same loop -- the same
batches at the same times, the same order of operations within a batch, the same flows in the
same start order -- as numba-compiled functions over flat arrays, with the flow network of
:mod:`collsim.engine.kernel_network`. For the reshare schemes "components" and "all" its times
are the Python replay's, bit for bit; "auto" and "local" settle locally as the Python side does,
equal up to rounding (a link's residual capacity sums the other flows in another order).

It handles what contended collectives use: network transfers on single-path routes (with
their channel's rate ceiling, fused receive-reduces, and ``after`` chains on a connection),
local copies and reductions. Schedules with anything else -- multi-path routes, in-network
reductions, per-rank start times, receive flushes -- go to the Python replay
(:func:`supported` says which), which stays the reference and the simpy process users extend.

The event heap (:mod:`collsim.engine.kernel_heap`) holds one entry per operation, ``(time, push
number, kind, op)``: the Python replay's entries group the operations of one push that share a
time, and popping per operation in push order visits them in the same order.

The replay's state ``rep`` is a tuple of arrays: 0 per-op floats (rows ``LAT``..), 1 per-op ints
(``CLS``..), 2-3 successor CSR, 4-5 follower CSR (``after``), 6 unmet dependencies, 7-9 route
CSR and ceilings, 10 per-op times (``START``..), 11 per-op counters (``FLOWS_LEFT``, ``PENDING``),
12 per-GPU free time, 13 event times, 14 scalars (``COUNTER``..), 15 event keys.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numba
import numpy as np

from collsim.engine import kernel_heap as heap
from collsim.engine import kernel_maxmin
from collsim.engine import kernel_network as kn
from collsim.engine.kernel_maxmin import append
from collsim.engine.prepare import COPY, LOCAL_REDUCE, NET, Prepared

_FLOW_START, _DONE = 0, 1
_REL_TOL = 1e-12
# per-op float rows (static: ``opf``; state: ``ost``) and int rows (``opi``; ``oint``)
LAT, WIRE, LOCAL = range(3)
START, FSTART, OEND, FUSED_END, LAT_DONE = range(5)
CLS, FUSED, ROUTE, SRC, AFTER = range(5)
FLOWS_LEFT, PENDING = range(2)
# replay scalars (``rs``)
COUNTER, N_PENDING, BATCHES, N_EVENTS, EV_OVERFLOW = range(5)


def supported(prep: Prepared) -> bool:
    """Whether the compiled replay handles ``prep`` (see the module doc)."""
    return (
        not prep.in_network
        and prep.path_ptr is None
        and prep.release_s is None
        and prep.route_flush_s_per_byte is None
    )


@numba.njit(cache=True, inline="always")
def _push(ev_t, ev_k, rs, time, kind, op):
    """Schedule ``op`` (an event of ``kind``) at ``time``; past the heap's room, set
    ``EV_OVERFLOW`` instead (the caller replays again with more room)."""
    n = rs[N_EVENTS]
    if n == ev_t.shape[0]:
        rs[EV_OVERFLOW] = 1
        return
    ev_t[n] = time
    ev_k[0, n] = rs[COUNTER]
    ev_k[1, n] = kind
    ev_k[2, n] = op
    rs[COUNTER] += 1
    rs[N_EVENTS] = n + 1
    heap.sift_up(ev_t, ev_k, n)


@numba.njit(cache=True, inline="always")
def _flows_finished(ops, t, rep):
    """The one flow of each of ``ops`` ended at ``t``; returns those complete now (a fused
    receive-reduce completes at max(flow end, flow start + reduction))."""
    opi, ost, oint, ev_t, ev_k, rs = rep[1], rep[10], rep[11], rep[13], rep[15], rep[14]
    out = np.empty(ops.shape[0], dtype=np.int64)
    n = 0
    for op in ops:
        oint[FLOWS_LEFT, op] -= 1
        if oint[FLOWS_LEFT, op] != 0:
            continue
        at = ost[FUSED_END, op] if opi[FUSED, op] else t
        if at > t:
            _push(ev_t, ev_k, rs, at, _DONE, op)
        else:
            out[n] = op
            n += 1
    return out[:n]


@numba.njit(cache=True)
def _start_flows(ops, t, rep, net):
    """Latency elapsed: put the bytes of ``ops`` on the wire; returns ops done at once."""
    opf, opi, ost, oint = rep[0], rep[1], rep[10], rep[11]
    route_ptr, route_links, route_ceil = rep[7], rep[8], rep[9]
    instant = np.empty(ops.shape[0], dtype=np.int64)
    n = 0
    for op in ops:
        ost[FSTART, op] = t
        if opi[FUSED, op]:
            ost[FUSED_END, op] = t + opf[LOCAL, op]
    for op in ops:
        r = opi[ROUTE, op]
        lo, hi = route_ptr[r], route_ptr[r + 1]
        wire = opf[WIRE, op]
        oint[FLOWS_LEFT, op] = 1
        if hi > lo and wire > 0.0:
            kn.add(net, t, op, wire, route_links, lo, hi, route_ceil[r])
        else:
            instant[n] = op
            n += 1
    return _flows_finished(instant[:n], t, rep)


@numba.njit(cache=True)
def _reduce(ops, t, rep):
    """Local reductions, one at a time per GPU in op order; returns those ending at ``t``."""
    opf, opi, ost, gpu_free, rs = rep[0], rep[1], rep[10], rep[12], rep[14]
    ev_t, ev_k = rep[13], rep[15]
    k = ops.shape[0]
    rank = opi[SRC][ops]
    dur = opf[LOCAL][ops]
    begin = np.empty(k)
    end = np.empty(k)
    if np.unique(rank).shape[0] == k:
        for i in range(k):
            begin[i] = max(t, gpu_free[rank[i]])
            end[i] = begin[i] + dur[i]
    else:  # as the Python replay: offsets from one running sum over the ops sorted by rank
        order = np.argsort(rank * k + np.arange(k))  # stable: ties in op order
        run = 0.0
        lead_before = 0.0
        for i in range(k):
            o = order[i]
            run = run + dur[o]
            before = run - dur[o]
            if i == 0 or rank[o] != rank[order[i - 1]]:
                lead_before = before
            start = max(t, gpu_free[rank[o]]) + before - lead_before
            begin[o] = start
            end[o] = start + dur[o]
    for i in range(k):  # the last of a GPU's ops (op order) ends last
        gpu_free[rank[i]] = max(gpu_free[rank[i]], end[i])
    out = np.empty(k, dtype=np.int64)
    n = 0
    for i in range(k):
        ost[START, ops[i]] = begin[i]
        if end[i] <= t:
            out[n] = ops[i]
            n += 1
        else:
            _push(ev_t, ev_k, rs, end[i], _DONE, ops[i])
    return out[:n]


@numba.njit(cache=True, inline="always")
def _dispatch(ready, t, rep, net):
    """Start ``ready`` ops at ``t``; return those that complete at ``t`` already."""
    opf, opi, ost, oint, rs = rep[0], rep[1], rep[10], rep[11], rep[14]
    ev_t, ev_k = rep[13], rep[15]
    k = ready.shape[0]
    buf = np.empty(4 * k, dtype=np.int64)  # flows starting now | later | copies | reductions
    later_s = np.empty(k)
    nf = nl = nc = nr = 0
    for op in ready:
        ost[START, op] = t
        c = opi[CLS, op]
        if c == NET:
            at = t + opf[LAT, op]
            pred = opi[AFTER, op]
            if pred >= 0:  # not before the transfer it follows on its connection has ended
                pred_end = ost[OEND, pred]
                if np.isnan(pred_end):
                    oint[PENDING, op] = 1
                    rs[N_PENDING] += 1
                    ost[LAT_DONE, op] = at
                    continue
                at = max(at, pred_end)
            if at <= t:
                buf[nf] = op
                nf += 1
            else:
                buf[k + nl] = op
                later_s[nl] = at
                nl += 1
        elif c == COPY:
            buf[2 * k + nc] = op
            nc += 1
        elif c == LOCAL_REDUCE:
            buf[3 * k + nr] = op
            nr += 1
    parts = _start_flows(buf[:nf], t, rep, net)
    for i in range(nl):  # after the flows that start now, as the Python replay pushes them
        _push(ev_t, ev_k, rs, later_s[i], _FLOW_START, buf[k + i])
    m = 0
    for i in range(nc):
        op = buf[2 * k + i]
        at = t + opf[LOCAL, op]
        if at <= t:
            buf[2 * k + m] = op
            m += 1
        else:
            _push(ev_t, ev_k, rs, at, _DONE, op)
    if m:
        parts = np.concatenate((parts, buf[2 * k : 2 * k + m]))
    if nr:
        parts = np.concatenate((parts, _reduce(buf[3 * k : 3 * k + nr], t, rep)))
    return parts


@numba.njit(cache=True, inline="always")
def _resume(done, t, rep, net):
    """Start the flows of pending transfers that follow ``done`` on their connection."""
    ost, oint, follow_ptr, follow_idx, rs = rep[10], rep[11], rep[4], rep[5], rep[14]
    ev_t, ev_k = rep[13], rep[15]
    if follow_ptr.shape[0] == 0 or rs[N_PENDING] == 0:
        return np.empty(0, dtype=np.int64)
    now = np.empty(16, dtype=np.int64)
    n = 0
    for d in done:
        for k in range(follow_ptr[d], follow_ptr[d + 1]):
            f = follow_idx[k]
            if not oint[PENDING, f]:
                continue
            oint[PENDING, f] = 0
            rs[N_PENDING] -= 1
            at = max(ost[LAT_DONE, f], t)
            if at <= t:
                now = append(now, n, f)
                n += 1
            else:
                _push(ev_t, ev_k, rs, at, _FLOW_START, f)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    return _start_flows(now[:n], t, rep, net)


@numba.njit(cache=True)
def _complete(done, ready, t, rep, net):
    """Mark ops done at ``t``, start what they release, repeat for zero-time ops."""
    ost, succ_ptr, succ_idx, waiting = rep[10], rep[2], rep[3], rep[6]
    while done.shape[0] or ready.shape[0]:
        resumed = np.empty(0, dtype=np.int64)
        if done.shape[0]:
            hit = np.empty(16, dtype=np.int64)
            n = 0
            for d in done:
                ost[OEND, d] = t
                for k in range(succ_ptr[d], succ_ptr[d + 1]):
                    s = succ_idx[k]
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        hit = append(hit, n, s)
                        n += 1
            ready = np.concatenate((ready, hit[:n]))
            resumed = _resume(done, t, rep, net)
        if ready.shape[0] > 1:  # sorted, without repeats
            ready = np.sort(ready)
            m = 1
            for i in range(1, ready.shape[0]):
                if ready[i] != ready[m - 1]:
                    ready[m] = ready[i]
                    m += 1
            ready = ready[:m]
        done = _dispatch(ready, t, rep, net) if ready.shape[0] else np.empty(0, dtype=np.int64)
        if resumed.shape[0]:
            done = np.concatenate((done, resumed))
        ready = np.empty(0, dtype=np.int64)


@numba.njit(cache=True)
def _run(rep, net):
    """The loop: one batch per distinct event time (within a relative 1e-12). Stops early,
    with ``OVERFLOW`` set, if the network ran out of slots."""
    ev_t, ev_k, rs, waiting = rep[13], rep[15], rep[14], rep[6]
    gi, gf = net[kn.GI], net[kn.GF]
    empty = np.empty(0, dtype=np.int64)
    one = np.empty(1, dtype=np.int64)
    _complete(empty, np.flatnonzero(waiting == 0).astype(np.int64), 0.0, rep, net)
    kn.reshare(net, 0.0)
    now = 0.0
    while gi[kn.OVERFLOW] == 0 and rs[EV_OVERFLOW] == 0:
        t = ev_t[0] if rs[N_EVENTS] else np.inf
        t = min(t, gf[kn.NEXT_END])
        if t == np.inf:
            break
        now = t
        rs[BATCHES] += 1
        until = t + _REL_TOL * t
        finished = kn.pop_finished(net, t, until)
        done = _flows_finished(finished, t, rep) if finished.shape[0] else empty
        nd = done.shape[0]
        while rs[N_EVENTS] and ev_t[0] <= until:
            n = rs[N_EVENTS]
            heap.pop(ev_t, ev_k, n)
            rs[N_EVENTS] = n - 1
            kind, op = ev_k[1, n - 1], ev_k[2, n - 1]
            one[0] = op
            got = _start_flows(one, t, rep, net) if kind == _FLOW_START else one
            for x in got:
                done = append(done, nd, x)
                nd += 1
        done = done[:nd]
        _complete(done, empty, t, rep, net)
        kn.reshare(net, t)
    kn.close_busy(net, now)


KERNEL_FILES = (heap.__file__, kernel_maxmin.__file__, kn.__file__, __file__)
"""The sources of the compiled replay: a change to any of them invalidates all their caches."""


def drop_if_changed(where: Path, digest: str) -> bool:
    """Delete the kernels' cache files in ``where`` unless it was written for sources of this
    ``digest``; record the digest. Whether anything was dropped."""
    stamp = where / "collsim-kernels.digest"
    if stamp.is_file() and stamp.read_text() == digest:
        return False
    for stale in where.glob("kernel_*.nb[ic]"):
        stale.unlink(missing_ok=True)
    where.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest)
    return True


@functools.cache
def _drop_stale_cache() -> None:
    """Delete the kernels' numba cache if any kernel source changed since it was written.

    numba checks a cached function against its own file only, and ``_run``'s cache carries the
    code of the network, heap and max-min functions it calls from the other files: after an
    edit there (a ``git pull``), it would run the old code. A digest of the four sources, kept
    beside the cache, catches that."""
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in KERNEL_FILES)).hexdigest()
    try:
        drop_if_changed(Path(_run._cache._cache_path), digest[:16])  # numba's cache locator
    except (AttributeError, OSError):  # no cache in use, or not writable: numba recompiles
        return


def compiled_replay(
    prep: Prepared, src: np.ndarray, latency_s: np.ndarray, wire_bytes: np.ndarray,
    capacity_bytes_per_s: np.ndarray, nranks: int, reshare: str = "auto",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:  # fmt: skip
    """Replay ``prep`` (which :func:`supported` accepts) with per-op ``latency_s`` and
    ``wire_bytes`` (as :class:`collsim.engine.replay._Hot` computes them): start, flow start and
    end time per op, busy time per link, and what the replay did (counts: batches, flows,
    reshares, flows recomputed, recomputations of everything, local settlings given up)."""
    _drop_stale_cache()
    n = prep.cls.shape[0]
    opf = np.vstack((latency_s, wire_bytes, prep.local_s)).astype(np.float64)
    after = np.full(n, -1, dtype=np.int64) if prep.after is None else prep.after
    opi = np.vstack((prep.cls, prep.fused, prep.route, src, after)).astype(np.int64)
    empty = np.zeros(0, dtype=np.int64)
    follow_ptr = empty if prep.follow_ptr is None else prep.follow_ptr.astype(np.int64)
    follow_idx = empty if prep.follow_idx is None else prep.follow_idx.astype(np.int64)
    nroutes = prep.route_ptr.shape[0] - 1
    ceil = np.full(nroutes, np.inf) if prep.route_ceiling is None else prep.route_ceiling
    static = (opf, opi, prep.succ_ptr.astype(np.int64), prep.succ_idx.astype(np.int64),
              follow_ptr, follow_idx)  # fmt: skip
    routes = (prep.route_ptr.astype(np.int64), prep.route_links.astype(np.int64),
              np.asarray(ceil, dtype=np.float64))  # fmt: skip
    lengths = np.diff(prep.route_ptr)
    width = max(int(lengths.max()) if lengths.size else 1, 1)
    capacity = np.asarray(capacity_bytes_per_s, dtype=np.float64)
    # Slots for the flows in flight at once: a guess, doubled (and the replay rerun) if short.
    # Room for the flows and the events in flight at once: a guess, doubled where short (the
    # replay then runs again; results do not depend on the room).
    slots = max(64, nranks, int(np.count_nonzero(prep.waiting == 0)))
    events = min(n, 4 * slots)
    while True:
        ost = np.full((5, n), np.nan)
        ost[FUSED_END] = 0.0
        rep = (*static, prep.waiting.astype(np.int64), *routes, ost,
               np.zeros((2, n), dtype=np.int64), np.zeros(nranks), np.zeros(events),
               np.zeros(5, dtype=np.int64), np.zeros((3, events), dtype=np.int64))  # fmt: skip
        net = kn.new_network(capacity, width, slots, reshare)
        _run(rep, net)
        gi, rs = net[kn.GI], rep[14]
        if not gi[kn.OVERFLOW] and not rs[EV_OVERFLOW]:
            break
        slots *= 2 if gi[kn.OVERFLOW] else 1
        events *= 2 if rs[EV_OVERFLOW] else 1
    counts = {
        "batches": int(rep[14][BATCHES]),
        "flows": int(gi[kn.NEXT_SEQ]),
        "reshares": int(gi[kn.N_RESHARES]),
        "recomputed_flows": int(gi[kn.N_RECOMPUTED]),
        "full_recomputations": int(gi[kn.N_FULL]),
        "local_give_ups": int(gi[kn.N_GIVE_UPS]),
        "slots": slots,
        "event_room": events,
    }
    return ost[START], ost[FSTART], ost[OEND], net[kn.LINK_F][2].copy(), counts
