"""Max-min fair rates for the compiled replay (:mod:`collsim.engine.kernel_replay`), in numba.

The same three computations as the Python replay's, with the same arithmetic in the same order,
on flat arrays instead of Python sets and dicts:

* :func:`fill` is progressive filling (:func:`collsim.engine.maxmin.max_min_small`): the flows
  given in start order, per-link ``remaining / count`` shares, a flow settled when one of its links
  has no flow with a smaller minimum (or at its ceiling), settled rates summed per link in flow
  order and subtracted, clamped at zero as ``np.maximum`` clamps. Same floats, bit for bit.
* :func:`component` is the exact incremental scheme (:func:`collsim.engine.incremental.component`):
  every flow connected to the changed links, in start order.
* :func:`settle` is the local scheme (:func:`collsim.engine.incremental.settle`), the one a giant
  component needs: grow a group from the flows on the changed links until every flow outside it
  still has a bottleneck. Its residual capacities sum the outside flows in another order than
  Python's sets do, so its floats can differ from the Python scheme's in the last bit (the two
  are equal up to rounding, as "local" and "all" already are).

Who crosses a link is a doubly linked list per link over *pairs* (slot x position in its path,
``pair = slot * width + j``): starting or ending a flow is O(its links), and walking a link's
flows visits only them. Scratch arrays per link and per slot carry a *stamp* (the pass that last
wrote them) so that nothing is cleared between passes.
"""

from __future__ import annotations

import numba
import numpy as np

CAPPED = -2
"""A flow settled at its own ceiling (as :data:`collsim.engine.maxmin.CAPPED`)."""
_EPS = 1e-14
_INF = np.inf
# Rows of the per-link scratch (:func:`link_scratch`).
_COUNT, _SHARE, _REM, _LMIN, _LOAD, _MARK, _SEEN, _TOUCH, _RES, _STAT, _SLOAD, _SFAST = range(12)
# Rows of the per-slot scratch (:func:`slot_scratch`).
_GROUP, _GROW, _CHECK, _NEW, _FOUND = range(5)


def link_scratch(nl: int) -> np.ndarray:
    """Per-link scratch of the functions here (rows named above; stamps start at zero)."""
    return np.zeros((12, nl))


def slot_scratch(slots: int) -> np.ndarray:
    """Per-slot scratch of the functions here (rows named above)."""
    return np.zeros((5, slots))


@numba.njit(cache=True)
def _stamp(ctr):
    """A fresh stamp: every pass marks with its own, so no scratch row is ever cleared."""
    ctr[0] += 1.0
    return ctr[0]


