"""The engine's view of a real topology: ranks placed on GPUs, routes as directed-link ids.

:class:`TopologyFabric` implements :class:`collsim.engine.fabric.Fabric` from a
:class:`~collsim.topology.graph.Network`. Rank ``r`` runs on the ``r``-th GPU of ``gpus``
(default: every GPU in NCCL-like node-major order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collsim.channel_rates import channel_payload_bytes_per_s
from collsim.errors import ScheduleError, TopologyError
from collsim.nvls import nvls_channels, nvls_chunks, nvls_heads, nvls_tree_chunks
from collsim.protocols import HW_NET, HW_NVLINK, HW_PCI
from collsim.topology.batch_pairs import paths as batch_paths
from collsim.topology.batch_pairs import routes as batch_routes
from collsim.topology.graph import Network, Route
from collsim.transports import P2P_NET_CHUNK_BYTES, route_overhead_s, transport_for

_HW_CLASS = {
    "nvlink": HW_NVLINK,
    "nvlink_c2c": HW_NVLINK,
    "xgmi": HW_NVLINK,
    "infinity_fabric": HW_NVLINK,
    "ici": HW_NVLINK,
    "pcie": HW_PCI,
    "upi": HW_PCI,
}
"""NCCL's latency classes: GPU-to-GPU fabrics count as NVLink, host links as PCI, the rest NET."""


@dataclass(frozen=True)
class InNetwork:
    """In-network reductions as arrays (:meth:`TopologyFabric.in_network_many`): every flow's
    route as CSR ``(ptr, links)``, each reduction's up flows then its down flows, in order."""

    ptr: np.ndarray
    links: np.ndarray
    group: np.ndarray
    """The reduction each flow belongs to."""
    up: np.ndarray
    """Whether the flow goes up to the switch (else down from it)."""
    latency_s: np.ndarray
    """Per reduction: the slowest up route + the switch + the slowest down route."""
    share: np.ndarray
    """Per reduction: bytes each flow carries per payload byte (:meth:`in_network_traffic`)."""


def host_staged_classes(network: Network) -> tuple[int, ...]:
    """NCCL link classes whose GPU-to-GPU traffic goes through host memory here: PCI on nodes
    without GPU peer-to-peer (``Topology.gpu_p2p`` false: NCCL's SHM transport); none
    elsewhere."""
    return () if network.topology.gpu_p2p else (HW_PCI,)


