"""The flow network of the compiled replay: :class:`collsim.engine.network.FlowNetwork` in numba.

Same model, same decisions, same arithmetic: flows in slots that are reused, a start sequence
number per flow (rates are always computed with flows in start order), finish time
``anchor + remaining / rate`` re-anchored only when a rate changes, per-link busy time, and the
reshare schemes with the same limits and back-off ("auto": exact component recomputation until
a component spans half the active flows, then local settling,
:func:`collsim.engine.kernel_maxmin.settle`). See the Python module for why each is what it is.

The state is a tuple of flat arrays (:func:`new_network`, indices below). The slot arrays have a
fixed size: a flow that finds none free sets ``OVERFLOW`` and the caller replays again with twice
the slots (results do not depend on the number of slots). Per-link member lists are doubly
linked lists of *pairs* (``slot * width + j``, the j-th link of a slot's path).

The next finish time comes from a heap of ``(finish time, start number, slot)`` holding every
finish time a flow has been given; an entry whose slot has moved on (another rate since, ended,
or reused by a later flow) is dropped when it reaches the top, so neither the next finish nor
the flows finishing by a time needs a scan of every slot. It is rebuilt from the live flows
when stale entries outnumber them.
"""

from __future__ import annotations

import numba
import numpy as np

from collsim.engine import kernel_heap as heap
from collsim.engine.kernel_maxmin import (
    append,
    component,
    fill,
    link_scratch,
    settle,
    slot_scratch,
    sort_by_seq,
)

# The state tuple.
SLOT_F, SLOT_SK, SLOT_I, PATHS, NXT, PRV, FREE, TOUCHED, HEAD, LINK_FLOWS, LINK_F, LK, GI, GF, \
    END_T, END_K = range(16)  # fmt: skip
# Per-slot float rows (SLOT_F) and int rows (SLOT_I).
REM, ANCHOR, RATE, END, CEIL = range(5)
OP, NL, SEQ, BN, LIVE = range(5)
# Scalars (GI): state, then counters (reshares, flows recomputed, recomputations of everything,
# local give-ups).
(ACTIVE, NEXT_SEQ, SCHEME, SKIP, BACKOFF, DIRTY, NFREE, NTOUCHED, CAPPED_ANY, AUTO, OVERFLOW,
 NENDS, N_RESHARES, N_RECOMPUTED, N_FULL, N_GIVE_UPS) = range(16)  # fmt: skip
# Scalars (GF): the next finish time, then the scratch stamp counter.
NEXT_END, STAMPS = 0, 1
COMPONENTS, LOCAL, ALL = 0, 1, 2
SCHEMES = {"auto": (COMPONENTS, 1), "components": (COMPONENTS, 0), "local": (LOCAL, 0),
           "all": (ALL, 0)}  # fmt: skip
"""Each reshare mode of :class:`~collsim.engine.network.FlowNetwork`: (first scheme, auto)."""

_MAX_SEEDS = 4096
_COMPONENT_FLOWS = 64
_LOCAL_FLOWS = 256
_MAX_BACKOFF = 64


def new_network(capacity: np.ndarray, width: int, slots: int, mode: str = "auto") -> tuple:
    """Empty state over links of ``capacity`` bytes/s for up to ``slots`` flows at once of up to
    ``width`` links each, recomputing rates by reshare ``mode``. ``LINK_F`` rows: capacity,
    busy since, busy time."""
    nl = capacity.shape[0]
    slot_f = np.zeros((5, slots))
    slot_f[END] = np.inf
    link_f = np.zeros((3, nl))
    link_f[0] = capacity
    gi = np.zeros(16, dtype=np.int64)
    gi[BACKOFF] = 1
    gi[NFREE] = slots
    gi[SCHEME], gi[AUTO] = SCHEMES[mode]
    gf = np.zeros(2)
    gf[NEXT_END] = np.inf
    ends = 5 * slots + 64  # a rebuild keeps it under 4 x live + 64, plus a reshare's pushes
    return (
        slot_f, slot_scratch(slots), np.zeros((5, slots), dtype=np.int64),
        np.full((slots, width), -1, dtype=np.int64), np.full(slots * width, -1, dtype=np.int64),
        np.full(slots * width, -1, dtype=np.int64), np.arange(slots - 1, -1, -1, dtype=np.int64),
        np.zeros(_MAX_SEEDS, dtype=np.int64), np.full(nl, -1, dtype=np.int64),
        np.zeros(nl, dtype=np.int64), link_f, link_scratch(nl), gi, gf, np.zeros(ends),
        np.zeros((2, ends), dtype=np.int64),
    )  # fmt: skip


