"""Multipath routing: one flow split over several paths of the scale-out fabric, with weights.

Where a fabric's ``routing`` is ``spray`` or ``adaptive`` (:data:`collsim.topology.spec.ROUTINGS`),
a route between two GPUs whose traffic crosses the switches is several *paths*, each carrying a
fixed share of the bytes (its *weight*; the weights sum to 1). The engine and the analytic model
run each path as a sub-flow that shares links max-min with everything else, claiming its weight's
part of a link (weighted max-min, :mod:`collsim.engine.maxmin`: routing spreads a flow's bytes, it
does not multiply its claim), and a transfer ends when its last sub-flow does. Inside the
servers (GPU, PCIe, NIC) every path is the usual route (:mod:`collsim.topology.routing`); only
the part between the first and the last switch differs.

Paths between the entry switch ``s`` and the exit switch ``d`` (over links between devices of
kind ``switch``, at the routing cost of :mod:`collsim.topology.graph`):

* *Minimal* paths, both routings: the usual route's own (always the first path, so its latency
  is the transfer's) and further equal-cost ones, one per candidate of the first hop where
  several are equal (a fat tree's up-links), at most :data:`MAX_MINIMAL_PATHS`. The k-th path
  takes the k-th candidate of that hop, rotated by a hash of the two switches and of the
  endpoints' class (:data:`VARIANTS`), so pairs use different subsets where there are more
  candidates than paths, and at every later hop with several candidates the hashed choice
  rotated by k, so the paths spread at every tier. Spraying a flow's packets over the
  equal-cost paths (NVIDIA Spectrum-X; AWS EFA's SRD, Shalev et al., IEEE Micro 2020) or
  choosing per packet the least loaded of them (InfiniBand adaptive routing) loads them evenly,
  which is this split at flow level.
* *Non-minimal* paths, ``adaptive`` only: to a neighbour ``n`` of ``s`` that is on no minimal
  path, then the (hashed) minimal path from ``n`` to ``d``, kept where it is at most twice the
  minimal cost (a Valiant path is two minimal ones) and does not come back through ``s``; at
  most :data:`MAX_DETOURS` of them, the neighbours taken in name-key order rotated by that
  hash. In a dragonfly group these are the two-hop detours through the group's other routers;
  between groups, through another router of the group or another group. On a fat tree every
  neighbour of a leaf is on a minimal path, so ``adaptive`` there is ``spray``.

Weights: each path's bottleneck capacity divided by its switch-to-switch hops, in whole *lanes*
(that over the smallest's, rounded): a path of two lanes is two sub-flows, and every sub-flow of
a flow carries the same share of its bytes. On equal links that is an even split over the
minimal paths (a fat tree's spray), and a two-hop detour takes half a direct path's share:
UGAL (Kim et al., ISCA 2008; Slingshot's adaptive routing, De Sensi et al., SC20) prices a path
by its queue times its hops, so at equal queues a two-hop detour is worth half a direct link.
Equal sub-flows matter: all of a flow's sub-flows cross its GPU's NIC, where max-min gives each
the same rate, so equal ones finish together there and a static share (the analytic model's) is
the engine's; unequal ones would leave the larger waiting alone at the end.

A flow-level model cannot follow the queues, so the split is static: a pair of routers alone on
its direct link (a ring crossing two routers) gets the parallel detours' bandwidth, as UGAL
gives it under load, while uniform traffic (an all-to-all that fills every link) pays the
detours' extra hops, which UGAL would mostly avoid by staying minimal: there the predictions
are conservative.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from collsim.topology.routing import by_key, mix

MAX_MINIMAL_PATHS = 16
"""Most equal-cost paths a flow is split over (a radix-64 leaf has 32 up-links): enough for a
flow to reach its NIC's rate over up-links as fast as the NIC, and bounded so that a 16k-GPU
system's routes stay cheap."""

