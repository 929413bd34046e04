"""Closed forms of recursive-halving reduce-scatter and recursive-doubling all-gather
(``collsim/collectives/recursive.py``: ``build_reduce_scatter`` / ``build_all_gather``).

Both run on ``p`` (the largest power of two <= n) survivors; the first ``r = n - p`` even ranks
fold into their odd partners, so survivor ``v < r`` owns two rank blocks (its *virtual* block is
twice as large). A step at distance ``d`` moves the real blocks of ``d`` virtual blocks; each
send waits for the member's previous send and receive (a longest path over the hypercube).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collsim.collectives.recursive import Fold
from collsim.model.envelope import Aff
from collsim.model.flows import FlowCosts

Oracle = Callable[[float], Aff]


def _cost(
    costs: FlowCosts, src: np.ndarray, dst: np.ndarray, frac: np.ndarray, w: int, fused: bool
) -> Aff:
    frac = np.broadcast_to(np.asarray(frac, dtype=np.float64), src.shape)
    wave = costs.wave(src, dst, w, load_bytes=frac * w, size=frac)
    b = frac * wave.s_per_byte
    if fused:
        b = np.maximum(b, frac / costs.reduce_bytes_per_s[dst])
    return Aff(wave.lat_s, b)


def rd_gather_scatter(costs: FlowCosts, collective: str, n: int, channels: int) -> Oracle:
    """Recursive-halving reduce_scatter or recursive-doubling all_gather on ``n`` ranks."""
    fold = Fold(n)
    p, r, depth, sv = fold.p, fold.r, fold.steps, fold.survivor
    blk = 1.0 / (n * channels)  # one rank's block, per channel, per collective byte
    v = np.arange(p)
    start = np.where(np.arange(p + 1) < r, 2 * np.arange(p + 1), np.arange(p + 1) + r)
    start[p] = n
    w = channels
    if depth == 0:
        line = Aff.const(0.0, blk * n / costs.copy_bytes_per_s[0])
        return lambda s: line
    e = fold.extra
    if collective == "all_gather":
        mine = Aff(np.zeros(p), blk / costs.copy_bytes_per_s[sv])
        fin = _cost(costs, e, e + 1, blk, w, False) if r else None
        steps = []
        for k in range(depth):
            d = 1 << k
            lo = v & ~(d - 1)
            steps.append(_cost(costs, sv, sv[v ^ d], blk * (start[lo + d] - start[lo]), w, False))
        out = _cost(costs, e + 1, e, blk * n, w, False) if r else None

        def gather(s: float) -> Aff:
            first = mine
            if fin is not None:
                head = mine[:r].maximum(fin, s)
                first = Aff(np.r_[head.a, mine.a[r:]], np.r_[head.b, mine.b[r:]])
            prev, prev_d = None, 0
            for k, cost in enumerate(steps):
                begin = first if prev is None else prev.maximum(prev[v ^ prev_d], s)
                prev, prev_d = begin + cost, 1 << k
            done = prev.maximum(prev[v ^ (p >> 1)], s)  # type: ignore[union-attr]
            ends = [done]
            if out is not None:
                ends.append(done[:r] + out)
            return Aff(
                np.concatenate([x.a for x in ends]), np.concatenate([x.b for x in ends])
            ).max(s)

        return gather

    fold_in = _cost(costs, e, e + 1, blk * n, w, True) if r else None
    halving = []
    for k in range(depth - 1):
        d = p >> (k + 1)
        lo = (v ^ d) & ~(d - 1)
        halving.append(_cost(costs, sv, sv[v ^ d], blk * (start[lo + d] - start[lo]), w, True))
    u = v ^ 1
    own = _cost(costs, sv, sv[u], blk, w, False)
    xv = np.flatnonzero(u < r)  # senders whose partner stands in for an extra
    ext = _cost(costs, sv[xv], sv[u[xv]], blk, w, True) if xv.size else None
    red = Aff(np.zeros(p), channels * blk / costs.reduce_bytes_per_s[sv])
    hand = _cost(costs, e + 1, e, blk, w, False) if r else None

    def scatter(s: float) -> Aff:
        first = Aff.zeros(p)
        if fold_in is not None:
            first.a[:r], first.b[:r] = fold_in.a, fold_in.b
        prev, prev_d = None, 0
        for k, cost in enumerate(halving):
            begin = first if prev is None else prev.maximum(prev[v ^ prev_d], s)
            prev, prev_d = begin + cost, p >> (k + 1)
        data = first if prev is None else prev.maximum(prev[v ^ 2], s)
        own_end = data + own
        mine = own_end[u].maximum(own_end, s)  # receive into w and w's own last send
        ends = [mine + red]
        if hand is not None and ext is not None:
            into = Aff.zeros(p)
            into.a[u[xv]], into.b[u[xv]] = (data[xv] + ext).a, (data[xv] + ext).b
            ready = into[:r].maximum(mine[:r], s)
            ends.append(ready + hand)
        return Aff(np.concatenate([x.a for x in ends]), np.concatenate([x.b for x in ends])).max(s)

    return scatter
