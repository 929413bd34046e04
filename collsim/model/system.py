"""One topology ready to be timed: its routes, the engine's fabric over them and the ranks' layout.

The cost models (:class:`~collsim.model.analytic.AnalyticModel`) read a system through this
class; :class:`collsim.whatif.WhatIf` extends it with the cost models themselves and the engine,
so the model floor never needs the what-if facade above it.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.layout import RankLayout
from collsim.collectives.registry import algorithms_for, needs_in_network
from collsim.topology.fabric import TopologyFabric
from collsim.topology.graph import Network
from collsim.topology.rings import mesh_rings
from collsim.topology.spec import Topology

DIRECT_MAX_RANKS = 64
"""Largest rank count for which ``auto`` considers one-shot ``direct`` reductions/gathers."""


def layout_for(topology: Topology) -> RankLayout:
    """Ranks on the topology's nodes; a (nodes x GPUs-per-node) grid for 2D algorithms; on
    point-to-point meshes, per-channel ring orders inside nodes (:func:`mesh_rings`).

    In a multi-node NVLink domain (GB200 NVL72) the layout's node is the domain, not the tray:
    NCCL with multi-node NVLink puts the ranks of one NVLink clique in one node of its topology
    (rings and trees leave it through the NICs, NVLS runs inside it), so hierarchical
    algorithms, rails and channel entries span the domain's GPUs; the last domain may be
    partial (18 + 14 trays)."""
    n = topology.n_gpus
    per_node = topology.nvlink_domain_gpus
    nodes = topology.nvlink_domains
    grid = (nodes, per_node) if nodes > 1 else None
    if grid is not None and grid[0] * grid[1] != n:
        grid = None
    rpn = min(per_node, n)
    rings = mesh_rings(topology) if rpn == topology.gpus_per_node else None
    return RankLayout(nranks=n, ranks_per_node=rpn, grid=grid, local_rings=rings)


class System:
    """One topology with its routes (cached across calls), fabric and rank layout."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.network = Network(topology)
        self.fabric = TopologyFabric(self.network)
        self.layout = layout_for(topology)
        self.has_in_network = topology.reduces_for_all_gpus

    def candidates(self, collective: str) -> list[str]:
        """Algorithms ``auto`` considers for ``collective`` on this topology.

        One-shot ``direct`` reductions and gathers (every rank to every rank) are considered up to
        :data:`DIRECT_MAX_RANKS` ranks only: they are NVSwitch-domain algorithms, and their n^2
        flows make them both useless and expensive to cost at cluster scale. (All-to-all's
        ``direct`` is the all-to-all itself and always a candidate.)
        """
        algos = list(algorithms_for(collective))
        if not self.has_in_network:
            algos = [a for a in algos if not needs_in_network(a)]
        if self.topology.n_gpus > DIRECT_MAX_RANKS and collective != "alltoall":
            algos = [a for a in algos if a != "direct"]
        return algos

    def link_classes_used(self) -> list[int]:
        """Link classes (0 nvlink, 1 pci, 2 net) on the routes between the system's GPUs: which
        of a calibration profile's per-class parameters its collectives can depend on. Up to 32
        GPUs every pair; beyond, each GPU to its ring neighbour and to its peer in the next node
        (or NVLink domain), which crosses every class a ring or rail does."""
        topo = self.topology
        n = topo.n_gpus
        src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        keep = src != dst
        if n > 32:
            src = np.r_[np.arange(n), np.arange(n)]
            dst = np.r_[(np.arange(n) + 1) % n, (np.arange(n) + topo.nvlink_domain_gpus) % n]
            keep = src != dst
        _, links, _ = self.fabric.routes(src[keep], dst[keep])
        kinds = np.asarray(self.fabric.link_kind)[np.asarray(links, dtype=np.int64)]
        return sorted({int(k) for k in kinds})
