"""The ring model's longest path over (position, step), step by step or in one pass per phase.

A ring of ``m`` positions runs ``S`` steps; a send at position ``i`` and step ``s`` waits for the
block it forwards (position ``i - 1``, step ``s - 1``) plus its latency ``l_i``, and follows its
own previous send on the connection: ``T(i,s) = max(T(i-1,s-1) + l_i, T(i,s-1)) + f_s(i)``, where
``f`` is the step's bytes' time. :func:`longest_path` returns every position's ``T`` after the
last step, as the :class:`~collsim.model.envelope.Aff` of the path attaining it (its summed
latencies and bytes' slope).

Step by step this is ``O(m x S)``: a 32,768-GPU ring all-reduce (``S = 2(m - 1)``) is 2e9 cell
updates, 25 s in numpy. Within a phase of constant costs a path's value is fixed by where it
starts and how far it advances: from ``(j, 0)`` to ``(i, S)`` it advances ``d = i - j`` times
(paying each entered position's ``l + f``) and stays the other ``S - d`` steps where ``f`` is
largest on its arc ``[j, i]`` (its stays are best spent there). For each ``i`` the arc's largest
``f`` is a step function of ``d`` with one step per distinct ``f`` value, and within a step the
best ``j`` is a range maximum of a fixed sequence, answered by a sparse table. That is
``O(K m log m)`` per phase for ``K`` distinct bytes' times (a few: NVLink edges and NIC edges),
instead of ``O(m^2)``; :func:`longest_path` takes it where it pays and the step loop elsewhere.

The one-pass form sums a path's latencies as differences of prefix sums, so its intercepts
differ from the step loop's sequential sums in the last bits (relative 1e-15); small rings (every
ring the engine is compared with bit for bit) keep the step loop.
"""

from __future__ import annotations

import numpy as np

from collsim.model.envelope import Aff

FAST_MIN_CELLS = 1 << 22
"""Step-loop cells (positions x steps of a phase) from which the one-pass form is used."""

_MAX_CLASSES = 64
"""Distinct bytes' times in one phase beyond which the one-pass form does not pay."""


def longest_path(step_costs: list[Aff], s: float, start: Aff | None = None) -> Aff:
    """``T`` after the last step (module docstring) of rings ``(k, m)`` whose step ``t`` costs
    ``step_costs[t]`` (latency ``a``, bytes' slope ``b``), evaluated at size ``s``; ``start``:
    each position's time before the first step."""
    t = step_costs[0] if start is None else start + step_costs[0]
    # Carried as the value at ``s`` (to compare paths) and the intercept and slope of the path
    # attaining it. The intercept is summed along the path, not recovered as ``v - b s`` at the
    # end: at the envelope's largest query (64 TiB, ``v`` ~ 1e3 s) that difference is off by a
    # few ulps of ``v`` (~3e-12 s), and the envelope keeps the larger of two equal-slope lines.
    v, a, b = t.at(s), np.array(t.a, dtype=np.float64), np.array(t.b, dtype=np.float64)
    for cost, count in _runs(step_costs[1:]):
        m = v.shape[-1]
        if m * count >= FAST_MIN_CELLS and _classes(cost, s) <= _MAX_CLASSES:
            v, a, b = _phase(v, a, b, cost, count, s)
        else:
            v, a, b = _steps(v, a, b, cost, count, s)
    return Aff(a, b)


def _runs(costs: list[Aff]) -> list[tuple[Aff, int]]:
    """Consecutive identical step costs as (cost, count)."""
    out: list[tuple[Aff, int]] = []
    for cost in costs:
        if out and out[-1][0] is cost:
            out[-1] = (cost, out[-1][1] + 1)
        else:
            out.append((cost, 1))
    return out


def _classes(cost: Aff, s: float) -> int:
    """The most distinct bytes' times on one ring of ``cost``."""
    f = np.atleast_2d(cost.b * s)
    return max((np.unique(row).size for row in f), default=0)


