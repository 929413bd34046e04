"""Servers that are copies of one another, so that a route inside one is another's, moved.

A template expands every node the same way: node ``n``'s devices are node 0's with ids shifted
by a constant, and so are the links inside it. Where the route between two positions of a
representative server meets no tie (a single shortest next hop at every step, so the pair's
hash does not choose it), the route between the same positions of a copy is the same links
shifted, with the same latency to the bit (the same values summed in the same order). A
recursive halving-doubling on 4,096 DGX nodes asks for 98,304 routes inside servers; walked one
pair at a time they were a third of its routing, moved as arrays they are a few numpy calls.

Two servers are copies when their devices and inside links are contiguous id ranges of the same
size, with the same relative endpoints, routing costs and latencies, the same device latencies,
and the same links to the fabric (relative endpoint, cost) -- what the router's per-server region
holds, so the shortest paths agree. Links short of full duplex (coupling links) are left to the
per-pair router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from collsim.topology.batch import walk_once
from collsim.topology.routing import _group

if TYPE_CHECKING:
    from collsim.topology.graph import Network
    from collsim.topology.routing import ServerFabricRouter


class ServerCopies:
    """Per server: its representative copy and the device and link shifts onto it."""

    def __init__(self, network: Network, router: ServerFabricRouter) -> None:
        self.net, self.router = network, router
        graph = network.graph
        server = router.server
        n_srv = int(server.max(initial=-1)) + 1
        self.rep = np.full(n_srv, -1, dtype=np.int64)
        self.dev_base = np.zeros(n_srv, dtype=np.int64)
        self.link_base = np.zeros(n_srv, dtype=np.int64)
        self.link_count = np.zeros(n_srv, dtype=np.int64)
        self._routes: dict[tuple[int, int], tuple[tuple[int, ...], float] | None] = {}
        tail_dev = router._device_of_vertex(graph.link_tail[: network.n_directed_links])
        head_dev = graph.link_head[: network.n_directed_links]
        inside = (server[tail_dev] >= 0) & (server[tail_dev] == server[head_dev])
        seen: dict[bytes, int] = {}
        devs_of = _groups(server[: graph.n_devices])
        links_of = _groups(np.where(inside, server[tail_dev], -1))
        for srv, devs in devs_of.items():
            links = links_of.get(srv, np.zeros(0, dtype=np.int64))
            outside = router._links_by_server.get(srv, np.zeros(0, dtype=np.int64))
            outside = outside[~inside[outside]] if outside.size else outside
            key = self._signature(devs, links, outside, tail_dev, head_dev)
            if key is None:
                continue
            self.dev_base[srv], self.link_base[srv] = devs[0], links[0] if links.size else 0
            self.link_count[srv] = links.size
            self.rep[srv] = seen.setdefault(key, srv)

    def _signature(
        self,
        devs: np.ndarray,
        links: np.ndarray,
        outside: np.ndarray,
        tail_dev: np.ndarray,
        head_dev: np.ndarray,
    ) -> bytes | None:
        """What two copies share (module docstring); ``None``: ids not contiguous, or coupled."""
        net = self.net
        if devs[-1] - devs[0] + 1 != devs.size or (links.size and links[-1] - links[0] + 1
                                                   != links.size):  # fmt: skip
            return None
        if links.size and np.any(net._coupling[links] >= 0):
            return None
        base = devs[0]
        ends = np.concatenate((tail_dev[outside], head_dev[outside]))
        theirs = ends[(ends < devs[0]) | (ends > devs[-1])]
        _, ext = np.unique(theirs, return_inverse=True)  # fabric devices, by first id order
        rel_out = np.where((ends >= devs[0]) & (ends <= devs[-1]), ends - base, -1)
        rel_out[rel_out < 0] = -2 - ext.reshape(-1)
        parts = (
            np.array([devs.size, links.size, outside.size]),
            tail_dev[links] - base,
            head_dev[links] - base,
            net.graph.cost[links],
            net.latency_s[links],
            net.device_latency_s[devs],
            rel_out,
            net.graph.cost[outside],
        )
        return b"|".join(np.ascontiguousarray(p).tobytes() for p in parts)

    def routes(
        self, src: np.ndarray, dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For pairs of devices in one server: which are copies of a tie-free route inside their
        representative, and for those the routes as CSR ``(ptr, links)`` and latencies."""
        srv = self.router.server[src]
        rep = np.where(srv >= 0, self.rep[np.maximum(srv, 0)], -1)
        ok = (rep >= 0) & (srv == self.router.server[dst]) & (src != dst)
        shift = self.dev_base[rep[ok]] - self.dev_base[srv[ok]]
        rs, rd = src[ok] + shift, dst[ok] + shift
        n = self.net.graph.n_devices
        uniq, inv = np.unique(rs * np.int64(n) + rd, return_inverse=True)
        found = [self._rep_route(c // n, c % n) for c in uniq.tolist()]
        good = np.array([f is not None for f in found], dtype=bool)
        rows = np.flatnonzero(ok)
        keep = good[inv.reshape(-1)]
        rows, inv = rows[keep], inv.reshape(-1)[keep]
        ok = np.zeros(src.shape[0], dtype=bool)
        ok[rows] = True
        width = max((len(f[0]) for f in found if f is not None), default=0)
        mat = np.full((len(found), width), -1, dtype=np.int64)
        lat = np.zeros(len(found))
        for i, f in enumerate(found):
            if f is not None:
                mat[i, : len(f[0])], lat[i] = f[0], f[1]
        moved = mat[inv]
        link_shift = self.link_base[srv[rows]] - self.link_base[rep[rows]]
        moved = np.where(moved >= 0, moved + link_shift[:, None], -1)
        ptr = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum((moved >= 0).sum(axis=1), out=ptr[1:])
        return ok, ptr, moved[moved >= 0], lat[inv]

    def _rep_route(self, src: int, dst: int) -> tuple[tuple[int, ...], float] | None:
        """The route inside the representative and its latency, where no step has a tie and
        every link is inside the server (``None`` otherwise)."""
        key = (src, dst)
        if key in self._routes:
            return self._routes[key]
        from_walk = self._tie_free(src, dst)
        found = None
        if from_walk is not None:
            route = self.net.route_index(src, dst)
            srv = int(self.router.server[src])
            lo, n = self.link_base[srv], self.link_count[srv]
            links = tuple(route.links)
            if links == tuple(from_walk) and all(lo <= x < lo + n for x in links):
                found = (links, float(route.latency_s))
        self._routes[key] = found
        return found

    def _tie_free(self, src: int, dst: int) -> list[int] | None:
        """The walk inside the server from ``src`` to ``dst`` where no step has a tie."""
        region = self.router._region(int(self.router.server[src]))
        goal = int(region.local(dst))
        start = int(region.local(self.net.graph.out_vertex[src]))
        dist = region.all_dist[:, goal].tolist()
        return walk_once(start, goal, dist, region._fwd_lists)


def _groups(owner: np.ndarray) -> dict[int, np.ndarray]:
    """Ids grouped by owner, each group sorted (:func:`~collsim.topology.routing._group`;
    empty where nothing has an owner)."""
    return _group(owner) if np.any(owner >= 0) else {}
