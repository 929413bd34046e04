"""The network as the engine sees it: directed links, routes between ranks, local GPU rates.

:class:`Fabric` is the narrow interface the discrete-event engine needs; the topology package
implements it from the real system graph. :class:`SimpleFabric` is a small explicit
implementation (links listed by hand, routes given or found by hop count) for tests and
examples, with builders such as :func:`ring_fabric` and :func:`star_fabric` in
:mod:`collsim.engine.fabrics`.

Conventions: every link is *directed* (a full-duplex cable is two links); capacities are in
bytes per second; latencies in seconds. A route is a CSR pair ``(ptr, link_ids)``: the links of
pair ``i`` are ``link_ids[ptr[i]:ptr[i + 1]]``.
"""

from __future__ import annotations

import itertools
import typing
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import NamedTuple

import networkx as nx
import numpy as np

from collsim.engine._csr import ptr_from_lengths, subset
from collsim.errors import ScheduleError
from collsim.protocols import HW_NVLINK

Node = Hashable
"""A fabric node: a rank (``int`` 0..n-1) or a switch (any other hashable, e.g. ``"sw0"``)."""


@typing.runtime_checkable
class Fabric(typing.Protocol):
    """What the engine needs to know about a network.

    * ``nranks``: ranks are 0..nranks-1.
    * ``link_names``, ``capacity_bytes_per_s``, ``link_kind``: one entry per directed link (and
      per shared capacity a route may also cross, such as the coupling of a cable's two
      directions in :mod:`collsim.topology.graph`); ``link_kind`` holds
      :data:`collsim.protocols.HW_NVLINK`/``HW_PCI``/``HW_NET`` and picks the protocol's per-hop
      latency (NCCL's ``hwLat`` row).
    * ``couplings`` (optional): ``(k, 3)`` link ids, a shared capacity and the two directed
      links whose traffic it carries (a cable short of full duplex); the contention-free fast
      path lets the two directions overlap on it where their rates fit.
    * ``multipath`` and ``paths(src, dst)`` (optional): a fabric that splits flows over several
      paths (:mod:`collsim.topology.multipath`) says ``multipath`` and gives, per rank pair,
      its paths with the share of the bytes each carries (``pair_ptr, weight, ptr, links,
      latency_s``, see ``TopologyFabric.paths``); the engine runs one flow per path, and a
      transfer ends when its last one does. Without it, ``routes`` is the only path.
    * ``reduce_bytes_per_s`` / ``copy_bytes_per_s``: per rank, the GPU's local reduction and
      copy throughput (memory bandwidth / 3 and / 2: a reduction reads two operands and writes
      one; a copy reads one and writes one).
    * ``channel_payload_bytes_per_s(protocol, point_to_point)`` (optional): the payload rate
      one NCCL channel moves per link class ``(nvlink, pci, net)``, or ``None``; each flow's
      rate is then capped at it (times the channels the transfer stands for, see
      :func:`collsim.engine.prepare.channel_ceiling`). A fabric without it has no ceiling.
    * ``proxy_links(src, dst, ptr, links)`` (optional): for point-to-point transfers over those
      routes, the extra link ids each crosses (``(n, k)``, ``-1`` none: its GPUs' network
      proxies, a per-GPU message-rate capacity among the fabric's links) and the seconds each
      adds to its step latency; ``None`` where there are none (``TopologyFabric.proxy_links``).
    """

    nranks: int
    link_names: Sequence[str]
    capacity_bytes_per_s: np.ndarray
    link_kind: np.ndarray
    reduce_bytes_per_s: np.ndarray
    copy_bytes_per_s: np.ndarray

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For rank pairs ``(src[i], dst[i])``: CSR ``(ptr, link_ids)`` of the directed links
        each pair's flow crosses, and ``latency_s`` per pair (link plus switch latencies)."""
        ...

    def in_network(
        self, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """An in-network reduction of ``srcs`` delivered to ``dsts``: CSR ``(up_ptr, up_links)``
        from each source to the reducing switch, ``(down_ptr, down_links)`` from the switch to
        each destination, and the operation's latency in seconds. Raises ``ScheduleError`` when
        the fabric has no reducing switch."""
        ...


class Link(NamedTuple):
    """One directed link from node ``u`` to node ``v``."""

    u: Node
    v: Node
    capacity_bytes_per_s: float
    latency_s: float
    kind: int = HW_NVLINK
    name: str | None = None


def duplex(u: Node, v: Node, capacity_bytes_per_s: float, latency_s: float, kind: int = HW_NVLINK):
    """The two directed links of a full-duplex cable between ``u`` and ``v``."""
    return [
        Link(u, v, capacity_bytes_per_s, latency_s, kind),
        Link(v, u, capacity_bytes_per_s, latency_s, kind),
    ]


def _rates(value: float | Sequence[float] | np.ndarray, nranks: int, what: str) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (nranks,)).copy()
    if np.any(~(arr > 0)):
        raise ScheduleError(f"{what} must be positive", field=what, value=value)
    return arr


