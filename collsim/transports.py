"""NCCL's network transports as data: the per-step overhead each adds and the fraction of a NIC's
line rate it attains.

NCCL reaches a NIC through a *net plugin*: ``net_ib`` (verbs, for InfiniBand and RoCE, GPUDirect
RDMA: the NIC reads and writes GPU memory and a CUDA kernel polls a flag), ``net_socket`` (kernel
TCP: a proxy thread on the host copies every chunk through the socket), or an external plugin
(aws-ofi-nccl over libfabric for EFA's SRD and for HPE Slingshot's CXI provider; Google's
GPUDirect-TCPX/TCPXO plugins). NCCL's tuner knows each only by the ``latency`` property the plugin
reports, which ``ncclTopoTuneModel`` adds to its inter-node step latency, twice for Simple (the
receive's flush), in NVIDIA/nccl ``src/graph/tuning.cc``::

    float interLat = hwLat[NCCL_HW_NET][algo][proto];
    interLat += graphs[a]->latencyInter;                  // search.cc: = the plugin's latency
    if (p == NCCL_PROTO_SIMPLE) interLat += graphs[a]->latencyInter;

``net_ib`` and ``net_socket`` report 0 (``src/transport/net_ib.cc``, ``net_socket.cc``):
NCCL's ``hwLat`` network row (2.7 / 4.0 / 14 us for LL / LL128 / Simple) was measured on IB
verbs with GPUDirect RDMA, where the proxy only posts work requests and the NIC moves the data.
A host-driven transport pays more per step: the proxy thread posts each send, polls a completion
queue (libfabric's ``fi_cq_read`` for EFA and CXI) or copies through the kernel (sockets), and
only then flags the GPU. collsim charges that as :attr:`Transport.step_overhead_s`: added to the
step latency (``max(route, hwLat)``, :func:`collsim.protocols.step_latency_s`) of every transfer
whose route crosses a NIC of that transport, Simple twice as NCCL's rule has it. The figures are
*not* the plugins' reported latencies, which are tuning knobs (aws-ofi-nccl reports 75 us on
p4d/p5 and 150 us on p3dn, ``src/platform-aws.cpp``, to push NCCL's tuner towards rings), but
measured minus predicted step time in the bundled logs, one constant per transport fitted across
every system of that transport (docs/architecture.md lists the fit and its leave-one-system-out
error).

:attr:`Transport.bandwidth_fraction` scales the capacity of the cables at a NIC of that
transport (the endpoint's attainable rate; switch-to-switch cables keep their line rate): 1.0 for
verbs, whose GPUDirect RDMA writes reach line rate; below it where the data logs show a
transport tops out (each figure says which logs).

The transport of a NIC is its ``node.nics.transport`` in the topology file, else the default for
its link kind (:data:`DEFAULT_TRANSPORT`). Intra-node link kinds have none.

**The proxy's message rate for point to point.** NCCL moves a send or receive over the network
in chunks of ``NCCL_P2P_NET_CHUNKSIZE`` (128 KiB by default, ``src/init.cc``
``computeBuffSizes``: ``p2pChunkSize`` on more than one node; ``src/proxy.cc``
``ncclProxyComputeP2p``: one network message per step of that size), and one proxy thread per
GPU progresses every channel and peer of that GPU, sends and receives alike, one message after
another (``src/transport/net.cc`` ``sendProxyProgress``/``recvProxyProgress``: ``isend``/``irecv``
and ``test`` per step). Where the plugin's per-message work is large the thread, not the NIC,
sets the rate: :attr:`Transport.proxy_message_us` is that time per message, so each GPU's
proxy moves at most ``P2P_NET_CHUNK_BYTES / proxy_message_us`` bytes/s of point-to-point
traffic, its network sends and receives together (:attr:`Transport.proxy_bytes_per_s`). Both
engines make it a capacity of its own per GPU (a link every network point-to-point flow of
that GPU crosses, at its sender and at its receiver, shared max-min; ``TopologyFabric``), and
every such transfer waits one message's proxy time before its first byte moves (the critical
path part, added to its step latency). Collectives' network steps (512 KiB, ``BUFFSIZE / 8``)
are left as they were: the figures come from point-to-point logs only. Only ``cxi_swmatch``
(Slingshot run with the provider's software receive matching, as on ALCF Polaris) has one; 0
(no limit) where no source or log gives a figure: verbs (IB, RoCE), EFA, sockets, and CXI with
the default hardware matching (GH200 Slingshot nodes reach ~24 GB/s point to point a GPU,
NVIDIA/nccl#1272).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

_US = 1e-6

P2P_NET_CHUNK_BYTES = 128 * 1024
"""NCCL's point-to-point network chunk, ``NCCL_P2P_NET_CHUNKSIZE`` (``src/init.cc``, 1 << 17, the
same from v2.12 to v2.29): one proxy message per chunk."""

FLUSH_STEP_BYTES = 512 * 1024
"""Bytes of one Simple network step, the unit NCCL flushes: its Simple buffer (4 MiB,
``DEFAULT_BUFFSIZE`` / ``NCCL_BUFFSIZE``) over ``NCCL_STEPS`` (8) slots (``stepSize =
buffSize / NCCL_STEPS``, src/transport/net.cc); the tree's chunk is one step."""

