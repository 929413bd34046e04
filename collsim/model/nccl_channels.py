"""How many channels NCCL runs on a system: the channel count the tuner offers as NCCL's choice.

Every channel has a rate ceiling (:mod:`collsim.channel_rates`), so the count decides how much of
a port a collective can fill. NCCL settles it at init, from its topology search; this module
follows the same steps on a collsim topology (NVIDIA/nccl ``master`` of 2026-06):

1. **Search** (``src/graph/search.cc``, ``ncclTopoCompute``): try per-channel bandwidths from the
   generation's speed array (``speedArrayIntra`` / ``sm90SpeedArrayIntra`` /
   ``sm100SpeedArrayIntra`` inside one node, the ``...Inter`` arrays across nodes), fastest
   first, and keep the most ``channels x speed`` that fits: inside a node every channel crosses
   every GPU, so ``channels x speed <= GPU bandwidth`` (NCCL's figure: NVLink links x
   ``SMxx_NVLINK_BW`` of ``topo.h``, 20-20.6 GB/s per 25 GB/s NVLink, 40.1 per 50 GB/s NVLink5;
   PCIe at 3/4 of its datasheet rate, Gen3 x16 = ``PCI_BW`` 12); across nodes also
   ``floor(NIC / speed)`` channels per NIC. At most ``MAXCHANNELS / 2`` = 32 channels; a slower
   speed is tried only while it is above 0.49 of the best one's, and the search stops once it
   fills the GPU.
2. **Duplicate** (``ncclTopoDupChannels``): twice the channels at half the speed, unless the
   speed is under 25 GB/s, or on Hopper and later under 50 GB/s with more than 4 channels.
3. **Postset** (``src/graph/connect.cc``, ``ncclTopoPostset``): twice the channels again (at most
   ``MAXCHANNELS`` = 64); on Hopper and later across nodes, twice more while under 16 channels
   with a speed above 45 GB/s.

That gives 24 channels in one DGX A100 (6 x 40 GB/s -> 12 x 20 -> 24, as the bundled superbench
log's ``Channel 23/24`` shows) and in one DGX H100 (6 x 60 -> 12 x 30 -> 24), 16 across DGX
H100 or DGX A100 nodes (a channel per NIC, doubled), 2 on a PCIe-only server (``2 coll
channels`` in the bundled A100 PCIe logs), 32 on an HGX B200.

**Point to point** (``src/graph/paths.cc``, ``ncclTopoComputeP2pChannels``): ``p2pnChannels`` is
the collective count rounded up to a power of two; each peer gets ``p2pnChannelsPerPeer``: the
fewest over the communicator's peers of 2 x NVLinks to an NVLink peer, 2 to a PCIe peer,
``max(NICs, ceil(NIC GB/s / P2P_PER_CHANNEL_NET_BW))`` to a network peer (14 GB/s per channel,
:data:`collsim.channel_rates.P2P_NET_GBPS`), rounded up to a power of two and at most
``p2pnChannels``; across nodes halved while ``per peer x ceil(ranks / 8)`` (8 peers per work
batch, ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH``) exceeds ``p2pnChannels``: fewer channels per peer as
the peers grow. ``sendrecv`` runs on the per-peer count, ``alltoall`` on ``p2pnChannels``
spread over its peers (:mod:`collsim.collectives.alltoall`).

Non-NVIDIA accelerators have no NCCL channels: :data:`FALLBACK_CHANNELS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collsim.channel_rates import P2P_NET_GBPS, nvidia_compute_capability
from collsim.topology.graph import Network
from collsim.topology.spec import Topology

SPEEDS_INTRA = {
    "pre90": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "sm90": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "sm100": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
"""``search.cc`` ``speedArrayIntra`` / ``sm90SpeedArrayIntra`` / ``sm100SpeedArrayIntra`` (GB/s)."""
SPEEDS_INTER = {
    "pre90": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
              3.0, 2.4, 1.2, 0.24, 0.12),
    "sm90": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
             1.2, 0.24, 0.12),
    "sm100": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0,
              6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}  # fmt: skip
"""``search.cc`` ``speedArrayInter`` / ``sm90SpeedArrayInter`` / ``sm100SpeedArrayInter`` (GB/s)."""

MAXCHANNELS = 64
"""``src/include/device.h``; the ring search takes at most half (``init.cc``)."""
P2P_PEERS_PER_BATCH = 8
"""``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` (``src/include/device.h``)."""
FALLBACK_CHANNELS = 8
"""Channels offered where NCCL's count does not apply (non-NVIDIA accelerators, no GPU links)."""

NVLINK_NCCL_PER_DATASHEET = {70: 20.0 / 25.0, 80: 20.0 / 25.0, 86: 12.0 / 14.0625,
                             90: 20.6 / 25.0, 100: 40.1 / 50.0}  # fmt: skip
"""NCCL's NVLink bandwidth per link (``topo.h`` ``SMxx_NVLINK_BW``) over the datasheet's per
direction (25 GB/s NVLink 2-4, 14.06 GB/s an RTX 3090 bridge link, 50 GB/s NVLink5)."""
PCIE_NCCL_PER_DATASHEET = 0.75
"""NCCL's PCIe figure over the datasheet rate (``PCI_BW`` 12 GB/s for Gen3 x16's 16)."""


@dataclass(frozen=True)
class NcclChannels:
    """NCCL's channel counts on one system."""

    collective: int
    """``comm->nChannels``: what rings and trees run on."""
    p2p: int
    """``p2pnChannels``: the channels point-to-point operations spread over."""
    p2p_per_peer: int
    """``p2pnChannelsPerPeer``: the channels one peer's send or receive runs on."""

    def for_collective(self, collective: str) -> int:
        """The channel count NCCL runs ``collective`` on."""
        if collective == "sendrecv":
            return self.p2p_per_peer
        if collective == "alltoall":
            return self.p2p
        return self.collective


def _family(cc: int) -> str:
    return "sm100" if cc >= 100 else "sm90" if cc >= 90 else "pre90"


def inter_speeds(cc: int) -> tuple[float, ...]:
    """The speeds (GB/s per channel) NCCL's search tries across nodes on compute capability
    ``cc``, fastest first (``search.cc`` ``speedArrayInter`` and its sm90/sm100 variants)."""
    return SPEEDS_INTER[_family(cc)]


def _search(total: float, speeds: tuple[float, ...], per_speed) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """NCCL's search loop: the (channels, speed) with the most ``channels x speed``."""
    best_n, best_bw = 0, 0.0
    for sp in speeds:
        if best_n and sp / best_bw <= 0.49:
            break
        n = min(MAXCHANNELS // 2, per_speed(sp))
        if n * sp > best_n * best_bw * (1 + 1e-9):
            best_n, best_bw = n, sp
        if best_n * best_bw >= total * (1 - 1e-9):
            break
    return best_n, best_bw


def _nvlink_ratio(cc: int) -> float:
    return NVLINK_NCCL_PER_DATASHEET.get(cc, NVLINK_NCCL_PER_DATASHEET[min(100, cc // 10 * 10)])


@dataclass(frozen=True)
class NcclGraph:
    """NCCL's ring graph on one system after its search and ``ncclTopoDupChannels``: what
    ``ncclTopoTuneModel`` reads as ``graph->nChannels`` and ``graph->bwIntra`` (= ``bwInter``
    for a ring), before ``ncclTopoPostset`` doubles the channels the kernels run on."""

    channels: int
    """``graph->nChannels``."""
    speed_gbps: float
    """``graph->bwIntra`` = ``graph->bwInter`` of the ring: GB/s per channel."""
    intra_gbps: float
    """What NCCL counts a GPU's intra-node links at (GB/s, its ``total`` in the search): the
    ceiling on ``channels x bwIntra`` of any graph; 0 with one GPU per node."""


def nccl_graph(topology: Topology, network: Network | None = None) -> NcclGraph | None:
    """NCCL's ring graph on ``topology`` (see the module doc, steps 1 and 2); None where NCCL's
    channels do not apply (non-NVIDIA accelerators, no GPU links)."""
    cc = nvidia_compute_capability(topology.gpu.model)
    net = network or Network(topology)
    gpu_bw = net.intra_bandwidth_bytes_per_s() / 1e9
    if cc is None or (gpu_bw <= 0 and topology.nvlink_domains == 1):
        return None
    nvlink = gpu_links_nvlink(net)
    total = gpu_bw * (_nvlink_ratio(cc) if nvlink else PCIE_NCCL_PER_DATASHEET)
    family = _family(cc)
    multi = topology.nvlink_domains > 1
    nics, nic_gbps = _nics(net) if multi else (0, 0.0)
    if multi and nics:

        def fits(sp: float) -> int:
            per_nic = int(nic_gbps / sp + 1e-9)
            return min(nics * per_nic, int(total / sp + 1e-9)) if total > 0 else nics * per_nic

        n, sp = _search(total if total > 0 else nics * nic_gbps, SPEEDS_INTER[family], fits)
    else:
        n, sp = _search(total, SPEEDS_INTRA[family], lambda s: int(total / s + 1e-9))
    n = max(n, 1)
    if sp >= 25.0 and not (cc > 80 and sp < 50.0 and n > 4):  # ncclTopoDupChannels
        doubled = min(2 * n, MAXCHANNELS // 2)
        sp /= math.ceil(doubled / n)
        n = doubled
    return NcclGraph(n, sp, float(total))


def nccl_channels(topology: Topology, network: Network | None = None) -> NcclChannels:
    """NCCL's channel counts on ``topology`` (see the module doc)."""
    net = network or Network(topology)
    graph = nccl_graph(topology, net)
    cc = nvidia_compute_capability(topology.gpu.model)
    if graph is None or cc is None:
        return NcclChannels(FALLBACK_CHANNELS, FALLBACK_CHANNELS, FALLBACK_CHANNELS)
    gpu_bw = net.intra_bandwidth_bytes_per_s() / 1e9
    nvlink = gpu_links_nvlink(net)
    multi = topology.nvlink_domains > 1
    gpu_nics = len(net.nics_of(net.gpu_names[0])) if multi else 0
    gpu_net_gbps = net.injection_bandwidth_bytes_per_s() / 1e9 if multi else 0.0
    n, sp = graph.channels, graph.speed_gbps
    n = min(MAXCHANNELS, 2 * n)  # ncclTopoPostset
    if cc >= 90 and multi and sp > 45.0 and n < 16:
        n = 2 * n
    p2p = 1 << (n - 1).bit_length()
    per_peer = _per_peer(net, cc, nvlink, gpu_bw, gpu_nics, gpu_net_gbps, p2p)
    if multi:
        peers = math.ceil(topology.n_gpus / P2P_PEERS_PER_BATCH)
        while per_peer * peers > p2p and per_peer > 1:
            per_peer //= 2
    return NcclChannels(n, p2p, per_peer)


def _per_peer(
    net: Network, cc: int, nvlink: bool, gpu_bw: float, nics: int, net_gbps: float, p2p: int
) -> int:
    """``ncclTopoGetNchannels``'s fewest over the peers, a power of two, at most ``p2p``: a
    network peer gets ``max(NICs, ceil(GB/s / 14))`` for the GPU's NICs (``nics``) and what it
    can send through them (``net_gbps``)."""
    counts = []
    if net.topology.nvlink_domain_gpus > 1:
        if nvlink:  # links to the nearest peer: on an NVSwitch all of the GPU's
            links = gpu_bw * _nvlink_ratio(cc) / (_nvlink_ratio(cc) * _datasheet_link(cc))
            counts.append(2 * max(1, int(links + 1e-9)))
        else:
            counts.append(2)
    if nics:
        counts.append(max(nics, math.ceil(net_gbps / P2P_NET_GBPS - 1e-9)))
    per_peer = min(counts) if counts else 2
    return min(p2p, 1 << (per_peer - 1).bit_length())


def _datasheet_link(cc: int) -> float:
    """One NVLink's datasheet GB/s per direction on a generation."""
    return 50.0 if cc >= 100 else 14.0625 if cc == 86 else 25.0


def gpu_links_nvlink(net: Network) -> bool:
    """Whether the first GPU's links to its node's GPUs are NVLink-class (not PCIe)."""
    gpu = net.gpu_names[0]
    for lk in net.topology.links:
        if gpu in (lk.a, lk.b):
            other = net.devices[net.index[lk.b if lk.a == gpu else lk.a]]
            if other.kind in ("gpu", "nvswitch"):
                return True
    return False


def _nics(net: Network) -> tuple[int, float]:
    """(NICs of an NCCL node, GB/s of each): the distinct NICs its GPUs leave through, sharing
    the node's injection bandwidth."""
    topo = net.topology
    first = topo.gpus[: topo.nvlink_domain_gpus]
    nics = {nic for g in first for nic in net.nics_of(g.name)}
    if not nics:
        return 0, 0.0
    node_gbps = net.injection_bandwidth_bytes_per_s() * len(first) / 1e9
    return len(nics), node_gbps / len(nics)