MAX_DETOURS = 8
"""Most non-minimal paths an ``adaptive`` flow adds: at half a direct link's weight each, 8
detours give a router pair 5 links' worth of bandwidth, more than the 4 NICs of a node put on
one pair of routers (a dragonfly group has 2x as many routers as each has endpoints, so its
direct link plus all detours at half weight carry what one router's endpoints inject)."""


VARIANTS = 4
"""Classes of endpoint pairs (by a hash of the two) that take different path subsets between
the same two switches: where a switch pair has more candidates than a flow uses (a radix-64
leaf's 32 up-links, a router's 47 neighbours), flows between them still spread over more of
them, and the paths are computed once per switch pair and class, not per GPU pair."""


class Multipath:
    """The paths of flows between switches of one network, for ``spray`` or ``adaptive``.

    ``switch``: per device, whether it is a scale-out switch; ``link_src``/``link_dst``: each
    directed cable's devices; ``cost``: its routing cost; ``capacity``: its bytes/s; ``key``:
    each device's name key (:func:`collsim.topology.routing.name_key`)."""

    def __init__(
        self,
        *,
        switch: np.ndarray,
        link_src: np.ndarray,
        link_dst: np.ndarray,
        cost: np.ndarray,
        capacity: np.ndarray,
        key: Sequence[int],
        adaptive: bool,
    ) -> None:
        self.adaptive = adaptive
        ids = by_key(np.flatnonzero(switch), list(key))  # local ids in name-key order
        self._local = np.full(switch.shape[0], -1, dtype=np.int64)
        self._local[ids] = np.arange(ids.shape[0])
        self._device = ids
        self._key = [int(key[d]) for d in ids]
        cables = np.flatnonzero(switch[link_src] & switch[link_dst])
        tails, heads = self._local[link_src[cables]], self._local[link_dst[cables]]
        order = np.lexsort((heads, tails))
        n = ids.shape[0]
        fwd = csr_matrix((cost[cables][order], (tails[order], heads[order])), shape=(n, n))
        fwd.sum_duplicates()
        fwd.sort_indices()
        self._fwd = fwd
        self._rev = fwd.T.tocsr()
        # The cable of each stored entry (one cable per ordered pair of switches).
        link_at = {(int(t), int(h)): int(c) for t, h, c in zip(tails, heads, cables, strict=True)}
        rows = np.repeat(np.arange(n), np.diff(fwd.indptr))
        self._link = np.array([link_at[(int(r), int(c))] for r, c in zip(rows, fwd.indices,
                                                                         strict=True)],
                              dtype=np.int64)  # fmt: skip
        self._capacity = capacity
        self._dist: dict[int, np.ndarray] = {}
        self._cache: dict[tuple[int, int, int], tuple[list, list]] = {}
        self._worths: dict[tuple[int, ...], float] = {}

    def _dist_to(self, goal: int) -> np.ndarray:
        dist = self._dist.get(goal)
        if dist is None:
            if len(self._dist) > 4096:
                self._dist.clear()
            dist = dijkstra(self._rev, directed=True, indices=goal)
            self._dist[goal] = dist
        return dist

    def _next(self, cur: int, dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Equal-cost next hops from ``cur`` towards the goal of ``dist``: (stored entries,
        vertices), in name-key order."""
        f = self._fwd
        lo, hi = f.indptr[cur], f.indptr[cur + 1]
        nbrs = f.indices[lo:hi]
        ok = np.flatnonzero(dist[nbrs] + f.data[lo:hi] == dist[cur])
        return lo + ok, nbrs[ok]

    def _walk(
        self, start: int, goal: int, dist: np.ndarray, salt: tuple[int, ...], k: int
    ) -> tuple[list[int] | None, list[int] | None, int]:
        """The k-th rotation of the hashed equal-cost walk: (cables, switches visited), and the
        number of candidates at its first hop with several (1 if none)."""
        cables: list[int] = []
        visited = [start]
        first = 1
        cur = start
        while cur != goal:
            entries, nbrs = self._next(cur, dist)
            if entries.shape[0] == 0:
                return None, None, first
            pick = 0
            if entries.shape[0] > 1:
                if first == 1:
                    first = entries.shape[0]
                pick = (mix(*salt, self._key[cur]) + k) % entries.shape[0]
            cables.append(int(self._link[entries[pick]]))
            cur = int(nbrs[pick])
            visited.append(cur)
        return cables, visited, first

    def segments(
        self, src: int, dst: int, primary: Sequence[int], salt: tuple[int, int]
    ) -> list[tuple[tuple[int, ...], float]]:
        """Paths (cables) from switch device ``src`` to switch device ``dst``, one entry per
        lane with its share of the bytes; the first is ``primary`` (the usual route's cables
        between them). The other paths depend on the two switches and on one of
        :data:`VARIANTS` classes of the endpoints (``salt``), and are cached per those."""
        return self.segments_of(src, dst, primary, mix(*salt) % VARIANTS)

    def segments_of(
        self, src: int, dst: int, primary: Sequence[int], variant: int
    ) -> list[tuple[tuple[int, ...], float]]:
        """:meth:`segments` for endpoints of class ``variant`` (what their ``salt`` hashes to)."""
        s, d = int(self._local[src]), int(self._local[dst])
        cached = self._cache.get((s, d, variant))
        if cached is None:
            if len(self._cache) > 1 << 18:
                self._cache.clear()
            cached = self._candidates(s, d, (self._key[s], self._key[d], variant))
            self._cache[(s, d, variant)] = cached
        minimal, detours = cached
        first = tuple(primary)
        found = [first, *(p for p in minimal if p != first)][:MAX_MINIMAL_PATHS]
        found += detours
        worth = np.array([self._worth(p) for p in found])
        lanes = np.maximum(1, np.rint(worth / worth.min())).astype(np.int64).tolist()
        share = 1.0 / sum(lanes)
        return [(p, share) for p, n in zip(found, lanes, strict=True) for _ in range(n)]

    def _worth(self, path: tuple[int, ...]) -> float:
        """A path's bottleneck bandwidth over its switch-to-switch hops (cached)."""
        worth = self._worths.get(path)
        if worth is None:
            worth = float(self._capacity[list(path)].min()) / len(path)
            self._worths[path] = worth
        return worth

    def _candidates(
        self, s: int, d: int, salt: tuple[int, ...]
    ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Equal-cost paths from ``s`` to ``d`` (one per candidate of the first hop with
        several, at most :data:`MAX_MINIMAL_PATHS`) and, for ``adaptive``, the detours."""
        dist = self._dist_to(d)
        minimal: list[tuple[int, ...]] = []
        _, _, branching = self._walk(s, d, dist, salt, 0)
        for k in range(min(MAX_MINIMAL_PATHS, branching)):
            cables, _, _ = self._walk(s, d, dist, salt, k)
            if cables is not None and tuple(cables) not in minimal:
                minimal.append(tuple(cables))
        detours = self._detours(s, d, dist, salt, minimal) if self.adaptive else []
        return minimal, detours

    def _detours(
        self, s: int, d: int, dist: np.ndarray, salt: tuple[int, ...], minimal: list
    ) -> list[tuple[int, ...]]:
        f = self._fwd
        lo, hi = f.indptr[s], f.indptr[s + 1]
        nbrs, costs = f.indices[lo:hi], f.data[lo:hi]
        via = costs + dist[nbrs]
        keep = (via > dist[s]) & (via <= 2 * dist[s]) & (nbrs != d)
        entries = lo + np.flatnonzero(keep)
        if entries.shape[0] == 0:
            return []
        start = mix(*salt, -2) % entries.shape[0]
        entries = np.roll(entries, -start)  # the stored order is name-key order
        out: list[tuple[int, ...]] = []
        for entry in entries.tolist():
            n = int(f.indices[entry])
            cables, visited, _ = self._walk(n, d, dist, (*salt, 1), 0)
            if cables is None or s in visited:
                continue
            path = (int(self._link[entry]), *cables)
            if path not in minimal and path not in out:
                out.append(path)
            if len(out) >= MAX_DETOURS:
                break
        return out
