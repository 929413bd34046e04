"""Topology -> directed graph, routes between GPUs, and the figures users size a fabric by.

Every full-duplex link becomes two directed links (ids ``2i`` and ``2i+1`` for link ``i``), each
with the link's per-direction bandwidth, so traffic in one direction never slows the other. A link
that is not fully duplex (``duplex_bandwidth_bytes_per_s``) also gets a *coupling* link, id
``2 * len(links) + k``: not a cable but a capacity both directions share, added to every route
that crosses the link either way, so the engine and the analytic model share it out like any
other link. A capacity several link directions share (:attr:`Topology.shared`, such as the
uplink of a PCIe switch whose GPUs reach each other through host memory) is one more such link,
after the couplings, added to every route that crosses one of its members.

Routing is shortest-path over a cost that prefers few hops and fat links (each directed link costs
``100 + 10000 / GB/s``, integers, so equal-cost paths compare exactly): inside a DGX that picks
NVLink over PCIe, across a fat-tree it picks the fewest hops. GPUs never forward traffic (except in
chip-level tori, where chips do route). Among equal-cost next hops, a deterministic hash of (source,
destination, hop) picks one: deterministic ECMP, the same answer on every run and machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra, maximum_flow

from collsim.errors import TopologyError
from collsim.topology.batch import BatchRoutes
from collsim.topology.multipath import Multipath
from collsim.topology.routing import (
    BALANCED_KINDS,
    DijkstraRouter,
    Graph,
    Route,
    ServerFabricRouter,
    name_key,
)
from collsim.topology.servers import ServerCopies
from collsim.topology.spec import INTRA_NODE_LINK_KINDS, MULTIPATH_ROUTINGS, Device, Topology


def link_cost(bandwidth_bytes_per_s: float) -> int:
    """Routing cost of one directed link: a hop plus a term that grows as bandwidth shrinks."""
    return 100 + round(10000 / (bandwidth_bytes_per_s / 1e9))


class Network:
    """The routable form of a :class:`Topology` (built once, queried many times)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.devices: list[Device] = list(topology.devices)
        self.index = {d.name: i for i, d in enumerate(self.devices)}
        n_dev = len(self.devices)
        # Non-forwarding GPUs get a second vertex carrying only their outgoing edges, so that a
        # path may start at a GPU and end at a GPU but never pass through one.
        self._out_vertex = np.arange(n_dev)
        extra = 0
        for i, dev in enumerate(self.devices):
            if not dev.forwards:
                self._out_vertex[i] = n_dev + extra
                extra += 1
        self.n_vertices = n_dev + extra
        links = topology.links
        n_links = 2 * len(links)
        self.link_src = np.empty(n_links, dtype=np.int64)
        self.link_dst = np.empty(n_links, dtype=np.int64)
        self.capacity_bytes_per_s = np.empty(n_links)
        self.latency_s = np.empty(n_links)
        self.link_kind: list[str] = []
        self.link_names: list[str] = []
        for i, lk in enumerate(links):
            a, b = self.index[lk.a], self.index[lk.b]
            for j, (u, v) in enumerate(((a, b), (b, a))):
                self.link_src[2 * i + j] = u
                self.link_dst[2 * i + j] = v
                self.link_names.append(f"{self.devices[u].name}->{self.devices[v].name}")
                self.link_kind.append(lk.kind)
            self.capacity_bytes_per_s[2 * i : 2 * i + 2] = (
                lk.bandwidth_bytes_per_s * lk.bandwidth_factor[0],
                lk.bandwidth_bytes_per_s * lk.bandwidth_factor[1],
            )
            self.latency_s[2 * i : 2 * i + 2] = (
                lk.latency_s + lk.extra_latency_s[0],
                lk.latency_s + lk.extra_latency_s[1],
            )
        self.n_directed_links = n_links
        """Ids below this are cables' directions; above, coupling links (see the docstring)."""
        self._coupling = np.full(n_links, -1, dtype=np.int64)
        extra_cap: list[float] = []
        for i, lk in enumerate(links):
            if lk.duplex_bandwidth_bytes_per_s is None:
                continue
            self._coupling[2 * i : 2 * i + 2] = n_links + len(extra_cap)
            # Both ways together never carry more than the two directions (a fault may have
            # degraded one); other jobs' load on the shared capacity is already taken off it.
            both = float(self.capacity_bytes_per_s[2 * i] + self.capacity_bytes_per_s[2 * i + 1])
            extra_cap.append(min(lk.duplex_bandwidth_bytes_per_s, both))
            self.link_names.append(f"{lk.a}<->{lk.b} (both directions)")
            self.link_kind.append(lk.kind)
        self._n_couplings = len(extra_cap)
        # Capacities several link directions share (a no-P2P PCIe switch's uplink): one more
        # link each, crossed by every route that crosses one of its members.
        direction = (
            {
                (self.devices[int(u)].name, self.devices[int(v)].name): k
                for k, (u, v) in enumerate(zip(self.link_src, self.link_dst, strict=True))
            }
            if topology.shared
            else {}
        )
        self._shared: dict[int, list[int]] = {}
        self._shared_members: list[list[int]] = []
        for g, sh in enumerate(topology.shared):
            members = []
            for a, b in sh.directions:
                k = direction.get((a, b))
                if k is None:
                    raise TopologyError(
                        f"shared capacity {sh.name!r}: no link from {a} to {b}",
                        field=f"shared.{g}.directions",
                        value=[a, b],
                    )
                members.append(k)
            gid = n_links + len(extra_cap)
            for k in members:
                self._shared.setdefault(k, []).append(gid)
            self._shared_members.append(members)
            # Never more than its members carry together (a fault may have degraded them).
            extra_cap.append(
                min(sh.bandwidth_bytes_per_s, float(self.capacity_bytes_per_s[members].sum()))
            )
            self.link_names.append(sh.name)
            self.link_kind.append(sh.kind)
        self.capacity_bytes_per_s = np.r_[self.capacity_bytes_per_s, extra_cap]
        self.latency_s = np.r_[self.latency_s, np.zeros(len(extra_cap))]
        self.device_latency_s = np.array([d.latency_s for d in self.devices])
        # Routing costs the nominal bandwidth: a degraded link (a fault) is not routed around.
        nominal = [lk.bandwidth_bytes_per_s for lk in links for _ in range(2)]
        self.graph = Graph(
            n_devices=n_dev,
            out_vertex=self._out_vertex,
            link_tail=self._out_vertex[self.link_src],
            link_head=self.link_dst,
            cost=np.array([link_cost(b) for b in nominal], dtype=np.float64),
            n_vertices=self.n_vertices,
            key=self._vertex_keys(),
            names=[d.name for d in self.devices],
            by_destination=_by_destination(topology),
        )
        self._generic = DijkstraRouter(self.graph)
        server = np.array([-1 if d.node is None else d.node for d in self.devices], dtype=np.int64)
        gpu_forwards = np.array([d.kind == "gpu" and d.forwards for d in self.devices])
        self._fast = (
            ServerFabricRouter(self.graph, server)
            if ServerFabricRouter.usable(self.graph, server, gpu_forwards)
            else None
        )
        self._routes: dict[tuple[int, int], Route] = {}
        self._paths: dict[tuple[int, int], tuple[tuple[tuple[int, ...], float], ...]] = {}
        self._coupling_list: list[int] = self._coupling.tolist()
        self.multipath = (
            Multipath(
                switch=np.array([d.kind == "switch" for d in self.devices]),
                link_src=self.link_src,
                link_dst=self.link_dst,
                cost=self.graph.cost,
                capacity=self.capacity_bytes_per_s[:n_links],
                key=self.graph.key,
                adaptive=topology.routing == "adaptive",
            )
            if topology.routing in MULTIPATH_ROUTINGS
            else None
        )
        """Where the fabric splits flows (``spray``, ``adaptive``): their paths; else ``None``."""
        self._nics_of: dict[str, list[str]] = {}
        self._node_nics: dict[int | None, list[str]] = {}
        for d in self.devices:
            if d.kind == "nic":
                self._node_nics.setdefault(d.node, []).append(d.name)

    def _vertex_keys(self) -> list[int]:
        """Each routing vertex's ECMP key, from its device's name (an out-twin's differs)."""
        keys = [name_key(d.name) for d in self.devices]
        twins = [0] * (self.n_vertices - len(keys))
        for i, d in enumerate(self.devices):
            if self._out_vertex[i] != i:
                twins[int(self._out_vertex[i]) - len(keys)] = name_key(d.name + "#out")
        return keys + twins

    @cached_property
    def couplings(self) -> np.ndarray:
        """``(k, 3)`` ids: each coupling link and the two cable directions that share it."""
        cables = np.flatnonzero(self._coupling >= 0)
        if cables.shape[0] == 0:
            return np.zeros((0, 3), dtype=np.int64)
        pairs = cables.reshape(-1, 2)  # a cable's two directions are 2i and 2i + 1
        return np.column_stack((self._coupling[pairs[:, 0]], pairs)).astype(np.int64)

    # -- routing ---------------------------------------------------------------------------------
    @cached_property
    def gpu_names(self) -> list[str]:
        """GPU names in rank order (node-major)."""
        return [g.name for g in self.topology.gpus]

    def route(self, src: str, dst: str) -> Route:
        """The route from device ``src`` to device ``dst`` (deterministic ECMP)."""
        return self.route_index(self.index[src], self.index[dst])

    def route_index(self, src: int, dst: int) -> Route:
        """The route between devices given by index (cached)."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        links: list[int] | None = []
        if src != dst:
            links = self._fast.links(src, dst) if self._fast is not None else None
            if links is None:
                links = self._generic.links(src, dst)
        if links is None:
            raise TopologyError(
                f"no route from {self.devices[src].name} to {self.devices[dst].name}",
                field="links",
            )
        route = self._route_of(src, links)
        self._routes[key] = route
        return route

    def _route_of(self, src: int, links: list[int]) -> Route:
        """The :class:`Route` from device ``src`` over the cable directions ``links``: its
        devices, latency, and the coupling and shared links its cables load."""
        hops = np.asarray(links, dtype=np.int64)
        heads = self.link_dst[hops]
        latency = float(self.latency_s[hops].sum() + self.device_latency_s[heads[:-1]].sum())
        names = (self.devices[src].name, *(self.devices[int(h)].name for h in heads))
        coupled = self._coupling[hops]
        links = [*links, *(int(c) for c in coupled[coupled >= 0])]
        if self._shared:  # once per member crossed: each crossing loads the shared capacity
            links += [g for h in links[: len(hops)] for g in self._shared.get(h, ())]
        return Route(tuple(int(x) for x in links), names, latency)

    def paths_index(self, src: int, dst: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        """The paths between devices given by index, each as its link ids (those of
        :attr:`Route.links`) with the share of the bytes it carries (cached): the route alone
        (share 1) unless the fabric splits flows (:mod:`collsim.topology.multipath`); then the
        route is the first path (:meth:`route_index` gives its latency, the transfer's)."""
        key = (src, dst)
        found = self._paths.get(key)
        if found is not None:
            return found
        route = self.route_index(src, dst)
        found = ((route.links, 1.0),)
        if self.multipath is not None:
            switch = [i for i, name in enumerate(route.devices)
                      if self.devices[self.index[name]].kind == "switch"]  # fmt: skip
            if len(switch) > 1 and switch[-1] - switch[0] == len(switch) - 1:
                first, last = switch[0], switch[-1]
                cables = list(route.links[: route.hops])
                salt = (self.graph.key[src], self.graph.key[dst])
                segments = self.multipath.segments(
                    self.index[route.devices[first]],
                    self.index[route.devices[last]],
                    cables[first:last],
                    salt,
                )
                if len(segments) > 1:
                    head, tail = cables[:first], cables[last:]
                    found = tuple(
                        (route.links if i == 0 else self._loaded([*head, *seg, *tail]), w)
                        for i, (seg, w) in enumerate(segments)
                    )
        self._paths[key] = found
        return found

    def _loaded(self, cables: list[int]) -> tuple[int, ...]:
        """The cable directions ``cables`` and, after them, the coupling and shared links they
        load (as :meth:`_route_of` adds them), on Python lists: a path is a handful of links."""
        coupling = self._coupling_list
        links = [*cables, *(coupling[h] for h in cables if coupling[h] >= 0)]
        if self._shared:
            links += [g for h in cables for g in self._shared.get(h, ())]
        return tuple(links)

    @cached_property
    def batch(self) -> BatchRoutes:
        """Routes and paths of many pairs at once, the same as :meth:`route_index` and
        :meth:`paths_index` give one at a time (:mod:`collsim.topology.batch`)."""
        return BatchRoutes(self)

    @cached_property
    def copies(self) -> ServerCopies | None:
        """Servers that are copies of one another, where the batch router applies: routes
        inside them moved from one representative (:mod:`collsim.topology.servers`)."""
        return ServerCopies(self, self._fast) if self.batch.enabled else None  # type: ignore[arg-type]

    def gpu_route(self, src_rank: int, dst_rank: int) -> Route:
        """Route between GPUs given by rank (node-major order)."""
        return self.route(self.gpu_names[src_rank], self.gpu_names[dst_rank])

    # -- derived figures ---------------------------------------------------------------------------
    def nic_affinity(self) -> dict[str, list[str]]:
        """For each GPU, the NIC(s) its off-node traffic leaves through (routing decides)."""
        return {gpu.name: self.nics_of(gpu.name) for gpu in self.topology.gpus}

    def nics_of(self, gpu: str) -> list[str]:
        """The NIC(s) of its node nearest ``gpu`` by routed hops, reached without crossing
        another GPU: where its off-node traffic leaves (cached)."""
        if gpu not in self._nics_of:
            nics = self._node_nics.get(self.devices[self.index[gpu]].node, [])
            nearest = [self.route(gpu, nic) for nic in nics]
            best = min((r.hops for r in nearest), default=0)
            self._nics_of[gpu] = [
                nic
                for nic, r in zip(nics, nearest, strict=True)
                if r.hops == best and not _passes_gpu(r, self)
            ]
        return list(self._nics_of[gpu])

    def injection_bandwidth_bytes_per_s(self) -> float:
        """Scale-out bandwidth per GPU: what node 0 can send off-node, divided by its GPUs.

        Counts NIC ports into the fabric (a NIC-to-NIC cable of a direct-connect torus counts
        half, being shared by two nodes' NICs), or, for chip-level tori, the GPUs' own links to
        other nodes. Zero for a single server with no way out.
        """
        node_of = [d.node for d in self.devices]
        kind_of = [d.kind for d in self.devices]
        per_node = 0.0
        for i, lk in enumerate(self.topology.links):
            a, b = self.index[lk.a], self.index[lk.b]
            for here, there in ((a, b), (b, a)):
                if node_of[here] != 0 or node_of[there] == 0:
                    continue
                if kind_of[here] == "nic" and node_of[there] is None:
                    per_node += self.capacity_bytes_per_s[2 * i]
                elif kind_of[here] == "nic" and kind_of[there] == "nic":
                    per_node += self.capacity_bytes_per_s[2 * i] / 2
                elif kind_of[here] == "gpu" and node_of[there] is not None:
                    per_node += self.capacity_bytes_per_s[2 * i]
        per_gpu = per_node / max(1, self.topology.gpus_per_node)
        # A GPU reaches its NICs over its own path (PCIe): with fewer GPUs than NICs in a node
        # (a DGX with --gpus-per-node 1), what it can send off-node is that path's, not the NICs'.
        reach = []
        for gpu in self.topology.gpus:
            if gpu.node != 0:
                continue
            nics = self.nics_of(gpu.name)
            if nics:
                paths = [self.route(gpu.name, nic) for nic in nics]
                each = sum(float(self.capacity_bytes_per_s[list(r.links[: r.hops])].min())
                           for r in paths)  # fmt: skip
                firsts = {r.links[0] for r in paths}
                first = sum(float(self.capacity_bytes_per_s[k]) for k in firsts)
                reach.append(min(each, first))
        return min(per_gpu, sum(reach) / len(reach)) if reach else per_gpu

    def intra_bandwidth_bytes_per_s(self) -> float:
        """Bandwidth from one GPU towards its node's (or NVLink domain's) other GPUs.

        The sum of its links to other GPUs and to NVSwitches (NVLink, xGMI, ...); for PCIe-only
        servers, its PCIe link.
        """
        gpu = self.gpu_names[0]
        node = self.devices[self.index[gpu]].node
        total = pcie = 0.0
        for i, lk in enumerate(self.topology.links):
            if gpu not in (lk.a, lk.b):
                continue
            other = self.devices[self.index[lk.b if lk.a == gpu else lk.a]]
            domain_switch = other.kind == "nvswitch" and other.node is None  # multi-node NVLink
            if other.node != node and not domain_switch:
                continue
            if other.kind in ("gpu", "nvswitch"):
                total += self.capacity_bytes_per_s[2 * i]
            elif other.kind in ("pcie_switch", "cpu"):
                pcie = max(pcie, self.capacity_bytes_per_s[2 * i])
        return total or pcie

    def bisection_bandwidth_bytes_per_s(self) -> float:
        """Max flow from the first half of the GPUs (rank order) to the second half.

        For node-major ranks this cuts the system between whole nodes, the usual bisection of a
        cluster; for one node it splits the node's GPUs.
        """
        gpus = [self.index[g] for g in self.gpu_names]
        if len(gpus) < 2:
            return 0.0
        half = len(gpus) // 2
        source, sink = self.n_vertices, self.n_vertices + 1
        # scipy's max-flow takes int32 capacities: count in MB/s, coarser for very large systems.
        # The answer is at most what the first half can send; scale units so that fits 2**30.
        directed = self.capacity_bytes_per_s[: self.n_directed_links]  # cables, not couplings
        bound = float(directed[np.isin(self.link_src, gpus[:half])].sum())
        unit = 10.0 ** math.ceil(math.log10(max(1e6, bound / 2**30)))  # MB/s, or coarser
        cap = np.round(directed / unit)
        cap = np.clip(cap, 1, 2**31 - 1).astype(np.int64)
        # In a max-flow, GPUs may relay (as NCCL's PXN does through NVLink), so use device ids.
        big = 2**31 - 1
        tails = np.concatenate([self.link_src, [source] * half, gpus[half:]])
        heads = np.concatenate([self.link_dst, gpus[:half], [sink] * (len(gpus) - half)])
        caps = np.concatenate([cap, [big] * len(gpus)])
        n = self.n_vertices + 2
        # A shared capacity whose members all end at one device (or all start at one) becomes a
        # vertex its members pass through, joined to that device by the shared capacity.
        shared_cap = self.capacity_bytes_per_s[self.n_directed_links + self._n_couplings :]
        for members, total in zip(self._shared_members, shared_cap, strict=True):
            m = np.asarray(members, dtype=np.int64)
            hub, one = n, max(1, round(float(total) / unit))
            if np.unique(self.link_dst[m]).size == 1:
                heads[m] = hub
                tails = np.r_[tails, hub]
                heads = np.r_[heads, self.link_dst[m[0]]]
            elif np.unique(self.link_src[m]).size == 1:
                tails[m] = hub
                tails = np.r_[tails, self.link_src[m[0]]]
                heads = np.r_[heads, hub]
            else:
                continue  # members apart at both ends: not a cut a max-flow can express
            caps = np.r_[caps, min(one, 2**31 - 1)]
            n += 1
        graph = csr_matrix((caps, (tails, heads)), shape=(n, n))
        graph.sum_duplicates()
        graph.data = np.minimum(graph.data, 2**31 - 1).astype(np.int32)
        flow = maximum_flow(graph, source, sink)
        return float(flow.flow_value) * unit

    def diameter_hops(self, sample: int = 2048) -> int:
        """Longest GPU-to-GPU route in hops (GPUs do not relay); sampled past ``sample`` GPUs."""
        gpus = [self.index[g] for g in self.gpu_names]
        sources = gpus if len(gpus) <= sample else gpus[:: max(1, len(gpus) // sample)]
        unit = self._generic.fwd.copy()
        unit.data[:] = 1.0
        out = [int(self._out_vertex[g]) for g in sources]
        dist = dijkstra(unit, directed=True, indices=out, unweighted=True)
        reach = dist[:, gpus]
        reach[~np.isfinite(reach)] = 0
        return int(reach.max())


def _by_destination(topology: Topology) -> np.ndarray:
    """Per directed cable, whether its switch forwards by destination (D-mod-k) rather than
    hashing flows: the fabric's ``routing`` says (``dmodk``: every network link; ``ecmp``: none),
    else the link kind (InfiniBand and EFA, :mod:`collsim.topology.routing`). ``spray`` and
    ``adaptive`` keep the link kind's rule for the first of their paths."""
    routing = topology.routing
    if routing == "dmodk":
        return np.array(
            [lk.kind not in INTRA_NODE_LINK_KINDS for lk in topology.links for _ in range(2)]
        )
    if routing == "ecmp":
        return np.zeros(2 * len(topology.links), dtype=bool)
    return np.array([lk.kind in BALANCED_KINDS for lk in topology.links for _ in range(2)])


def _passes_gpu(route: Route, net: Network) -> bool:
    return any(net.devices[net.index[name]].kind == "gpu" for name in route.devices[1:-1])


def build_network(topology: Topology) -> Network:
    """Spec -> routable :class:`Network`."""
    return Network(topology)


def to_networkx(topology: Topology) -> nx.DiGraph:
    """The topology as a networkx DiGraph (one edge per direction), for analysis and drawing."""
    graph = nx.DiGraph()
    for dev in topology.devices:
        graph.add_node(dev.name, kind=dev.kind, node=dev.node, latency_s=dev.latency_s)
    for i, lk in enumerate(topology.links):
        for j, (u, v) in enumerate(((lk.a, lk.b), (lk.b, lk.a))):
            graph.add_edge(
                u,
                v,
                id=2 * i + j,
                kind=lk.kind,
                bandwidth_bytes_per_s=lk.bandwidth_bytes_per_s,
                latency_s=lk.latency_s,
            )
    return graph


def count_by_kind(items: Sequence[object], attr: str = "kind") -> dict[str, int]:
    """How many devices (or links) of each kind, in first-seen order."""
    counts: dict[str, int] = {}
    for item in items:
        key = getattr(item, attr)
        counts[key] = counts.get(key, 0) + 1
    return counts