class SimpleFabric:
    """A fabric from an explicit list of directed links.

    Routes come, in order of preference, from ``paths`` (node sequences, endpoints included,
    keyed by ``(src, dst)``), then ``router(src, dst)`` (a function returning such a sequence),
    then the fewest-hops path in the link graph. A route's latency is the sum of its links'
    latencies plus ``node_latency_s`` of every node it passes *through* (switch latency).

    ``memory_bytes_per_s`` (per rank or one value; default infinite) sets the local rates:
    reductions at a third of it, copies at half.
    """

    def __init__(
        self,
        nranks: int,
        links: Sequence[Link | tuple],
        *,
        node_latency_s: Mapping[Node, float] | None = None,
        paths: Mapping[tuple[int, int], Sequence[Node]] | None = None,
        router: Callable[[Node, Node], Sequence[Node]] | None = None,
        reducing_switch: Node | None = None,
        memory_bytes_per_s: float | Sequence[float] | np.ndarray = float("inf"),
    ) -> None:
        if nranks < 1:
            raise ScheduleError("a fabric needs at least one rank", field="nranks", value=nranks)
        self.nranks = int(nranks)
        self.links = [Link(*link) for link in links]
        self._link_id: dict[tuple[Node, Node], int] = {}
        for i, link in enumerate(self.links):
            if (link.u, link.v) in self._link_id:
                raise ScheduleError("duplicate directed link", field="links", value=link[:2])
            if not link.capacity_bytes_per_s > 0 or link.latency_s < 0:
                raise ScheduleError("link needs capacity > 0, latency >= 0", field="links")
            self._link_id[(link.u, link.v)] = i
        self.link_names = [link.name or f"{link.u}->{link.v}" for link in self.links]
        self.capacity_bytes_per_s = np.array(
            [link.capacity_bytes_per_s for link in self.links], dtype=np.float64
        )
        self.link_kind = np.array([link.kind for link in self.links], dtype=np.int64)
        self.link_latency_s = np.array([link.latency_s for link in self.links], dtype=np.float64)
        self.node_latency_s = dict(node_latency_s or {})
        self.paths = dict(paths or {})
        self.router = router
        self.reducing_switch = reducing_switch
        memory = _rates(memory_bytes_per_s, self.nranks, "memory_bytes_per_s")
        self.reduce_bytes_per_s = memory / 3.0
        self.copy_bytes_per_s = memory / 2.0
        self._graph: nx.DiGraph | None = None
        self._bfs: dict[Node, dict[Node, list[Node]]] = {}
        self._cache: dict[tuple[Node, Node], tuple[list[int], float]] = {}

    # -- single routes -----------------------------------------------------------------------
    def _node_path(self, src: Node, dst: Node) -> Sequence[Node]:
        if (src, dst) in self.paths:
            return self.paths[(src, dst)]
        if self.router is not None:
            return self.router(src, dst)
        if self._graph is None:
            self._graph = nx.DiGraph([(link.u, link.v) for link in self.links])
        if src not in self._bfs:
            self._bfs[src] = (
                nx.single_source_shortest_path(self._graph, src) if src in self._graph else {}
            )
        path = self._bfs[src].get(dst)
        if path is None:
            raise ScheduleError(f"no route from {src!r} to {dst!r}", field="fabric")
        return path

    def route(self, src: Node, dst: Node) -> tuple[list[int], float]:
        """Link ids and latency (seconds) of the route from node ``src`` to node ``dst``."""
        key = (src, dst)
        if key not in self._cache:
            if src == dst:
                self._cache[key] = ([], 0.0)
            else:
                nodes = list(self._node_path(src, dst))
                if len(nodes) < 2 or nodes[0] != src or nodes[-1] != dst:
                    raise ScheduleError(f"bad path {nodes!r} for {src!r}->{dst!r}", field="paths")
                try:
                    ids = [self._link_id[(a, b)] for a, b in itertools.pairwise(nodes)]
                except KeyError as exc:
                    raise ScheduleError(f"path uses a missing link {exc}", field="paths") from exc
                latency = float(self.link_latency_s[ids].sum())
                latency += sum(self.node_latency_s.get(node, 0.0) for node in nodes[1:-1])
                self._cache[key] = (ids, latency)
        return self._cache[key]

    # -- the Fabric interface ----------------------------------------------------------------
    def _check_ranks(self, ranks: np.ndarray) -> None:
        if ranks.size and (ranks.min() < 0 or ranks.max() >= self.nranks):
            raise ScheduleError("rank outside the fabric", field="rank", value=int(ranks.max()))

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Routes of many rank pairs; each distinct pair is looked up once (then cached)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        self._check_ranks(src)
        self._check_ranks(dst)
        keys, inverse = np.unique(src * self.nranks + dst, return_inverse=True)
        found = [self.route(int(k // self.nranks), int(k % self.nranks)) for k in keys]
        lengths = np.array([len(ids) for ids, _ in found], dtype=np.int64)
        flat = [i for ids, _ in found for i in ids]
        ptr, links = subset(ptr_from_lengths(lengths), np.array(flat, dtype=np.int64), inverse)
        latency = np.array([lat for _, lat in found], dtype=np.float64)[inverse]
        return ptr, links, latency

    def in_network(
        self, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """Up routes to the reducing switch, down routes from it, and the operation's latency."""
        if self.reducing_switch is None:
            raise ScheduleError(
                "this fabric has no reducing switch for an in-network reduction", field="fabric"
            )
        switch = self.reducing_switch
        ups = [self.route(int(s), switch) for s in np.asarray(srcs)]
        downs = [self.route(switch, int(d)) for d in np.asarray(dsts)]

        def csr(found: list[tuple[list[int], float]]) -> tuple[np.ndarray, np.ndarray]:
            lengths = np.array([len(ids) for ids, _ in found], dtype=np.int64)
            return ptr_from_lengths(lengths), np.array(
                [i for ids, _ in found for i in ids], dtype=np.int64
            )

        latency = (
            max((lat for _, lat in ups), default=0.0)
            + self.node_latency_s.get(switch, 0.0)
            + max((lat for _, lat in downs), default=0.0)
        )
        return (*csr(ups), *csr(downs), latency)


__all__ = ["Fabric", "Link", "Node", "SimpleFabric", "duplex"]