def _steps(
    v: np.ndarray, a: np.ndarray, b: np.ndarray, cost: Aff, count: int, s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` steps of ``cost``, one at a time (ties keep the stay)."""
    f = cost.b * s
    rv, ra, rb = np.empty_like(v), np.empty_like(a), np.empty_like(b)
    for _ in range(count):
        rv[..., 1:], rv[..., 0] = v[..., :-1], v[..., -1]
        ra[..., 1:], ra[..., 0] = a[..., :-1], a[..., -1]
        rb[..., 1:], rb[..., 0] = b[..., :-1], b[..., -1]
        rv += cost.a
        ra += cost.a
        pick = rv > v
        v = np.where(pick, rv, v)
        v += f
        a = np.where(pick, ra, a)
        b = np.where(pick, rb, b)
        b += cost.b
    return v, a, b


def _phase(
    v: np.ndarray, a: np.ndarray, b: np.ndarray, cost: Aff, count: int, s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` steps of ``cost`` in one pass per ring (module docstring)."""
    shape = v.shape
    v2, a2, b2 = (np.atleast_2d(x).reshape(-1, shape[-1]) for x in (v, a, b))
    l2 = np.broadcast_to(cost.a, shape).reshape(-1, shape[-1])
    g2 = np.broadcast_to(cost.b, shape).reshape(-1, shape[-1])
    out = [_phase_ring(v2[r], a2[r], b2[r], l2[r], g2[r], count, s) for r in range(v2.shape[0])]
    return tuple(np.stack([o[k] for o in out]).reshape(shape) for k in range(3))  # type: ignore[return-value]


def _phase_ring(
    v0: np.ndarray,
    a0: np.ndarray,
    b0: np.ndarray,
    lat: np.ndarray,
    slope: np.ndarray,
    steps: int,
    s: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One ring: ``T(i) = max_d [T0(i-d) + P(i) - P(i-d) + (steps - d) max f[i-d..i]]`` over
    ``0 <= d <= steps``, positions unrolled (``i - d`` may go round the ring several times)."""
    m = v0.size
    f = slope * s
    # unrolled positions j = -steps .. m-1, stored at index j + steps
    idx = np.arange(m + steps, dtype=np.int64)
    pos = (idx - steps) % m
    pv = np.cumsum(lat[pos] + f[pos])  # value of entering every position up to j
    pa = np.cumsum(lat[pos])
    pb = np.cumsum(slope[pos])
    here = np.arange(m, dtype=np.int64) + steps  # index of each end position i
    fvals, first = np.unique(f, return_index=True)
    d_lo = np.empty((fvals.size + 1, m), dtype=np.int64)
    d_lo[-1] = steps + 1  # no larger value: the last class runs to the longest arc
    fu = f[pos]
    for k, fk in enumerate(fvals.tolist()):  # distance back to the nearest f >= fk
        last = np.maximum.accumulate(np.where(fu >= fk, idx, -1))[here]
        d_lo[k] = np.where(last >= 0, here - last, steps + 1)
    best_v = np.full(m, -np.inf)
    best_j = np.zeros(m, dtype=np.int64)
    best_k = np.zeros(m, dtype=np.int64)
    tv = v0[pos] - pv
    for k, fk in enumerate(fvals.tolist()):
        lo_d, hi_d = d_lo[k], np.minimum(d_lo[k + 1] - 1, steps)
        ok = lo_d <= hi_d
        if not ok.any():
            continue
        q = tv + (idx - steps) * fk
        table = _sparse_argmax(q)
        rows = np.flatnonzero(ok)
        j = _range_argmax(q, table, here[rows] - hi_d[rows], here[rows] - lo_d[rows])
        cand = q[j] + pv[here[rows]] + (steps - rows) * fk
        better = cand > best_v[rows]
        best_v[rows[better]] = cand[better]
        best_j[rows[better]] = j[better]
        best_k[rows[better]] = k
    d = here - best_j
    j_pos = pos[best_j]
    slope_max = slope[first[best_k]]
    a = a0[j_pos] + (pa[here] - pa[best_j])
    b = b0[j_pos] + (pb[here] - pb[best_j]) + (steps - d) * slope_max
    return best_v, a, b


def _sparse_argmax(q: np.ndarray) -> list[np.ndarray]:
    """Level ``k``: the index of the largest of ``q[i : i + 2**k]`` (the first of equals)."""
    levels = [np.arange(q.size, dtype=np.int64)]
    width = 1
    while 2 * width <= q.size:
        prev = levels[-1]
        left, right = prev[: q.size - 2 * width + 1], prev[width : q.size - width + 1]
        levels.append(np.where(q[right] > q[left], right, left))
        width *= 2
    return levels


def _range_argmax(
    q: np.ndarray, table: list[np.ndarray], lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Index of the largest ``q`` in each ``[lo, hi]`` (inclusive, ``lo <= hi``)."""
    length = hi - lo + 1
    level = np.floor(np.log2(length)).astype(np.int64)
    out = np.empty(lo.size, dtype=np.int64)
    for k in np.unique(level).tolist():
        sel = np.flatnonzero(level == k)
        left = table[k][lo[sel]]
        right = table[k][hi[sel] - (1 << k) + 1]
        out[sel] = np.where(q[right] > q[left], right, left)
    return out
