"""Shortest-path routing with deterministic ECMP, fast enough for 16k-GPU systems.

Two routers give the same kind of answer (a :class:`Route` of directed link ids):

* :class:`DijkstraRouter` -- one Dijkstra towards each destination over the whole graph, then a
  walk from the source along equal-cost next hops. Works on any graph (tori, explicit graphs).
* :class:`ServerFabricRouter` -- for the usual shape, servers hanging off a switched fabric:
  all-pairs distances among fabric switches once, plus small searches inside the source's and the
  destination's servers. A route between two servers then never passes through a third server,
  which is also how real clusters behave. 16,384 ring routes take seconds, not minutes.

ECMP: among equal-cost next hops a splitmix64 hash of (source, destination, hop) picks one, so
routes are the same on every run and machine and flows still spread over parallel switches. The
hash and the order of the candidates are taken from the devices' *names* (:func:`name_key`), not
their positions in the topology file, so listing the same devices or links in another order gives
the same routes. Hashing flows is what Ethernet (RoCE) switches do, and two flows that hash onto
one uplink share it (Gangidi et al., "RDMA over Ethernet for Distributed AI Training at Meta
Scale", SIGCOMM 2024, section 5: ECMP collisions; hence NCCL's several queue pairs per connection).

InfiniBand does not hash: a switch forwards by destination only (its linear forwarding table
maps each destination LID to one port), and the subnet manager fills the tables of a fat tree so
that destinations spread evenly over the up-links, D-mod-k: at the i-th hop with several
equal-cost candidates (on a fat tree, the up-going ones) the destination's index ``d`` picks
candidate ``(d / (k_1 ... k_(i-1))) mod k_i`` (OpenSM's ftree
engine; Zahavi et al., "Optimized InfiniBand fat-tree routing for shift all-to-all communication
patterns", Concurrency and Computation 2010). Destinations under one leaf then come down distinct
links, and the shift permutations a ring makes cross a non-blocking fat tree without collisions.
Across InfiniBand switches the fabric walk does that (:class:`ServerFabricRouter`): ``d`` is the
destination's edge switch (in natural name order) times its ports, plus its port there, and
candidates are taken in natural name order (``agg3`` before ``agg10``), which the builders give
in wiring order (:mod:`collsim.topology.builders`). AWS EFA takes the same balanced routes: its
SRD transport sprays each flow's packets over many paths (Shalev et al., "A Cloud-Optimized
Transport Protocol for Elastic and Scalable HPC", IEEE Micro 2020), so flows do not pile up on one
uplink either; a flow-level model cannot spray, and spreading destinations evenly is the nearest
single-path equivalent. Where a fat tree is only partly used (a job on some nodes of a leaf, a
ring wrapping from the last leaf to the first), D-mod-k can still put two flows on one uplink, as
it does on a real fabric without adaptive routing. Systems the fabric walk cannot route (servers
linked to each other directly, GPUs that forward) take :class:`DijkstraRouter`, which hashes.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from collsim.errors import TopologyError

BALANCED_KINDS = frozenset({"infiniband", "efa"})
"""Link kinds whose switches spread destinations evenly (D-mod-k) instead of hashing flows."""

_MASK64 = (1 << 64) - 1


def mix(*values: int) -> int:
    """A small deterministic hash (splitmix64 over the values) for ECMP choices."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v + 0x9E3779B97F4A7C15 + ((h << 6) & _MASK64) + (h >> 2))) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h