PROTOCOL_INDEX = {"ll": 0, "ll128": 1, "simple": 2}
"""Row of :attr:`Transport.step_overhead_s` for each protocol name (lower case)."""


@dataclass(frozen=True)
class Transport:
    """One net transport: its per-step overhead and attainable fraction of the NIC's rate.

    ``latency_us`` is the per-network-step overhead for LL and LL128; Simple pays it twice
    (NCCL's tuning.cc rule for the plugin latency, the receive's flush). ``source`` says where
    each figure comes from."""

    name: str
    latency_us: float
    bandwidth_fraction: float
    source: str
    flush_us: float = 0.0
    """What one GPUDirect receive flush costs, serially, on the receiving channel: the time NCCL's
    proxy holds a Simple network receive step back from the GPU while the plugin's loopback read
    of the received buffer completes (:data:`FLUSH_STEP_BYTES` per step; whether a receive is
    flushed at all is :func:`collsim.model.nccl_release.receive_flush`); 0: a flush this
    transport does not serialise with the step (or has none)."""
    connection_fraction: float = 1.0
    """The fraction of the NIC's line rate one NCCL connection (one channel's sends to one peer)
    attains on its own; 1: one connection fills the NIC. Where it is below 1 a NIC direction
    needs several connections at once to fill; what that costs NCCL's tree all-reduce, whose
    releases differ in how many they run at once, is
    :func:`collsim.model.nccl_release.tree_nic_share`."""
    proxy_message_us: float = 0.0
    """The proxy thread's time per point-to-point network message (a send or a receive of one
    ``P2P_NET_CHUNK_BYTES`` chunk), us; 0: the proxy sets no limit (see the module doc)."""

    @property
    def proxy_bytes_per_s(self) -> float:
        """Point-to-point bytes/s one GPU's proxy moves, sends and receives together; ``inf``
        where the transport has no per-message figure."""
        if self.proxy_message_us <= 0:
            return float("inf")
        return P2P_NET_CHUNK_BYTES / (self.proxy_message_us * _US)

    @property
    def flush_s_per_byte(self) -> float:
        """The flush's serial cost per payload byte of a flushed Simple network receive."""
        return self.flush_us * _US / FLUSH_STEP_BYTES

    @property
    def step_overhead_s(self) -> tuple[float, float, float]:
        """Overhead per network step for (LL, LL128, Simple), seconds."""
        lat = self.latency_us * _US
        return (lat, lat, 2.0 * lat)


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport(
            "ib_verbs",
            0.0,
            1.0,
            "NCCL net_ib (InfiniBand and RoCE verbs, GPUDirect RDMA): reports latency 0 "
            "(src/transport/net_ib.cc); NCCL's hwLat network row was measured on it. IB and RoCE "
            "logs land at 0.81-1.04x measured at small sizes without any extra",
        ),
        Transport(
            "socket",
            35.0,
            0.32,
            "NCCL net_socket (kernel TCP; a proxy thread copies each chunk through the socket, "
            "NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS streams): reports latency 0 to the "
            "tuner. Fitted on the one socket log, aws-eks-2n1g-socket (2 ranks): 30 and 40 us per "
            "network step give 10.1% and 10.5% MAPE (grid 0-60 by 10); busbw at >= 256 MiB 0.32 "
            "of the 50 Gb/s port (2.0 GB/s), near the 0.36-0.42 of a 100 GbE port published in "
            "NVIDIA/nccl#450 (all_reduce busbw 4.5-5.2 GB/s with NCCL_SOCKET_NTHREADS=2)",
        ),
        Transport(
            "efa",
            60.0,
            1.0,
            "aws-ofi-nccl over libfabric's efa provider on EFA devices with RDMA read and "
            "GPUDirect RDMA (p4d, p4de and later): the NIC reads and writes GPU memory, but the "
            "proxy still posts each send and receive through the provider and polls its "
            "completion queue (fi_cq_read), which IB verbs leave to the NIC and a GPU flag. 60 us "
            "per step, measured across the three GPUDirect EFA logs (two systems, three "
            "software stacks), each on its own best at 50-70 us on the mean error at <= 1 MiB "
            "(p4d 2.9.9: 51.3% at 20 us, 18.7% at 60; p4d 2.8.3: 50.9, 21.4; p4de: 39.8, 10.0; "
            "together 47.3 at 20, 19.2 at 50, 16.7 at 60, 18.8 at 70, 22.6 at 80 us); held out, "
            "p4d alone (60 us) predicts p4de at 10.0% and p4de alone (50-60 us) p4d at 19-25%. "
            "The raw logs say as much: an 8-byte all-reduce on two nodes (a tree: two network "
            "steps) takes 161-179 us on p4d/p4de but 58 us on host-staged p3dn "
            "(v100-32g-aws-2n, efa_host). 20 us, the constant fitted across every EFA log "
            "before host-staged EFA had its own entry, was the two datapaths averaged. "
            "(aws-ofi-nccl reports 75 us to NCCL's tuner on p4d, src/platform-aws.cpp since "
            "d87d61e0, 2023, a tuning knob.) p5 inherits 60 us with no log of its own. The "
            "engine/model gap of the "
            "partly filled tree pipeline recorded in tests/model/agreement_exceptions.json "
            "grows (p4d and p4de 4 MiB 7.8% -> 15.0%, 64 MiB 1.0% -> 2.4%; p5 64 MiB 1.8% -> "
            "4.1%): the file is regenerated by the maintainers. "
            "Bandwidth at the line rate. "
            "One connection (one channel's sends to one peer: an aws-ofi-nccl send comm on the "
            "process's one endpoint per NIC, v1.1.x src/nccl_ofi_net.c) attains 0.5 of it: "
            "first-generation EFA, one libfabric RDM endpoint pair, fi_rdm_tagged_bw 6.9 GB/s = "
            "0.55 of 100 Gb/s, two endpoint pairs the line rate (c5n, ofiwg/libfabric#5694, "
            "amzn/amzn-drivers#124, 2020); p4d's NCCL 2.9.9 tree, one connection per NIC "
            "direction at a time, 0.47 (a100-p4d-efa-2n-all_reduce-1, 4 GiB). Two connections "
            "fill a NIC, as rings and NCCL >= 2.10 trees run on p4d/p4de (8 channels, 4 NICs). "
            "A flushed receive (aws-ofi-nccl's fi_read of the received GPU buffer, v1.1.x "
            "src/nccl_ofi_net.c ofi_iflush) holds each 512 KiB Simple step 27.7 us in series: "
            "a100-p4d-efa-2n-all_reduce-2 (NCCL 2.8.3, flushing) minus -1 (2.9.9, its plugin "
            "set OFI_NCCL_GDR_FLUSH_DISABLE=1), 28.4 / 30.1 / 27.7 us per step at 256 MiB / "
            "512 MiB / 1 GiB; one pair of logs, no datasheet figure",
            flush_us=27.7,
            connection_fraction=0.5,
        ),
        Transport(
            "efa_host",
            15.0,
            0.5,
            "aws-ofi-nccl over libfabric's efa provider on EFA devices without RDMA and without "
            "GPUDirect RDMA (first-generation EFA on p3dn, g4dn, c5n): NCCL stages every chunk in "
            "host memory (the kernel copies GPU -> pinned host buffer, the NIC reads it; the "
            "reverse on receive), and the provider's RDM endpoint, with no RDMA read to pull a "
            "long message, segments it into SRD sends of at most the ~8 KiB MTU and reassembles "
            "them in host bounce buffers on the proxy thread (libfabric fi_efa(7), v1.12: RDM "
            "endpoint segmentation and reassembly; DGRAM MTU ~8 KiB; RDMA read only on the "
            "devices that have it, FI_EFA_USE_DEVICE_RDMA). Bandwidth: 0.5 of the line rate, "
            "measured across the two host-staged EFA logs with rows >= 256 MiB: g4dn "
            "aws-eks-2n1g-efa (ring, 2.83 GB/s busbw = 0.45 of 50 Gb/s) and p3dn "
            "v100-32g-aws-2n (tree, 0.61 of the tree's bound on 100 Gb/s); 0.5 puts both within "
            "15% (+10%, -15%). Per-step overhead 15 us: grid 10-60 us (by 5 to 20, then 10) "
            "on the mean error at <= 1 MiB over its three logs (g4dn, both p3dn): 26.8% at 10, "
            "22.5% at 15, 27.7% at 20 us",
        ),
        Transport(
            "cxi",
            20.0,
            0.73,
            "HPE Slingshot 11 (Cassini) through aws-ofi-nccl over libfabric's cxi provider. "
            "Fitted on ALCF Polaris 2 and 8 nodes, all_reduce, all_gather and alltoall, on the "
            "mean error at <= 1 MiB: 20 us (grid 0-30 by 5); the tree's all_reduce alone would "
            "take ~10 us, the ring's all_gather ~25 us, the same at 2 and 8 nodes. Busbw tops out "
            "at 36.5 GB/s = 0.73 of two 200 Gb/s NICs for all_reduce and all_gather at 2, 8, 256 "
            "and 540 nodes",
        ),
        Transport(
            "tcpxo",
            40.0,
            0.85,
            "GCP GPUDirect-TCPXO plugin (A3 Mega: NIC-offloaded transport, a receive-side "
            "host-driven datapath). Fitted on h100-a3mega-tcpxo-2n all_reduce: 40 us per network "
            "step (grid 0-60 by 10, MAPE 36.6% -> 12.2%); bandwidth 0.85 of 8 x 200 Gb/s from "
            "the a3-mega all_reduce and all_gather at >= 256 MiB",
        ),
        Transport(
            "tcpx",
            40.0,
            0.5,
            "GCP GPUDirect-TCPX plugin (A3 High: kernel TCP with GPU-memory receive, 4 x 200 Gb/s)"
            ". "
            "Per-step overhead assumed as TCPXO's (no small-size log); bandwidth 0.5 of the NICs "
            "from h100-gcp-a3high-tcpx-2n all_gather at >= 256 MiB",
        ),
    )
}
"""Every transport collsim knows, by the name a topology's ``node.nics.transport`` gives."""