@numba.njit(cache=True)
def fill(slots, paths, nlinks, cap, ceiling, capped_any, rates, bns, lk, ctr):
    """Progressive filling of ``slots`` (start order) over the capacities ``cap`` (per link).

    ``paths`` (slot x width, -1 padded) and ``nlinks`` give each flow's links; ``ceiling``
    (per slot) is honoured when ``capped_any``. Writes each flow's rate and bottleneck (a link,
    or :data:`CAPPED`) to ``rates`` / ``bns`` (per position in ``slots``)."""
    k = slots.shape[0]
    stamp = _stamp(ctr)
    used = np.empty(k * paths.shape[1], dtype=np.int64)
    nused = 0
    for i in range(k):
        s = slots[i]
        for j in range(nlinks[s]):
            li = paths[s, j]
            if lk[_MARK, li] != stamp:
                lk[_MARK, li] = stamp
                lk[_REM, li] = cap[li]
                used[nused] = li
                nused += 1
    todo = np.arange(k)
    fmin = np.empty(k)
    capped = np.zeros(k, dtype=np.bool_)
    ntodo = k
    while ntodo:
        for u in range(nused):
            lk[_COUNT, used[u]] = 0.0
        for t in range(ntodo):
            s = slots[todo[t]]
            for j in range(nlinks[s]):
                lk[_COUNT, paths[s, j]] += 1.0
        most = 0.0
        for u in range(nused):
            li = used[u]
            c = lk[_COUNT, li]
            if c > 0.0:
                lk[_SHARE, li] = lk[_REM, li] / c
                if c > most:
                    most = c
        for t in range(ntodo):
            i = todo[t]
            s = slots[i]
            m = _INF
            for j in range(nlinks[s]):
                x = lk[_SHARE, paths[s, j]]
                if x < m:
                    m = x
            capped[i] = False
            if capped_any and ceiling[s] <= m:
                capped[i] = True
                m = ceiling[s]
            fmin[i] = m
        if most <= 1.0:  # no link shared: every flow at its path's bottleneck
            for t in range(ntodo):
                i = todo[t]
                s = slots[i]
                rates[i] = fmin[i]
                if capped[i]:
                    bns[i] = CAPPED
                else:
                    for j in range(nlinks[s]):
                        if lk[_SHARE, paths[s, j]] == fmin[i]:
                            bns[i] = paths[s, j]
                            break
            break
        for u in range(nused):
            lk[_LMIN, used[u]] = _INF
            lk[_LOAD, used[u]] = -1.0  # no settled flow on it yet (loads are >= 0)
        for t in range(ntodo):
            i = todo[t]
            s = slots[i]
            for j in range(nlinks[s]):
                li = paths[s, j]
                if fmin[i] < lk[_LMIN, li]:
                    lk[_LMIN, li] = fmin[i]
        keep = 0
        for t in range(ntodo):
            i = todo[t]
            s = slots[i]
            b = -1
            if capped[i]:
                b = CAPPED
            else:
                for j in range(nlinks[s]):
                    li = paths[s, j]
                    if lk[_LMIN, li] == lk[_SHARE, li]:
                        b = li
                        break
            if b == -1:
                todo[keep] = i
                keep += 1
                continue
            m = fmin[i]
            rates[i] = m
            bns[i] = b
            for j in range(nlinks[s]):
                li = paths[s, j]
                lk[_LOAD, li] = m if lk[_LOAD, li] < 0.0 else lk[_LOAD, li] + m
        for u in range(nused):
            li = used[u]
            if lk[_LOAD, li] >= 0.0:
                left = lk[_REM, li] - lk[_LOAD, li]
                lk[_REM, li] = left if left >= 0.0 else 0.0
        ntodo = keep


@numba.njit(cache=True)
def sort_by_seq(found, nfound, seq):
    """The first ``nfound`` slots of ``found`` in start order (few: by insertion)."""
    out = found[:nfound].copy()
    if nfound > 32:
        keys = np.empty(nfound, dtype=np.int64)
        for i in range(nfound):
            keys[i] = seq[out[i]]
        return out[np.argsort(keys)]
    for i in range(1, nfound):
        x = out[i]
        k = seq[x]
        j = i - 1
        while j >= 0 and seq[out[j]] > k:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = x
    return out


@numba.njit(cache=True, inline="always")
def append(buf, n, x):
    """``buf`` (holding ``n`` items) with ``x`` at index ``n``, doubled first when full.
    Inlined at numba IR level: a called function would count a reference on the array, an
    atomic operation, in the innermost loops."""
    if n == buf.shape[0]:
        out = np.empty(max(2 * n, 16), buf.dtype)
        out[:n] = buf[:n]
        buf = out
    buf[n] = x
    return buf


@numba.njit(cache=True)
def component(seeds, nseeds, head, nxt, width, paths, nlinks, seq, limit, lk, sk, ctr):
    """Slots of every flow connected to the first ``nseeds`` links of ``seeds``, in start order,
    and True; an empty array and False past ``limit`` flows."""
    stamp = _stamp(ctr)
    stack = np.empty(nseeds + 16, dtype=np.int64)
    top = 0
    for u in range(nseeds):
        li = seeds[u]
        if lk[_SEEN, li] != stamp:
            lk[_SEEN, li] = stamp
            stack = append(stack, top, li)
            top += 1
    found = np.empty(64, dtype=np.int64)
    nfound = 0
    while top:
        top -= 1
        p = head[stack[top]]
        while p >= 0:
            s = p // width
            p = nxt[p]
            if sk[_FOUND, s] == stamp:
                continue
            sk[_FOUND, s] = stamp
            found = append(found, nfound, s)
            nfound += 1
            for j in range(nlinks[s]):
                li = paths[s, j]
                if lk[_SEEN, li] != stamp:
                    lk[_SEEN, li] = stamp
                    stack = append(stack, top, li)
                    top += 1
        if nfound > limit:
            return found[:0], False
    return sort_by_seq(found, nfound, seq), True