@numba.njit(cache=True, inline="always")
def add(net, now, op, wire, links, lo, hi, ceiling):
    """Start one flow of ``op`` at ``now``: ``wire`` bytes over ``links[lo:hi]``, at most
    ``ceiling`` bytes/s. Without a free slot it sets ``OVERFLOW`` and starts nothing. (The
    route table and its bounds, not a slice of it: a slice is a new array, a reference count.)"""
    gi = net[GI]
    if gi[NFREE] == 0:
        gi[OVERFLOW] = 1
        return
    gi[NFREE] -= 1
    s = net[FREE][gi[NFREE]]
    slot_f, slot_i, paths, nxt, prv, head = (net[SLOT_F], net[SLOT_I], net[PATHS], net[NXT],
                                             net[PRV], net[HEAD])  # fmt: skip
    link_flows, link_f, touched = net[LINK_FLOWS], net[LINK_F], net[TOUCHED]
    width = paths.shape[1]
    slot_f[REM, s] = wire
    slot_f[ANCHOR, s] = now
    slot_f[RATE, s] = 0.0
    slot_f[END, s] = np.inf
    slot_f[CEIL, s] = ceiling
    if ceiling < np.inf:
        gi[CAPPED_ANY] = 1
    slot_i[OP, s] = op
    slot_i[NL, s] = hi - lo
    slot_i[SEQ, s] = gi[NEXT_SEQ]
    gi[NEXT_SEQ] += 1
    slot_i[BN, s] = -1
    slot_i[LIVE, s] = 1
    for j in range(hi - lo):
        link = links[lo + j]
        paths[s, j] = link
        p = s * width + j  # the pair goes first on its link's list
        first = head[link]
        nxt[p] = first
        prv[p] = -1
        if first >= 0:
            prv[first] = p
        head[link] = p
        nt = gi[NTOUCHED]  # the link's flows changed (past the buffer only the count matters)
        if nt < touched.shape[0]:
            touched[nt] = link
        gi[NTOUCHED] = nt + 1
        if link_flows[link] == 0:
            link_f[1, link] = now
        link_flows[link] += 1
    gi[ACTIVE] += 1
    gi[DIRTY] = 1


# The end heap (:mod:`collsim.engine.kernel_heap`): finish times ``t``, (start number, slot)
# ``k``, ``gi[NENDS]`` entries. Its helpers take the arrays themselves: taking them out of the
# state tuple costs a reference count each, and these run in the innermost loops.
@numba.njit(cache=True, inline="always")
def _end_push(t, k, gi, end, seq, slot):
    i = gi[NENDS]
    gi[NENDS] = i + 1
    t[i] = end
    k[0, i] = seq
    k[1, i] = slot
    heap.sift_up(t, k, i)


@numba.njit(cache=True, inline="always")
def _end_pop(t, k, gi):
    """Remove the top entry; its slot."""
    n = gi[NENDS]
    heap.pop(t, k, n)
    gi[NENDS] = n - 1
    return k[1, n - 1]


@numba.njit(cache=True, inline="always")
def _current(t, k, i, slot_f, slot_i):
    """Whether end-heap entry ``i`` is its slot's finish time now (not stale: the flow has not
    changed rate since, ended, or left the slot to a later flow)."""
    s = k[1, i]
    return slot_i[LIVE, s] == 1 and slot_i[SEQ, s] == k[0, i] and slot_f[END, s] == t[i]


@numba.njit(cache=True, inline="always")
def _valid_top(t, k, gi, slot_f, slot_i):
    """Drop stale entries from the top of the end heap; whether one is left."""
    while gi[NENDS]:
        if _current(t, k, 0, slot_f, slot_i):
            return True
        _end_pop(t, k, gi)
    return False


@numba.njit(cache=True, inline="always")
def pop_finished(net, now, until):
    """Remove flows finishing by ``until`` (as finishing at ``now``); their ops, start order."""
    gi, gf = net[GI], net[GF]
    if gf[NEXT_END] > until:
        return np.empty(0, dtype=np.int64)
    slot_f, slot_i, paths, nxt, prv, head = (net[SLOT_F], net[SLOT_I], net[PATHS], net[NXT],
                                             net[PRV], net[HEAD])  # fmt: skip
    link_flows, link_f, touched = net[LINK_FLOWS], net[LINK_F], net[TOUCHED]
    et, ek = net[END_T], net[END_K]
    width = paths.shape[1]
    done = np.empty(4, dtype=np.int64)
    nd = 0
    while gi[NENDS] and et[0] <= until:  # entries due by then: the live ones finish
        n = gi[NENDS]
        s = _end_pop(et, ek, gi)
        if _current(et, ek, n - 1, slot_f, slot_i):
            slot_f[END, s] = np.inf  # so that no second entry of it counts
            done = append(done, nd, s)
            nd += 1
    done = sort_by_seq(done, nd, slot_i[SEQ])
    ops = np.empty(nd, dtype=np.int64)
    for i in range(nd):
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
            nt = gi[NTOUCHED]
            if nt < touched.shape[0]:
                touched[nt] = link
            gi[NTOUCHED] = nt + 1
            link_flows[link] -= 1
            if link_flows[link] == 0:  # idle from now
                link_f[2, link] = link_f[2, link] + (now - link_f[1, link])
        ops[i] = slot_i[OP, s]
        slot_f[RATE, s] = 0.0
        slot_i[LIVE, s] = 0
        slot_i[NL, s] = 0
        net[FREE][gi[NFREE]] = s
        gi[NFREE] += 1
    gi[ACTIVE] -= nd
    gi[DIRTY] = 1
    return ops