TRANSPORTS["cxi_swmatch"] = replace(
    TRANSPORTS["cxi"],
    name="cxi_swmatch",
    source=TRANSPORTS["cxi"].source
    + ". cxi_swmatch: the same, run with FI_CXI_RX_MATCH_MODE=software (the provider matches "
    "every receive on the host; alcf-nccl-tests setup 5, ALCF Polaris), where the proxy sets "
    "the point-to-point rate: 13.7 us per 128 KiB message (a send or a receive), measured "
    "across the Polaris alltoall logs at 2 and 8 nodes, where each GPU's network sends and "
    "receives together move 9.68 / 9.72 GB/s (2 nodes, 1 GiB / 512 MiB: 13.5 us a message) "
    "and 9.43 / 9.31 (8 nodes: 13.9 / 14.1 us), ~9.5 GB/s a NIC a direction at every scale "
    "where the same NICs carry 18.25 for the ring collectives. No source gives the provider's "
    "per-message time. Not on plain cxi: GH200 nodes on Slingshot 11 (one NIC a GPU, "
    "NVIDIA/nccl#1272) reach 24.2 GB/s sendrecv busbw a GPU with 2-4 channels a peer, "
    "2.5 times what 13.7 us a message allows",
    proxy_message_us=13.7,
)

DEFAULT_TRANSPORT: dict[str, str] = {
    "infiniband": "ib_verbs",
    "roce": "ib_verbs",
    "efa": "efa",
    "slingshot": "cxi",
    "ethernet": "socket",
}
"""The transport NCCL uses on a NIC of each scale-out link kind unless the topology says another:
verbs on IB and RoCE, aws-ofi-nccl on EFA and Slingshot, kernel sockets on plain Ethernet."""