def _transport_costs(
    network: Network,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Capacity per link with each cable at a NIC scaled by its transport's attainable
    fraction, the (3, links) per-step transport overhead of cables at a NIC (0 elsewhere:
    a route crosses a NIC's cable wherever it leaves or enters a node over the network), and
    per link the proxy's time per point-to-point message of its transport (0: no limit), and
    per link the serial flush seconds per payload byte of a Simple receive over it
    (``Topology.receive_flushes`` times the transport's :attr:`Transport.flush_s_per_byte`)."""
    capacity = np.array(network.capacity_bytes_per_s, dtype=np.float64)
    overhead = np.zeros((3, capacity.shape[0]))
    proxy_s = np.zeros(capacity.shape[0])
    flush = np.zeros(capacity.shape[0])
    flushes = float(network.topology.receive_flushes)
    override = network.topology.transport
    kinds = [d.kind for d in network.devices]
    for k in range(network.n_directed_links):
        if kinds[network.link_src[k]] != "nic" and kinds[network.link_dst[k]] != "nic":
            continue
        transport = transport_for(network.link_kind[k], override)
        if transport is None:
            continue
        capacity[k] *= transport.bandwidth_fraction
        overhead[:, k] = transport.step_overhead_s
        proxy_s[k] = transport.proxy_message_us * 1e-6
        flush[k] = flushes * transport.flush_s_per_byte
    return capacity, overhead, proxy_s, flush


class TopologyFabric:
    """Routes between ranks over a :class:`Network`, for the discrete-event engine."""

    def __init__(self, network: Network, gpus: Sequence[str] | None = None) -> None:
        self.network = network
        self.gpus = list(gpus) if gpus is not None else list(network.gpu_names)
        unknown = [g for g in self.gpus if g not in network.index]
        if unknown:
            raise ScheduleError("no such GPU in the topology", field="gpus", value=unknown[0])
        self.nranks = len(self.gpus)
        self._gpu_index = np.array([network.index[g] for g in self.gpus], dtype=np.int64)
        self.link_names = network.link_names
        self.link_kind = np.array(
            [_HW_CLASS.get(kind, HW_NET) for kind in network.link_kind], dtype=np.int64
        )
        capacity, self.transport_overhead_s, self._proxy_s, self.flush_s_per_byte = (
            _transport_costs(network)
        )
        """Capacities with each NIC cable at its transport's attainable fraction; and per
        protocol (LL, LL128, Simple) and link, the transport's per-step overhead (s), which
        both engines add to the step latency of a route crossing that NIC
        (:mod:`collsim.transports`); ``flush_s_per_byte``: per link, the serial GPUDirect
        receive flush per payload byte of a Simple transfer crossing it, which the engine adds
        to the transfer's latency and the model to its seconds per byte."""
        self.capacity_bytes_per_s = capacity
        self.proxy_first: int | None = None
        """Link id of rank 0's proxy (rank ``r``'s is ``proxy_first + r``), where the NICs'
        transport has a per-message proxy cost; ``None`` otherwise (:meth:`proxy_links`)."""
        if np.any(self._proxy_s > 0):
            # One capacity per GPU: its proxy thread's point-to-point bytes/s, sends and
            # receives together (transports.py), after the network's own links.
            rate = P2P_NET_CHUNK_BYTES / float(self._proxy_s.max())
            self.proxy_first = capacity.shape[0]
            self.link_names = [*network.link_names, *(f"{g}.proxy" for g in self.gpus)]
            self.capacity_bytes_per_s = np.concatenate((capacity, np.full(self.nranks, rate)))
            self.link_kind = np.concatenate((self.link_kind, np.full(self.nranks, HW_NET)))
            pad = ((0, 0), (0, self.nranks))
            self.transport_overhead_s = np.pad(self.transport_overhead_s, pad)
            self._proxy_s = np.pad(self._proxy_s, (0, self.nranks))
            self.flush_s_per_byte = np.pad(self.flush_s_per_byte, (0, self.nranks))
        # Per-GPU speed (a slow GPU of a what-if fault) scales its memory rates.
        speed = np.array([network.devices[i].speed for i in self._gpu_index], dtype=np.float64)
        memory = network.topology.gpu.memory_bandwidth_bytes_per_s * speed
        # A reduction reads two operands and writes one; a copy reads one and writes one.
        self.reduce_bytes_per_s = memory / 3.0
        self.copy_bytes_per_s = memory / 2.0
        self._reducer: dict[tuple[int, ...], int] = {}
        self._reducing: tuple[list[int], dict[int, list[int]]] | None = None
        self.host_staged = host_staged_classes(network)
        """Link classes whose traffic NCCL stages through host memory here (see
        :func:`host_staged_classes`): a channel copying both ways over them is held to
        :data:`collsim.channel_rates.HOST_STAGED_GBPS`."""
        self.couplings = network.couplings
        """Shared capacities of cables short of full duplex: (link, direction, direction) ids."""

    def channel_payload_bytes_per_s(
        self,
        protocol: str,
        point_to_point: bool = False,
        both_ways: bool = False,
        flows_per_channel: int = 1,
    ) -> np.ndarray | None:
        """Payload bytes/s one NCCL channel of ``protocol`` moves per link class (nvlink, pci,
        net) on this system's GPUs (:mod:`collsim.channel_rates`); ``None``: no ceiling.
        ``both_ways``: the collective's ranks receive and send at once, so host-staged classes
        take the host-staged copy rate, shared by a channel's ``flows_per_channel`` flows."""
        return channel_payload_bytes_per_s(
            self.network.topology.gpu.model,
            protocol,
            point_to_point=point_to_point,
            host_staged=self.host_staged if both_ways else (),
            flows_per_channel=flows_per_channel,
        )

    def proxy_links(
        self, src: np.ndarray, dst: np.ndarray, ptr: np.ndarray, links: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """For point-to-point transfers ``src[i] -> dst[i]`` over the CSR routes ``(ptr,
        links)``: the proxy links each crosses (``(n, 2)``, its sender's and its receiver's;
        ``-1`` where its route crosses no NIC of a transport with a proxy cost) and the proxy's
        time for one message on its critical path (s, 0 there). ``None`` where no NIC has a
        proxy cost. Both engines add the links to the flow's route and the time to its step
        latency (:mod:`collsim.transports`, "The proxy's message rate")."""
        if self.proxy_first is None:
            return None
        message_s = route_overhead_s(self._proxy_s, ptr, links)
        on = message_s > 0
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        extra = np.stack((self.proxy_first + src, self.proxy_first + dst), axis=1)
        return np.where(on[:, None], extra, -1), message_s

    def route(self, src_rank: int, dst_rank: int) -> Route:
        """The route between two ranks' GPUs."""
        return self.network.route_index(
            int(self._gpu_index[src_rank]), int(self._gpu_index[dst_rank])
        )

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR ``(ptr, link_ids)`` and ``latency_s`` for each rank pair (computed once per pair)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        keys = src * self.nranks + dst
        unique, inverse = np.unique(keys, return_inverse=True)
        gpu = self._gpu_index
        starts, flat, latency = batch_routes(
            self.network, gpu[unique // self.nranks], gpu[unique % self.nranks]
        )
        ptr, links = _rows(starts, flat, inverse.reshape(-1))
        return ptr, links, latency[inverse.reshape(-1)]

    @property
    def multipath(self) -> bool:
        """Whether the fabric may split a flow over several paths (:meth:`paths`)."""
        return self.network.multipath is not None

    def paths(
        self, src: np.ndarray, dst: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every path of each rank pair (computed once per pair): ``pair_ptr`` (pair ``i``'s
        paths are ``pair_ptr[i]:pair_ptr[i + 1]``), each path's ``weight`` (its share of the
        bytes; a pair's sum to 1), CSR ``(ptr, link_ids)`` of each path, and ``latency_s`` per
        pair (its first path's: the route :meth:`routes` gives).
        See :mod:`collsim.topology.multipath`."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        keys = src * self.nranks + dst
        unique, inverse = np.unique(keys, return_inverse=True)
        inverse = inverse.reshape(-1)
        gpu = self._gpu_index
        pairs, weight, starts, flat, latency = batch_paths(
            self.network, gpu[unique // self.nranks], gpu[unique % self.nranks]
        )
        # Each distinct pair's paths once, then gathered per pair (as routes() gathers links).
        pair_ptr, rows = _rows(pairs, np.arange(int(pairs[-1])), inverse)
        ptr, links = _rows(starts, flat, rows)
        return pair_ptr, weight[rows], ptr, links, latency[inverse]

    def in_network(
        self, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """Flows up to a reducing switch every rank reaches, and down from it.

        The switch is the one with in-network reduction (NVLS NVSwitch, SHARP switch) whose
        farthest rank is nearest; routes to and from it follow the usual routing.
        """
        srcs_t, dsts_t, switch = self._reducer_for(srcs, dsts)
        ups, downs, latency = self._in_network_routes(srcs_t, dsts_t, switch)
        up_ptr, up_links = _csr(ups)
        down_ptr, down_links = _csr(downs)
        return up_ptr, up_links, down_ptr, down_links, latency

    def _in_network_routes(
        self, srcs_t: tuple[int, ...], dsts_t: tuple[int, ...], switch: int
    ) -> tuple[list[Route], list[Route], float]:
        """The up routes, down routes and latency of one in-network reduction."""
        net, gpu = self.network, self._gpu_index
        ups = [net.route_index(int(gpu[s]), switch) for s in srcs_t]
        downs = [net.route_index(switch, int(gpu[d])) for d in dsts_t]
        latency = (
            max((r.latency_s for r in ups), default=0.0)
            + float(net.device_latency_s[switch])
            + max((r.latency_s for r in downs), default=0.0)
        )
        return ups, downs, latency

    def in_network_many(self, groups: Sequence[tuple[Sequence[int], Sequence[int]]]) -> InNetwork:
        """:meth:`in_network` and :meth:`in_network_traffic` of many reductions at once (an
        NVLS+tree has two per node and slice: thousands at scale), as arrays; the routes found
        by the batch router (the per-pair router's, to the bit)."""
        n = len(groups)
        count, n_up = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        switch_of, share = np.zeros(n, dtype=np.int64), np.zeros(n)
        ends: list[int] = []  # each flow's GPU rank
        for g, (srcs, dsts) in enumerate(groups):
            srcs_t, dsts_t, switch = self._reducer_for(srcs, dsts)
            ends += srcs_t
            ends += dsts_t
            count[g], n_up[g], switch_of[g] = len(srcs_t) + len(dsts_t), len(srcs_t), switch
            share[g] = self._traffic(srcs_t, dsts_t, switch)
        group = np.repeat(np.arange(n), count)
        first = _ptr(count)[:-1]
        up = np.arange(group.size) - first[group] < n_up[group]
        gpu = self._gpu_index[np.asarray(ends, dtype=np.int64)]
        sw = switch_of[group]
        ptr, links, lat = batch_routes(self.network, np.where(up, gpu, sw), np.where(up, sw, gpu))
        latency = _group_max(lat, group, up, n) + self.network.device_latency_s[switch_of]
        latency = latency + _group_max(lat, group, ~up, n)
        return InNetwork(ptr, links, group, up, latency, share)

    def in_network_traffic(self, srcs: np.ndarray, dsts: np.ndarray) -> float:
        """Bytes each up and down flow of an in-network reduction carries per payload byte.

        An NVSwitch (NVLS) reduces what the GPUs load from it and multicasts what they store:
        each GPU loads its ``1/n`` share reduced and stores it back for every GPU, so each of
        its links carries ``S (1 + 1/n)`` each way, not ``S`` (NCCL's NVLS all-reduce; Jeaugey,
        nccl-tests PR 239: algbw = busbw x n/(n+1)); an InfiniBand SHARP tree moves ``S``. Both
        divided by the switch's ``in_network_efficiency`` (the rate its reductions reach).
        A reduction onto other ranks than its sources (NVLS+tree's reduce onto a node's head,
        its multicast from the head) moves the slice once each way: ``S``.
        """
        return self._traffic(*self._reducer_for(srcs, dsts))

    def _traffic(self, srcs_t: tuple[int, ...], dsts_t: tuple[int, ...], switch: int) -> float:
        dev = self.network.devices[switch]
        all_reduce = dev.kind == "nvswitch" and sorted(srcs_t) == sorted(dsts_t)
        share = 1.0 + 1.0 / max(1, len(srcs_t)) if all_reduce else 1.0
        return share / dev.in_network_efficiency

    def in_network_chunks(self, srcs: np.ndarray, dsts: np.ndarray, nbytes: int) -> int:
        """Chunks each of NCCL's NVLS channels moves one after another in an all-reduce of
        ``nbytes`` (:mod:`collsim.nvls`): each costs its channel one trip of the in-network
        route (the latency :meth:`in_network` returns) that its data does not overlap, which
        the engine and the analytic model both add to the reduction; for NVLS+tree's node
        reduce, the chunks of NCCL's NVLS+tree rule (charged once, on that stage). 0 for
        anything else (SHARP on InfiniBand switches, NVLS+tree's multicast)."""
        if self.nvls_all_reduce(srcs, dsts):
            channels = nvls_channels(self.network.topology.gpu.model)
            return nvls_chunks(int(nbytes), int(channels or 0), nvls_heads(len(srcs)))
        if self._nvls_node_reduce(srcs, dsts):
            topo = self.network.topology
            several = nvls_channels(topo.gpu.model, several_domains=True)
            nodes = topo.nvlink_domains
            return nvls_tree_chunks(int(nbytes), int(several or 0), nvls_heads(len(srcs)), nodes)
        return 0

    def _nvls_node_reduce(self, srcs: np.ndarray, dsts: np.ndarray) -> bool:
        """NVLS+tree's node reduce: a node's ranks reduced by its NVSwitch onto one of them
        (its head), on GPUs NCCL runs NVLS on."""
        srcs_t, dsts_t, switch = self._reducer_for(srcs, dsts)
        return (
            self.network.devices[switch].kind == "nvswitch"
            and len(dsts_t) == 1
            and len(srcs_t) > 1
            and dsts_t[0] in srcs_t
            and nvls_channels(self.network.topology.gpu.model) is not None
        )

    def nvls_all_reduce(self, srcs: np.ndarray, dsts: np.ndarray) -> bool:
        """Whether an in-network reduction of ``srcs`` to ``dsts`` is NCCL's NVLS all-reduce:
        the same ranks on both sides, an NVSwitch reducing, NVIDIA GPUs NCCL runs NVLS on. Its
        latency is NCCL's NVLS figure (:data:`collsim.nvls.NVLS_LATENCY_S`) and it pays
        :meth:`in_network_chunks` route trips, in the engine and the model alike."""
        srcs_t, dsts_t, switch = self._reducer_for(srcs, dsts)
        return (
            self.network.devices[switch].kind == "nvswitch"
            and sorted(srcs_t) == sorted(dsts_t)
            and nvls_channels(self.network.topology.gpu.model) is not None
        )

    def _reducer_for(
        self, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The ranks as tuples and the reducing switch they use (chosen once per group)."""
        srcs_t = tuple(int(s) for s in srcs)
        dsts_t = tuple(int(d) for d in dsts)
        key = tuple(sorted({*srcs_t, *dsts_t}))  # the switch depends on the ranks, not the roles
        if key not in self._reducer:
            self._reducer[key] = self._choose_reducer(srcs_t, dsts_t)
        return srcs_t, dsts_t, self._reducer[key]

    def _reducing_devices(self) -> tuple[list[int], dict[int, list[int]]]:
        """Devices that reduce in the network: those any GPU may reach, and each node's own
        NVSwitches (listed once: scanning every device per group was quadratic at scale)."""
        if self._reducing is None:
            shared: list[int] = []
            own: dict[int, list[int]] = {}
            for i, d in enumerate(self.network.devices):
                if not d.in_network_reduction:
                    continue
                if d.kind == "nvswitch" and d.node is not None:
                    own.setdefault(d.node, []).append(i)
                else:
                    shared.append(i)
            self._reducing = (shared, own)
        return self._reducing

    def _choose_reducer(self, srcs: tuple[int, ...], dsts: tuple[int, ...]) -> int:
        net = self.network
        # A node's own NVSwitch reaches that node's GPUs only (GPUs do not forward): skip the
        # other nodes' switches without routing to them (thousands of groups at scale).
        nodes = {net.devices[int(self._gpu_index[r])].node for r in (*srcs, *dsts)}
        shared, own = self._reducing_devices()
        candidates = shared + (own.get(next(iter(nodes)), []) if len(nodes) == 1 else [])
        best: tuple[int, str] | None = None
        chosen = -1
        for cand in candidates:
            try:
                hops = max(
                    [net.route_index(int(self._gpu_index[s]), cand).hops for s in srcs]
                    + [net.route_index(cand, int(self._gpu_index[d])).hops for d in dsts]
                )
            except TopologyError:  # this switch is out of some rank's reach
                continue
            score = (hops, net.devices[cand].name)
            if best is None or score < best:
                best, chosen = score, cand
        if chosen < 0:
            raise ScheduleError(
                "in-network reduction needs a switch with in_network_reduction that every rank "
                f"reaches; {net.topology.name} has none for these {len(set(srcs) | set(dsts))} "
                "ranks",
                field="algorithm",
                value="in_network",
            )
        return chosen


def _ptr(lengths: np.ndarray) -> np.ndarray:
    ptr = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    return ptr


def _rows(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR ``(ptr, idx)`` of only ``rows``, in that order (repeats allowed)."""
    lengths = ptr[1:][rows] - ptr[:-1][rows]
    out = _ptr(lengths)
    offsets = np.arange(int(out[-1]), dtype=np.int64) - np.repeat(out[:-1], lengths)
    return out, idx[np.repeat(ptr[:-1][rows], lengths) + offsets]


def _group_max(values: np.ndarray, group: np.ndarray, keep: np.ndarray, n: int) -> np.ndarray:
    """Per group (0..n-1) the largest of its kept ``values`` (0.0 where it has none)."""
    out = np.full(n, -np.inf)
    np.maximum.at(out, group[keep], values[keep])
    return np.where(np.isfinite(out), out, 0.0)


def _csr(routes: list[Route]) -> tuple[np.ndarray, np.ndarray]:
    lengths = [len(r.links) for r in routes]
    ptr = np.zeros(len(routes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    links = np.fromiter(
        (link for r in routes for link in r.links), dtype=np.int64, count=int(ptr[-1])
    )
    return ptr, links
