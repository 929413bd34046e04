"""The equal-cost next hops across a fabric, per (switch, goal), as arrays grown on demand.

The batch router (:mod:`collsim.topology.batch`) walks every pair across the fabric in
lockstep; at each hop it needs, per (current switch, goal switch), the stored entries of the
fabric's CSR that lie on a shortest path, the same in D-mod-k's natural-name order, and
whether all of them forward by destination. A recursive halving-doubling on 32,768 GPUs asks
for about 700,000 of them; looked up one at a time in a dict (and rebuilt into matrices at
every hop) that was most of its routing. Here they are found for all new (switch, goal) codes
at once and kept as flat arrays (CSR by code row), so a hop is a ``searchsorted``.

The entries are exactly the per-pair router's (:func:`~collsim.topology.routing._walk`): the
same test ``dist[next] + cost == dist[current]`` on the same floats, the same stable order.
"""

from __future__ import annotations

import numpy as np


class NextHops:
    """Equal-cost next hops of a fabric CSR ``fwd`` towards goals, by ``cur * n + goal`` code.

    ``dist``: all-pairs distances (row: from); ``link``: the link id of each stored entry;
    ``rank``: each fabric vertex's D-mod-k natural-name rank (``None``: no D-mod-k);
    ``by_destination``: per link id, whether it forwards by destination (InfiniBand).
    """

    def __init__(
        self,
        fwd: object,
        dist: np.ndarray,
        link: np.ndarray,
        rank: np.ndarray | None,
        by_destination: np.ndarray | None,
    ) -> None:
        self.indptr = np.asarray(fwd.indptr, dtype=np.int64)  # type: ignore[attr-defined]
        self.indices = np.asarray(fwd.indices, dtype=np.int64)  # type: ignore[attr-defined]
        self.data = np.asarray(fwd.data)  # type: ignore[attr-defined]
        self.n = self.indptr.size - 1
        self.dist = dist
        self.link = np.asarray(link, dtype=np.int64)
        self.rank = rank
        self.by_destination = by_destination
        self._codes = np.zeros(0, dtype=np.int64)  # known codes, sorted
        self._row = np.zeros(0, dtype=np.int64)  # the row of each sorted code
        self.start = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0, dtype=np.int64)
        self.by_dest = np.zeros(0, dtype=bool)
        self.entries = np.zeros(0, dtype=np.int64)
        self.ranked = np.zeros(0, dtype=np.int64)

    def rows(self, cur: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """Row of each (cur, goal): its next hops are ``entries[start[row] + k]`` (stored CSR
        entries, in stored order) or ``ranked[...]`` (in D-mod-k order), ``k < count[row]``;
        ``by_dest[row]``: all of them forward by destination."""
        code = cur * self.n + goal
        at = np.searchsorted(self._codes, code)
        hit = at < self._codes.size
        hit[hit] = self._codes[at[hit]] == code[hit]
        if not hit.all():
            self._grow(np.unique(code[~hit]))
            at = np.searchsorted(self._codes, code)
        return self._row[at]

    def _grow(self, new: np.ndarray) -> None:
        cur, goal = new // self.n, new % self.n
        lo = self.indptr[cur]
        lengths = self.indptr[cur + 1] - lo
        owner = np.repeat(np.arange(new.size), lengths)
        start = np.zeros(new.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=start[1:])
        entry = lo[owner] + np.arange(int(start[-1])) - start[:-1][owner]
        g = goal[owner]
        ok = self.dist[self.indices[entry], g] + self.data[entry] == self.dist[cur[owner], g]
        entry, owner = entry[ok], owner[ok]  # grouped by owner, in stored order
        count = np.bincount(owner, minlength=new.size)
        ranked, by_dest = entry, np.zeros(new.size, dtype=bool)
        if self.rank is not None:
            ranked = entry[np.lexsort((self.rank[self.indices[entry]], owner))]
            assert self.by_destination is not None
            forwards = self.by_destination[self.link[entry]]
            others = np.bincount(owner, (~forwards).astype(np.float64), minlength=new.size)
            by_dest = (count > 1) & (others == 0)
        first = np.zeros(new.size, dtype=np.int64)
        np.cumsum(count[:-1], out=first[1:])
        base = self.entries.size
        rows = np.arange(new.size) + self.count.size
        self.start = np.concatenate((self.start, first + base))
        self.count = np.concatenate((self.count, count))
        self.by_dest = np.concatenate((self.by_dest, by_dest))
        self.entries = np.concatenate((self.entries, entry))
        self.ranked = np.concatenate((self.ranked, ranked))
        codes = np.concatenate((self._codes, new))
        order = np.argsort(codes, kind="stable")
        self._codes, self._row = codes[order], np.concatenate((self._row, rows))[order]