def transport_for(link_kind: str, override: str = "") -> Transport | None:
    """The transport of a NIC whose cable is ``link_kind`` (``override`` wins where given); None
    for intra-node kinds."""
    if override and link_kind in DEFAULT_TRANSPORT:
        return TRANSPORTS[override]
    name = DEFAULT_TRANSPORT.get(link_kind)
    return TRANSPORTS[name] if name is not None else None


def route_overhead_s(per_link_s: np.ndarray, ptr: np.ndarray, links: np.ndarray) -> np.ndarray:
    """Each CSR route's transport overhead: the largest of its links' (a route crosses one
    transport's NICs; 0 for empty routes)."""
    lengths = np.diff(np.asarray(ptr, dtype=np.int64))
    out = np.zeros(lengths.shape[0])
    nonempty = lengths > 0
    if nonempty.any() and per_link_s.size:
        out[nonempty] = np.maximum.reduceat(
            per_link_s[np.asarray(links, dtype=np.int64)], np.asarray(ptr)[:-1][nonempty]
        )
    return out


def append_links(
    ptr: np.ndarray, links: np.ndarray, extra: np.ndarray, values: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows ``(ptr, links)`` with row ``i``'s ``extra[i]`` link ids (``-1``: none) added
    after its own: how both engines put a point-to-point flow through its GPUs' proxies.
    ``values`` (shaped as ``extra``): what to add in their place (a per-link figure of the rows,
    such as a route's share), in ``links``' dtype."""
    ptr = np.asarray(ptr, dtype=np.int64)
    links = np.asarray(links)
    extra = np.asarray(extra, dtype=np.int64).reshape(ptr.shape[0] - 1, -1)
    n = extra.shape[0]
    old = np.diff(ptr)
    keep = extra >= 0
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(old + keep.sum(axis=1), out=out[1:])
    merged = np.empty(int(out[-1]), dtype=links.dtype)
    pos_old = np.repeat(out[:-1], old) + (np.arange(links.shape[0]) - np.repeat(ptr[:-1], old))
    merged[pos_old] = links
    pos_new = (out[:-1] + old)[:, None] + np.cumsum(keep, axis=1) - 1
    new = extra if values is None else np.asarray(values).reshape(extra.shape)
    merged[pos_new[keep]] = new[keep]
    return out, merged
