"""Reading NCCL-style summary figures off a collsim topology: per-GPU intra-node and network
bandwidth and whether GPUs talk over NVLink. Used by the NCCL baseline (``nccl.py``) and to pick
the tuner's channel counts.
"""

from __future__ import annotations

import numpy as np

from collsim.protocols import HW_NVLINK
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.spec import Topology


def _shared_bottleneck(fabric: TopologyFabric, src: np.ndarray, dst: np.ndarray) -> float:
    """The smallest per-flow share when the flows ``src -> dst`` all run (capacity / users)."""
    ptr, links, _ = fabric.routes(src, dst)
    links = np.asarray(links, dtype=np.int64)
    if links.size == 0:
        return 0.0
    users = np.bincount(links, minlength=len(fabric.capacity_bytes_per_s))
    share = np.asarray(fabric.capacity_bytes_per_s)[links] / users[links]
    lengths = np.diff(ptr)
    return float(np.minimum.reduceat(share, ptr[:-1][lengths > 0]).min())


def intra_inter_bandwidth(
    topology: Topology, fabric: TopologyFabric | None = None
) -> tuple[float, float, bool]:
    """(intra-node bytes/s per GPU, network bytes/s per GPU, intra-node is NVLink-class).

    Intra: every GPU of node 0 sends to the next GPU of its node at once (a ring's intra edges);
    inter: every GPU of node 0 sends to the same local GPU of node 1 at once (the rail), each
    flow's bottleneck share. 0 where the system has one GPU per node / one node. A node is
    NCCL's: a server, or a multi-node NVLink domain.
    """
    fabric = fabric or TopologyFabric(Network(topology))
    # NCCL's node: a server, or a whole multi-node NVLink domain (its clique)
    g, nodes = topology.nvlink_domain_gpus, topology.nvlink_domains
    local = np.arange(g, dtype=np.int64)
    intra = inter = 0.0
    nvlink = False
    if g > 1:
        intra = _shared_bottleneck(fabric, local, (local + 1) % g)
        _, links, _ = fabric.routes(local[:1], local[1:2])
        nvlink = bool(np.asarray(fabric.link_kind)[np.asarray(links)].max() == HW_NVLINK)
    if nodes > 1:
        peers = local[: topology.n_gpus - g]  # the next node may be a partial domain
        inter = _shared_bottleneck(fabric, peers, peers + g)
    if g == 1:
        intra = inter
    return intra, inter, nvlink
