"""The flow network of the compiled replay: :class:`collsim.engine.network.FlowNetwork` in numba.

Same model, same decisions, same arithmetic: flows in slots that are reused, a start sequence
number per flow (rates are always computed with flows in start order), finish time
``anchor + remaining / rate`` re-anchored only when a rate changes, per-link busy time, and the
"auto" reshare scheme -- exact component recomputation until a component spans half the active
flows, then local settling (:func:`collsim.engine.kernel_maxmin.settle`) with the same give-up
limits and back-off. See the Python module for why each of those is what it is.

State lives in *boxes* (numba typed lists of arrays) so that growing the slot arrays replaces
them for every holder: ``fb`` [slot floats (rows below), slot scratch], ``ib`` [slot ints (rows
below), paths (slot x width, -1 padded)], ``pb`` [next pair, previous pair, free-slot stack,
touched links]; per-link arrays do not grow. Scalars sit in ``gi`` (int64) and ``gf`` (float64).
"""

from __future__ import annotations

import heapq

import numba
import numpy as np
from numba import types
from numba.typed import List

from collsim.engine.kernel_maxmin import (
    _push,
    component,
    fill,
    link_scratch,
    settle,
    slot_scratch,
    sort_by_seq,
)

# Per-slot float rows (fb[0]) and int rows (ib[0]).
REM, ANCHOR, RATE, END, CEIL = range(5)
OP, NL, SEQ, BN, LIVE = range(5)
# Scalars: gi
ACTIVE, NEXT_SEQ, SCHEME, SKIP, BACKOFF, DIRTY, NFREE, NTOUCHED, CAPPED_ANY, AUTO = range(10)
# Counters (gi): reshares, flows recomputed, recomputations of everything, local give-ups
N_RESHARES, N_RECOMPUTED, N_FULL, N_GIVE_UPS = range(10, 14)
COMPONENTS, LOCAL, ALL = 0, 1, 2
SCHEMES = {"auto": (COMPONENTS, 1), "components": (COMPONENTS, 0), "local": (LOCAL, 0),
           "all": (ALL, 0)}  # fmt: skip
"""Each reshare mode of :class:`~collsim.engine.network.FlowNetwork`: (first scheme, auto)."""
# Scalars: gf
NEXT_END, STAMPS = 0, 1

_MAX_SEEDS = 4096
_COMPONENT_FLOWS = 64
_LOCAL_FLOWS = 256
_MAX_BACKOFF = 64
_END = types.Tuple((types.float64, types.int64, types.int64))


def new_network(capacity: np.ndarray, width: int, mode: str = "auto", slots: int = 64):
    """Empty network state over links of ``capacity`` bytes/s, flows of up to ``width`` links,
    recomputing rates by reshare ``mode``: (fb, ib, pb, head, link_flows, link_f, lk, gi, gf,
    ends); ``link_f`` rows: capacity, busy since, busy time; ``ends`` the heap of finish times.

    ``ends`` holds ``(finish time, start number, slot)`` for every finish time a flow has been
    given; an entry whose slot has moved on (another rate since, ended, or reused by a later
    flow) is dropped when it reaches the top, so the next finish and the flows finishing by a
    time are found without scanning every slot. It is rebuilt from the live flows when stale
    entries outnumber them."""
    nl = capacity.shape[0]
    slot_f = np.zeros((5, slots))
    slot_f[END] = np.inf
    fb = List([slot_f, slot_scratch(slots)])
    ib = List([np.zeros((5, slots), dtype=np.int64), np.full((slots, width), -1, dtype=np.int64)])
    free = np.arange(slots - 1, -1, -1, dtype=np.int64)
    pb = List([np.full(slots * width, -1, dtype=np.int64), np.full(slots * width, -1, np.int64),
               free, np.zeros(64, dtype=np.int64)])  # fmt: skip
    link_f = np.zeros((3, nl))
    link_f[0] = capacity
    gi = np.zeros(14, dtype=np.int64)
    gi[BACKOFF] = 1
    gi[NFREE] = slots
    gi[SCHEME], gi[AUTO] = SCHEMES[mode]
    gf = np.zeros(2)
    gf[NEXT_END] = np.inf
    return fb, ib, pb, np.full(nl, -1, dtype=np.int64), np.zeros(nl, np.int64), link_f, \
        link_scratch(nl), gi, gf, List.empty_list(_END)  # fmt: skip