@numba.njit(cache=True)
def settle(seeds, nseeds, head, nxt, width, paths, nlinks, rate, bneck, cap, seq, limit,
           ceiling, capped_any, lk, sk, ctr):  # fmt: skip
    """The local scheme: the flows whose rates are recomputed (start order), their new rates
    and bottlenecks, and True; False past ``limit`` flows. ``rate`` and ``bneck`` (per slot;
    -1 unknown, :data:`CAPPED` at its ceiling) describe the current allocation; outside flows
    found still valid through another link have ``bneck`` updated in place."""
    gstamp = _stamp(ctr)
    group = np.empty(64, dtype=np.int64)
    ngroup = 0
    for u in range(nseeds):
        p = head[seeds[u]]
        while p >= 0:
            s = p // width
            p = nxt[p]
            if sk[_GROUP, s] != gstamp:
                sk[_GROUP, s] = gstamp
                group = append(group, ngroup, s)
                ngroup += 1
    none = np.empty(0, dtype=np.int64)
    while ngroup:
        if ngroup > limit:
            return none, np.empty(0), none, False
        slots = sort_by_seq(group, ngroup, seq)
        tstamp = _stamp(ctr)
        links = np.empty(16, dtype=np.int64)
        nl = 0
        for s in slots:
            for j in range(nlinks[s]):
                li = paths[s, j]
                if lk[_TOUCH, li] != tstamp:
                    lk[_TOUCH, li] = tstamp
                    links = append(links, nl, li)
                    nl += 1
        for u in range(nl):
            li = links[u]
            left = cap[li]
            p = head[li]
            while p >= 0:
                g = p // width
                p = nxt[p]
                if sk[_GROUP, g] != gstamp:
                    left -= rate[g]
            lk[_RES, li] = left if left > 0.0 else 0.0
        rates = np.empty(ngroup)
        bns = np.empty(ngroup, dtype=np.int64)
        fill(slots, paths, nlinks, lk[_RES], ceiling, capped_any, rates, bns, lk, ctr)
        for i in range(ngroup):
            sk[_NEW, slots[i]] = rates[i]
        wstamp = _stamp(ctr)
        nadd = 0
        for i in range(ngroup):
            if bns[i] == CAPPED:
                continue
            top = rates[i] * (1.0 + _EPS)
            p = head[bns[i]]
            while p >= 0:
                g = p // width
                p = nxt[p]
                if sk[_GROUP, g] != gstamp and rate[g] > top and sk[_GROW, g] != wstamp:
                    sk[_GROW, g] = wstamp
                    group = append(group, ngroup + nadd, g)
                    nadd += 1
        sstamp = _stamp(ctr)
        for u in range(nl):
            p = head[links[u]]
            while p >= 0:
                g = p // width
                p = nxt[p]
                if sk[_GROUP, g] == gstamp or sk[_CHECK, g] == sstamp:
                    continue
                sk[_CHECK, g] = sstamp
                b = bneck[g]
                if b == CAPPED or (b >= 0 and lk[_TOUCH, b] != tstamp):
                    continue
                if capped_any and rate[g] >= ceiling[g] * (1.0 - _EPS):
                    bneck[g] = CAPPED
                    continue
                fair = False
                floor = rate[g] * (1.0 + _EPS)
                for j in range(nlinks[g]):
                    li = paths[g, j]
                    if lk[_STAT, li] != sstamp:  # this link's load and fastest flow, once a pass
                        lk[_STAT, li] = sstamp
                        tot = 0.0
                        fast = 0.0
                        q = head[li]
                        while q >= 0:
                            h = q // width
                            q = nxt[q]
                            x = sk[_NEW, h] if sk[_GROUP, h] == gstamp else rate[h]
                            tot += x
                            if x > fast:
                                fast = x
                        lk[_SLOAD, li] = tot
                        lk[_SFAST, li] = fast
                    if lk[_SFAST, li] <= floor and lk[_SLOAD, li] >= cap[li] * (1.0 - _EPS):
                        bneck[g] = li
                        fair = True
                        break
                if not fair and sk[_GROW, g] != wstamp:
                    sk[_GROW, g] = wstamp
                    group = append(group, ngroup + nadd, g)
                    nadd += 1
        if nadd == 0:
            return slots, rates, bns, True
        for i in range(ngroup, ngroup + nadd):
            sk[_GROUP, group[i]] = gstamp
        ngroup += nadd
    return none, np.empty(0), none, True