def name_key(name: str) -> int:
    """A stable 64-bit key of a device name: what ECMP hashes and orders candidates by."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def by_key(ids: np.ndarray, key: list[int]) -> np.ndarray:
    """``ids`` (vertex ids) in the order of their name keys."""
    return ids[np.argsort(np.array([key[i] for i in ids], dtype=np.uint64), kind="stable")]


def _pick(candidates: list[int], keys: list[int], salt: tuple[int, ...]) -> int:
    """One of several equal-cost ``candidates``, chosen by hash among them ordered by ``keys``."""
    if len(candidates) == 1:
        return candidates[0]
    ordered = sorted(zip(keys, candidates, strict=True))
    return ordered[mix(*salt) % len(ordered)][1]


@dataclass(frozen=True)
class Route:
    """A path between two devices: the directed link ids, the devices, and its latency.

    ``links`` holds the cables' directions crossed and, after them, the coupling links of those
    that are not fully duplex (:mod:`collsim.topology.graph`); ``hops`` counts cables only."""

    links: tuple[int, ...]
    devices: tuple[str, ...]
    latency_s: float

    @property
    def hops(self) -> int:
        return len(self.devices) - 1


@dataclass(frozen=True)
class Graph:
    """The routing graph: vertices are devices, plus an out-only twin per non-forwarding GPU."""

    n_devices: int
    out_vertex: np.ndarray  # device -> vertex its outgoing links start from
    link_tail: np.ndarray  # directed link -> tail vertex (an out-twin for GPUs)
    link_head: np.ndarray  # directed link -> head device
    cost: np.ndarray  # directed link -> integer routing cost (as float)
    n_vertices: int
    key: list[int]  # vertex -> name_key of its device (an out-twin: of the name + "#out")
    names: list[str] | None = None  # device -> name (for D-mod-k's natural order)
    by_destination: np.ndarray | None = None  # directed link -> forwards by destination (IB)


def _csr(
    n: int, tails: np.ndarray, heads: np.ndarray, cost: np.ndarray
) -> tuple[csr_matrix, np.ndarray]:
    """A CSR adjacency sorted by (tail, head) and the link id of each stored entry."""
    order = np.lexsort((heads, tails))
    mat = csr_matrix((cost[order], (tails[order], heads[order])), shape=(n, n))
    if mat.nnz != len(order):
        raise TopologyError(
            "two links join the same pair of devices; give one link with their total bandwidth",
            field="links",
        )
    mat.sort_indices()
    return mat, order


def natural_key(name: str) -> tuple[object, ...]:
    """Sort key of a name with its numbers compared as numbers (``agg3`` before ``agg10``), the
    name itself last so that names equal as numbers (``leaf01``, ``leaf1``) still differ."""
    parts = re.split(r"(\d+)", name)
    return (*(int(p) if i % 2 else p for i, p in enumerate(parts)), name)


@dataclass(frozen=True)
class DestinationRouting:
    """D-mod-k on one fabric walk (see the module docstring): the destination's index, which
    directed links forward by destination (InfiniBand), and each vertex's natural-name rank."""

    index: int
    by_destination: np.ndarray
    rank: np.ndarray