@numba.njit(cache=True)
def _grow(fb, ib, pb, gi):
    """Double the slots; new slots go on the free stack."""
    old = fb[0].shape[1]
    size = 2 * old
    width = ib[1].shape[1]
    slot_f = np.zeros((5, size))
    slot_f[:, :old] = fb[0]
    slot_f[END, old:] = np.inf
    sk = np.zeros((fb[1].shape[0], size))
    sk[:, :old] = fb[1]
    slot_i = np.zeros((5, size), dtype=np.int64)
    slot_i[:, :old] = ib[0]
    paths = np.full((size, width), -1, dtype=np.int64)
    paths[:old] = ib[1]
    for k in range(2):
        pairs = np.full(size * width, -1, dtype=np.int64)
        pairs[: old * width] = pb[k]
        pb[k] = pairs
    free = np.empty(size, dtype=np.int64)
    nfree = gi[NFREE]
    free[:nfree] = pb[2][:nfree]
    for s in range(size - 1, old - 1, -1):
        free[nfree] = s
        nfree += 1
    gi[NFREE] = nfree
    fb[0], fb[1], ib[0], ib[1], pb[2] = slot_f, sk, slot_i, paths, free


@numba.njit(cache=True)
def _touch(pb, gi, link):
    buf = pb[3]
    n = gi[NTOUCHED]
    if n == buf.shape[0]:
        buf = np.concatenate((buf, np.empty(n, np.int64)))
        pb[3] = buf
    buf[n] = link
    gi[NTOUCHED] = n + 1


@numba.njit(cache=True)
def add(fb, ib, pb, head, link_flows, link_f, gi, now, op, wire, links, ceiling):
    """Start one flow of ``op`` at ``now``: ``wire`` bytes over ``links``, at most ``ceiling``."""
    if gi[NFREE] == 0:
        _grow(fb, ib, pb, gi)
    gi[NFREE] -= 1
    s = pb[2][gi[NFREE]]
    slot_f, slot_i, paths, nxt, prv = fb[0], ib[0], ib[1], pb[0], pb[1]
    width = paths.shape[1]
    slot_f[REM, s] = wire
    slot_f[ANCHOR, s] = now
    slot_f[RATE, s] = 0.0
    slot_f[END, s] = np.inf
    slot_f[CEIL, s] = ceiling
    if ceiling < np.inf:
        gi[CAPPED_ANY] = 1
    slot_i[OP, s] = op
    slot_i[NL, s] = links.shape[0]
    slot_i[SEQ, s] = gi[NEXT_SEQ]
    gi[NEXT_SEQ] += 1
    slot_i[BN, s] = -1
    slot_i[LIVE, s] = 1
    for j in range(links.shape[0]):
        link = links[j]
        paths[s, j] = link
        p = s * width + j  # push the pair on the link's list
        first = head[link]
        nxt[p] = first
        prv[p] = -1
        if first >= 0:
            prv[first] = p
        head[link] = p
        _touch(pb, gi, link)
        if link_flows[link] == 0:
            link_f[1, link] = now
        link_flows[link] += 1
    gi[ACTIVE] += 1
    gi[DIRTY] = 1


@numba.njit(cache=True)
def _valid(ends, slot_f, slot_i):
    """Drop stale entries from the top of ``ends``; whether one is left."""
    while len(ends):
        end, seq, s = ends[0]
        if slot_i[LIVE, s] == 1 and slot_i[SEQ, s] == seq and slot_f[END, s] == end:
            return True
        heapq.heappop(ends)
    return False


@numba.njit(cache=True)
def pop_finished(fb, ib, pb, head, link_flows, link_f, gi, gf, ends, now, until):
    """Remove flows finishing by ``until`` (as finishing at ``now``); their ops, start order."""
    slot_f, slot_i, paths, nxt, prv = fb[0], ib[0], ib[1], pb[0], pb[1]
    if gf[NEXT_END] > until:
        return np.empty(0, dtype=np.int64)
    width = paths.shape[1]
    done = np.empty(4, dtype=np.int64)
    nd = 0
    while _valid(ends, slot_f, slot_i) and ends[0][0] <= until:
        s = heapq.heappop(ends)[2]
        slot_f[END, s] = np.inf  # so that no second entry of it counts
        done = _push(done, nd, s)
        nd += 1
    done = sort_by_seq(done, nd, slot_i[SEQ])
    ops = np.empty(done.shape[0], dtype=np.int64)
    for i in range(done.shape[0]):
        s = done[i]
        for j in range(slot_i[NL, s]):
            link = paths[s, j]
            p = s * width + j  # unlink the pair
            if prv[p] >= 0:
                nxt[prv[p]] = nxt[p]
            else:
                head[link] = nxt[p]
            if nxt[p] >= 0:
                prv[nxt[p]] = prv[p]
            paths[s, j] = -1
            _touch(pb, gi, link)
            link_flows[link] -= 1
            if link_flows[link] == 0:  # idle now (credited once, as the Python side does)
                link_f[2, link] = link_f[2, link] + (now - link_f[1, link])
        ops[i] = slot_i[OP, s]
        slot_f[END, s] = np.inf
        slot_f[RATE, s] = 0.0
        slot_i[LIVE, s] = 0
        slot_i[NL, s] = 0
        pb[2][gi[NFREE]] = s
        gi[NFREE] += 1
    gi[ACTIVE] -= done.shape[0]
    gi[DIRTY] = 1
    return ops