@numba.njit(cache=True)
def close_busy(net, now):
    """Credit busy time to links still carrying flows at ``now`` (at the very end)."""
    link_flows, link_f = net[LINK_FLOWS], net[LINK_F]
    for link in range(link_flows.shape[0]):
        if link_flows[link] > 0:
            link_f[2, link] += now - link_f[1, link]
            link_f[1, link] = now


@numba.njit(cache=True, inline="always")
def _affected(net, ntouched, active):
    """The flows an incremental scheme recomputes (start order), their new rates, and True;
    False when everything is to be recomputed."""
    slot_f, slot_i, paths, gi, lk = net[SLOT_F], net[SLOT_I], net[PATHS], net[GI], net[LK]
    capacity, ctr = net[LINK_F][0], net[GF][STAMPS:]
    rate, ceil, nlinks, seq, bneck = slot_f[RATE], slot_f[CEIL], slot_i[NL], slot_i[SEQ], slot_i[BN]
    width, capped = paths.shape[1], gi[CAPPED_ANY] == 1
    idx = np.empty(0, dtype=np.int64)
    new = np.empty(0)
    if gi[SCHEME] == LOCAL:
        if gi[SKIP] > 0:
            gi[SKIP] -= 1
            return idx, new, False
        limit = max(_LOCAL_FLOWS, active // 4)
        idx, new, bns, found = settle(net[TOUCHED], ntouched, net[HEAD], net[NXT], width, paths,
                                      nlinks, rate, bneck, capacity, seq, limit, ceil, capped,
                                      lk, net[SLOT_SK], ctr)  # fmt: skip
        if not found:
            gi[N_GIVE_UPS] += 1
            gi[SKIP] = min(gi[BACKOFF], _MAX_BACKOFF)
            gi[BACKOFF] = min(2 * gi[BACKOFF], _MAX_BACKOFF)
            return idx, new, False
        gi[BACKOFF] = 1
        for i in range(idx.shape[0]):
            bneck[idx[i]] = bns[i]
        return idx, new, True
    limit = max(_COMPONENT_FLOWS, active // 2)
    idx, found = component(net[TOUCHED], ntouched, net[HEAD], net[NXT], width, paths, nlinks,
                           seq, limit, lk, net[SLOT_SK], ctr)  # fmt: skip
    if not found:
        if gi[AUTO] == 1:  # a giant component: settle locally from now on
            gi[SCHEME] = LOCAL
        return idx, new, False
    new = np.empty(idx.shape[0])
    bns = np.empty(idx.shape[0], dtype=np.int64)
    fill(idx, paths, nlinks, capacity, ceil, capped, new, bns, lk, ctr)
    return idx, new, True


@numba.njit(cache=True)
def reshare(net, now):
    """Recompute max-min rates if flows came or went; re-anchor flows whose rate changed."""
    gi, gf = net[GI], net[GF]
    if gi[DIRTY] == 0:
        return
    gi[DIRTY] = 0
    ntouched = gi[NTOUCHED]
    gi[NTOUCHED] = 0
    active = gi[ACTIVE]
    if active == 0:
        gf[NEXT_END] = np.inf
        return
    slot_f, slot_i = net[SLOT_F], net[SLOT_I]
    found = False
    idx = np.empty(0, dtype=np.int64)
    new = np.empty(0)
    if gi[SCHEME] != ALL and ntouched <= min(_MAX_SEEDS, active):
        idx, new, found = _affected(net, ntouched, active)
    gi[N_RESHARES] += 1
    if not found:  # everything, in start order
        gi[N_FULL] += 1
        live = np.flatnonzero(slot_i[LIVE] == 1)
        idx = live[np.argsort(slot_i[SEQ][live])]
        new = np.empty(idx.shape[0])
        bns = np.empty(idx.shape[0], dtype=np.int64)
        fill(idx, net[PATHS], slot_i[NL], net[LINK_F][0], slot_f[CEIL], gi[CAPPED_ANY] == 1,
             new, bns, net[LK], gf[STAMPS:])  # fmt: skip
        if gi[SCHEME] == LOCAL:
            slot_i[BN, :] = -1
    gi[N_RECOMPUTED] += idx.shape[0]
    et, ek = net[END_T], net[END_K]
    if gi[NENDS] + idx.shape[0] > et.shape[0]:  # mostly stale: rebuild from the live flows
        gi[NENDS] = 0
        for s in np.flatnonzero(slot_i[LIVE] == 1):
            if slot_f[END, s] < np.inf:
                _end_push(et, ek, gi, slot_f[END, s], slot_i[SEQ, s], s)
    rate, end = slot_f[RATE], slot_f[END]
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
            _end_push(et, ek, gi, end[s], slot_i[SEQ, s], s)
    gf[NEXT_END] = et[0] if _valid_top(et, ek, gi, slot_f, slot_i) else np.inf