def _walk(
    start: int,
    goal: int,
    dist_to_goal: np.ndarray,
    fwd: csr_matrix,
    link_of: np.ndarray,
    salt: tuple[int, int],
    key: list[int],
    ordered: bool = False,
    dest: DestinationRouting | None = None,
) -> list[int]:
    """Links from ``start`` to ``goal`` following equal-cost next hops (hashed choice, or D-mod-k
    where ``dest`` says the links forward by destination); ``key`` gives each vertex of ``fwd``
    its device's name key (``ordered``: the vertex ids already follow the keys, so the candidates
    need no sorting)."""
    indptr, indices, data = fwd.indptr, fwd.indices, fwd.data
    hops: list[int] = []
    cur = start
    stride = 1
    while cur != goal:
        lo, hi = indptr[cur], indptr[cur + 1]
        nbrs = indices[lo:hi]
        ok = np.flatnonzero(dist_to_goal[nbrs] + data[lo:hi] == dist_to_goal[cur])
        if len(ok) == 0:
            raise TopologyError("routing found no next hop", field="links")
        if len(ok) == 1:
            pick = int(ok[0])
        elif dest is not None and bool(dest.by_destination[link_of[lo + ok]].all()):
            ranked = ok[np.argsort(dest.rank[nbrs[ok]], kind="stable")]
            pick = int(ranked[(dest.index // stride) % len(ranked)])
            stride *= len(ranked)
        elif ordered:
            pick = int(ok[mix(*salt, key[cur]) % len(ok)])
        else:
            pick = _pick(ok.tolist(), [key[n] for n in nbrs[ok]], (*salt, key[cur]))
        hops.append(int(link_of[lo + pick]))
        cur = int(nbrs[pick])
    return hops


class DijkstraRouter:
    """One Dijkstra towards each destination (cached), then an ECMP walk from the source."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.fwd, self.link_of = _csr(
            graph.n_vertices, graph.link_tail, graph.link_head, graph.cost
        )
        self.rev = self.fwd.T.tocsr()
        self._dist: dict[int, np.ndarray] = {}

    def dist_to(self, dst: int) -> np.ndarray:
        dist = self._dist.get(dst)
        if dist is None:
            if len(self._dist) > 1024:
                self._dist.clear()
            dist = dijkstra(self.rev, directed=True, indices=dst)
            self._dist[dst] = dist
        return dist

    def links(self, src: int, dst: int) -> list[int] | None:
        """Directed link ids from device ``src`` to device ``dst``; ``None`` if unreachable."""
        dist = self.dist_to(dst)
        start = int(self.graph.out_vertex[src])
        if not np.isfinite(dist[start]):
            return None
        key = self.graph.key
        return _walk(start, dst, dist, self.fwd, self.link_of, (key[src], key[dst]), key)


class ServerFabricRouter:
    """Routes for servers (devices with a node) attached to a fabric of switches (node None).

    Usable when every GPU belongs to a server and no link joins two servers directly; then every
    inter-server route is: inside the source server to a fabric switch it touches, across the
    fabric, into the destination server. Each part is a shortest path, and the split point is
    chosen to minimise the total, so the result equals the global shortest path that does not
    relay through a third server.
    """

    def __init__(self, graph: Graph, server: np.ndarray) -> None:
        self.graph = graph
        self.server = server  # device -> server id, -1 for fabric devices
        tails_dev = self._device_of_vertex(graph.link_tail)
        tail_srv, head_srv = server[tails_dev], server[graph.link_head]
        # Local ids in name-key order, so equal-cost candidates come out in that order.
        self.fabric_devices = by_key(np.flatnonzero(server < 0), graph.key)
        self._fabric_local = np.full(graph.n_devices, -1, dtype=np.int64)
        self._fabric_local[self.fabric_devices] = np.arange(len(self.fabric_devices))
        fabric_links = np.flatnonzero((tail_srv < 0) & (head_srv < 0))
        self._fab_fwd, order = _csr(
            len(self.fabric_devices),
            self._fabric_local[graph.link_tail[fabric_links]],
            self._fabric_local[graph.link_head[fabric_links]],
            graph.cost[fabric_links],
        )
        self._fab_link = fabric_links[order]
        self._fab_key = [graph.key[d] for d in self.fabric_devices]
        self._dmodk = self._destination_tables(tail_srv, head_srv, fabric_links)
        self._fab_dist: np.ndarray | None = None
        self._between: dict[tuple[int, int], np.ndarray] = {}
        # Links of each server's region: inside the server, or between it and the fabric.
        owner = np.where(tail_srv >= 0, tail_srv, head_srv)
        self._links_by_server = _group(owner)
        self._regions: dict[int, _Region] = {}
        self._src_search: dict[int, tuple[_Region, np.ndarray]] = {}
        self._dst_search: dict[int, tuple[_Region, np.ndarray]] = {}

    def _destination_tables(
        self, tail_srv: np.ndarray, head_srv: np.ndarray, fabric_links: np.ndarray
    ) -> tuple[np.ndarray, dict[int, int]] | None:
        """For D-mod-k, where some fabric links are InfiniBand: each fabric device's rank in
        natural name order, and each link from an edge switch down to a server's device with
        that destination's index (the switch's rank among edge switches x the most ports any
        has, plus the port's rank among its own)."""
        graph = self.graph
        ib = graph.by_destination
        if graph.names is None or ib is None or not ib[fabric_links].any():
            return None
        names = graph.names
        order = sorted(range(len(self.fabric_devices)),
                       key=lambda i: natural_key(names[self.fabric_devices[i]]))  # fmt: skip
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        # ports of InfiniBand edge switches (not of an NVLink domain's, also outside the servers)
        down = np.flatnonzero((tail_srv < 0) & (head_srv >= 0) & ib)
        tails = self._device_of_vertex(graph.link_tail[down])
        ports: dict[int, list[int]] = {}
        for link, sw in zip(down.tolist(), tails.tolist(), strict=True):
            ports.setdefault(sw, []).append(link)
        width = max((len(v) for v in ports.values()), default=1)
        index: dict[int, int] = {}
        for e, sw in enumerate(sorted(ports, key=lambda s: natural_key(names[s]))):
            links = sorted(ports[sw], key=lambda k: natural_key(names[graph.link_head[k]]))
            for p, k in enumerate(links):
                index[k] = e * width + p
        return rank, index

    @staticmethod
    def usable(graph: Graph, server: np.ndarray, gpu_forwards: np.ndarray) -> bool:
        tails_dev = ServerFabricRouter._device_of_vertex_static(graph, graph.link_tail)
        ts, hs = server[tails_dev], server[graph.link_head]
        cross = (ts >= 0) & (hs >= 0) & (ts != hs)
        return bool(np.any(server < 0)) and not np.any(cross) and not np.any(gpu_forwards)

    @staticmethod
    def _device_of_vertex_static(graph: Graph, vertices: np.ndarray) -> np.ndarray:
        twin_of = np.arange(graph.n_vertices)
        twin_of[graph.out_vertex] = np.arange(graph.n_devices)
        return twin_of[vertices]

    def _device_of_vertex(self, vertices: np.ndarray) -> np.ndarray:
        return self._device_of_vertex_static(self.graph, vertices)

    def _region(self, srv: int) -> _Region:
        region = self._regions.get(srv)
        if region is None:
            region = _Region(
                self.graph, self._links_by_server.get(srv, np.zeros(0, np.int64)), self.server
            )
            self._regions[srv] = region
        return region

    def _fabric_dist(self) -> np.ndarray:
        if self._fab_dist is None:
            self._fab_dist = dijkstra(self._fab_fwd, directed=True)
        return self._fab_dist

    def links(self, src: int, dst: int) -> list[int] | None:
        s_srv, d_srv = int(self.server[src]), int(self.server[dst])
        if s_srv < 0 or d_srv < 0:
            return None  # a fabric device as an endpoint: let the generic router answer
        if s_srv == d_srv:
            region = self._region(s_srv)
            return region.path(src, dst)
        src_region, src_dist = self._from_source(src)
        dst_region, dst_dist = self._to_dest(dst)
        exits = src_region.ports
        entries = dst_region.ports
        a = src_dist[src_region.local(exits)]
        b = dst_dist[dst_region.local(entries)]
        fab = self._fabric_dist()
        between = self._between.get((s_srv, d_srv))
        if between is None:  # fabric distances from this server's ports to that one's
            between = fab[np.ix_(self._fabric_local[exits], self._fabric_local[entries])]
            self._between[(s_srv, d_srv)] = between
        total = a[:, None] + between
        total = total + b[None, :]
        best = total.min() if total.size else np.inf
        if not np.isfinite(best):
            return None
        key = self.graph.key
        salt = (key[src], key[dst])
        cand = np.argwhere(total == best)  # ports are in key order, so these are too
        i, j = cand[mix(*salt, -1) % len(cand)]
        exit_dev, entry_dev = int(exits[i]), int(entries[j])
        head = src_region.path_back(src, exit_dev, src_dist, salt)
        tail = dst_region.path_forward(entry_dev, dst, dst_dist, salt)
        dest = None
        if self._dmodk is not None and tail and tail[0] in self._dmodk[1]:
            rank, index = self._dmodk  # (not entering through an NVLink domain's switch)
            assert self.graph.by_destination is not None
            dest = DestinationRouting(index[tail[0]], self.graph.by_destination, rank)
        goal = self._fabric_local[entry_dev]
        middle = _walk(
            int(self._fabric_local[exit_dev]),
            int(goal),
            fab[:, goal],
            self._fab_fwd,
            self._fab_link,
            salt,
            self._fab_key,
            ordered=True,
            dest=dest,
        )
        return head + middle + tail

    def _from_source(self, src: int) -> tuple[_Region, np.ndarray]:
        found = self._src_search.get(src)
        if found is None:
            region = self._region(int(self.server[src]))
            found = (region, region.all_dist[int(region.local(self.graph.out_vertex[src]))])
            self._src_search[src] = found
        return found

    def _to_dest(self, dst: int) -> tuple[_Region, np.ndarray]:
        found = self._dst_search.get(dst)
        if found is None:
            region = self._region(int(self.server[dst]))
            dist = np.ascontiguousarray(region.all_dist[:, int(region.local(dst))])
            found = (region, dist)
            self._dst_search[dst] = found
        return found


def _group(owner: np.ndarray) -> dict[int, np.ndarray]:
    """Link ids grouped by owning server (owners < 0 dropped)."""
    keep = np.flatnonzero(owner >= 0)
    order = keep[np.argsort(owner[keep], kind="stable")]
    keys, starts = np.unique(owner[order], return_index=True)
    bounds = [*starts[1:], len(order)]
    return {int(k): order[s:e] for k, s, e in zip(keys, starts, bounds, strict=True)}


class _Region:
    """One server and the fabric devices it touches, as a small graph with local vertex ids."""

    def __init__(self, graph: Graph, links: np.ndarray, server: np.ndarray) -> None:
        self.graph = graph
        tails, heads = graph.link_tail[links], graph.link_head[links]
        ids = np.unique(np.concatenate([tails, heads]))
        vertices = by_key(ids, graph.key)
        self.vertices = vertices  # in name-key order; a vertex's local id is its position here
        self._ids = ids  # sorted by id, to look up local ids
        self._local = np.empty(len(ids), dtype=np.int64)
        self._local[np.searchsorted(ids, vertices)] = np.arange(len(ids))
        self.fwd, order = _csr(
            len(vertices), self.local(tails), self.local(heads), graph.cost[links]
        )
        self.link_of = links[order]
        self.rev = self.fwd.T.tocsr()
        self._rev_link = self._transpose_links()
        devices = vertices[vertices < graph.n_devices]
        self.ports = devices[server[devices] < 0]
        """The fabric devices this server touches, where its traffic enters and leaves (in name-key
        order, so a choice among them does not depend on the order of the topology file)."""
        self._dist_to: dict[int, list[float]] = {}
        self.key = [graph.key[v] for v in vertices]
        """The name key of each local vertex."""

    def local(self, vertices: np.ndarray | int) -> np.ndarray:
        """Local ids of graph vertices that belong to this region."""
        return self._local[np.searchsorted(self._ids, vertices)]

    def _transpose_links(self) -> np.ndarray:
        """Link id of each stored entry of ``rev`` (the transpose of ``fwd``)."""
        rows = np.repeat(np.arange(self.fwd.shape[0]), np.diff(self.fwd.indptr))
        cols = self.fwd.indices
        order = np.lexsort((rows, cols))
        return self.link_of[order]

    @cached_property
    def all_dist(self) -> np.ndarray:
        """Shortest distances between every two local vertices (row: from, column: to): one
        Dijkstra per server, not one per GPU and direction. The costs are whole numbers, so
        each distance is the same float however its sum is formed."""
        return dijkstra(self.fwd, directed=True)

    def path(self, src: int, dst: int) -> list[int] | None:
        """Links from ``src`` to ``dst`` inside the server (:func:`_walk`, ordered, on lists)."""
        goal = int(self.local(dst))
        dist = self._dist_to.get(dst)
        if dist is None:
            dist = self.all_dist[:, goal].tolist()
            self._dist_to[dst] = dist
        start = int(self.local(self.graph.out_vertex[src]))
        if not math.isfinite(dist[start]):
            return None
        key = self.graph.key
        hops = _walk_lists(start, goal, dist, self._fwd_lists, (key[src], key[dst]), self.key)
        if hops is None:
            raise TopologyError("routing found no next hop", field="links")
        return hops

    @cached_property
    def _fwd_lists(self) -> tuple[list, list, list, list]:
        """``fwd`` as Python lists: a region is small, and list walks beat numpy calls there."""
        f = self.fwd
        return f.indptr.tolist(), f.indices.tolist(), f.data.tolist(), self.link_of.tolist()

    @cached_property
    def _rev_lists(self) -> tuple[list, list, list, list]:
        r = self.rev
        return r.indptr.tolist(), r.indices.tolist(), r.data.tolist(), self._rev_link.tolist()

    def path_forward(
        self, start_dev: int, dst: int, dist_to_dst: np.ndarray, salt: tuple[int, int]
    ) -> list[int]:
        """Links from ``start_dev`` to ``dst`` along equal-cost next hops (as :func:`_walk`)."""
        start = int(self.local(self.graph.out_vertex[start_dev]))
        hops = _walk_lists(start, int(self.local(dst)), dist_to_dst.tolist(), self._fwd_lists,
                           (*salt, 0), self.key)  # fmt: skip
        if hops is None:
            raise TopologyError("routing found no next hop", field="links")
        return hops

    def path_back(
        self, src: int, goal_dev: int, dist_from_src: np.ndarray, salt: tuple[int, int]
    ) -> list[int]:
        """Links from ``src`` to ``goal_dev``, walking predecessors back from the goal."""
        start = int(self.local(self.graph.out_vertex[src]))
        hops = _walk_lists(int(self.local(goal_dev)), start, dist_from_src.tolist(),
                           self._rev_lists, (*salt, 1), self.key)  # fmt: skip
        if hops is None:
            raise TopologyError("routing found no previous hop", field="links")
        hops.reverse()
        return hops


def _walk_lists(
    start: int,
    goal: int,
    dist: list[float],
    csr: tuple[list, list, list, list],
    salt: tuple[int, ...],
    key: list[int],
) -> list[int] | None:
    """:func:`_walk` over Python lists: from ``start`` to ``goal`` through neighbours ``n`` with
    ``dist[n] + cost == dist[cur]``, ties hashed with the name key of ``cur`` (the ids follow the
    keys, so the candidates are in key order)."""
    indptr, indices, data, link_of = csr
    hops: list[int] = []
    cur = start
    while cur != goal:
        lo, hi = indptr[cur], indptr[cur + 1]
        here = dist[cur]
        ok = [k for k in range(lo, hi) if dist[indices[k]] + data[k] == here]
        if not ok:
            return None
        k = ok[mix(*salt, key[cur]) % len(ok)] if len(ok) > 1 else ok[0]
        hops.append(link_of[k])
        cur = indices[k]
    return hops