@numba.njit(cache=True)
def close_busy(link_flows, link_f, now):
    """Credit busy time to links still carrying flows at ``now`` (at the very end)."""
    for link in range(link_flows.shape[0]):
        if link_flows[link] > 0:
            link_f[2, link] += now - link_f[1, link]
            link_f[1, link] = now


@numba.njit(cache=True)
def _live_in_order(slot_i):
    live = np.flatnonzero(slot_i[LIVE] == 1)
    return live[np.argsort(slot_i[SEQ][live])]


@numba.njit(cache=True)
def reshare(fb, ib, pb, head, link_f, lk, gi, gf, ends, now):
    """Recompute max-min rates if flows came or went; re-anchor flows whose rate changed."""
    if gi[DIRTY] == 0:
        return
    gi[DIRTY] = 0
    ntouched = gi[NTOUCHED]
    gi[NTOUCHED] = 0
    slot_f, sk, slot_i, paths, nxt = fb[0], fb[1], ib[0], ib[1], pb[0]
    active = gi[ACTIVE]
    if active == 0:
        gf[NEXT_END] = np.inf
        return
    capacity = link_f[0]
    rate, ceil, nlinks, seq, bneck = slot_f[RATE], slot_f[CEIL], slot_i[NL], slot_i[SEQ], slot_i[BN]
    width = paths.shape[1]
    capped = gi[CAPPED_ANY] == 1
    ctr = gf[STAMPS:]
    touched = pb[3]
    found = False
    idx = np.empty(0, dtype=np.int64)
    new = np.empty(0)
    bns = np.empty(0, dtype=np.int64)
    if gi[SCHEME] != ALL and ntouched <= min(_MAX_SEEDS, active):
        if gi[SCHEME] == LOCAL:
            if gi[SKIP] > 0:
                gi[SKIP] -= 1
            else:
                limit = max(_LOCAL_FLOWS, active // 4)
                idx, new, bns, found = settle(touched, ntouched, head, nxt, width, paths, nlinks,
                                              rate, bneck, capacity, seq, limit, ceil, capped,
                                              lk, sk, ctr)  # fmt: skip
                if found:
                    gi[BACKOFF] = 1
                    for i in range(idx.shape[0]):
                        bneck[idx[i]] = bns[i]
                else:
                    gi[N_GIVE_UPS] += 1
                    gi[SKIP] = min(gi[BACKOFF], _MAX_BACKOFF)
                    gi[BACKOFF] = min(2 * gi[BACKOFF], _MAX_BACKOFF)
        else:
            limit = max(_COMPONENT_FLOWS, active // 2)
            idx, found = component(touched, ntouched, head, nxt, width, paths, nlinks, seq, limit,
                                   lk, sk, ctr)  # fmt: skip
            if found:
                new = np.empty(idx.shape[0])
                bns = np.empty(idx.shape[0], dtype=np.int64)
                fill(idx, paths, nlinks, capacity, ceil, capped, new, bns, lk, ctr)
            elif gi[AUTO] == 1:  # a giant component: settle locally from now on
                gi[SCHEME] = LOCAL
    gi[N_RESHARES] += 1
    if not found:  # everything, in start order
        gi[N_FULL] += 1
        idx = _live_in_order(slot_i)
        new = np.empty(idx.shape[0])
        bns = np.empty(idx.shape[0], dtype=np.int64)
        fill(idx, paths, nlinks, capacity, ceil, capped, new, bns, lk, ctr)
        if gi[SCHEME] == LOCAL:
            bneck[:] = -1
    gi[N_RECOMPUTED] += idx.shape[0]
    end = slot_f[END]
    for i in range(idx.shape[0]):
        s = idx[i]
        old = rate[s]
        r = new[i]
        if r != old:
            left = slot_f[REM, s] - old * (now - slot_f[ANCHOR, s])
            left = left if left > 0.0 else 0.0  # as np.maximum(left, 0.0)
            slot_f[REM, s] = left
            slot_f[ANCHOR, s] = now
            end[s] = now + left / r
            rate[s] = r
            heapq.heappush(ends, (end[s], seq[s], s))
    if len(ends) > 4 * gi[ACTIVE] + 64:  # mostly stale: rebuild from the live flows
        ends.clear()
        for s in np.flatnonzero(slot_i[LIVE] == 1):
            heapq.heappush(ends, (end[s], seq[s], s))
    gf[NEXT_END] = ends[0][0] if _valid(ends, slot_f, slot_i) else np.inf
