"""One topology ready to be timed: its routes, the engine's fabric over them and the ranks' layout.

The cost models (:class:`~collsim.model.analytic.AnalyticModel`) read a system through this
class; :class:`collsim.whatif.WhatIf` extends it with the cost models themselves and the engine,
so the model floor never needs the what-if facade above it.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.crossnode import head_ranks
from collsim.collectives.layout import RankLayout
from collsim.collectives.registry import algorithms_for
from collsim.model.shares import WaveShares
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


def _reach(topology: Topology, kinds: frozenset[str] | None) -> list[set[str]]:
    """Per switch that reduces in the network (of ``kinds``, or any), the GPUs it reaches over
    forwarding devices (GPUs do not forward)."""
    return list(topology.reduction_reach(kinds))


def why_not(
    topology: Topology,
    collective: str,
    algorithm: str,
    layout: RankLayout | None = None,
    gpus: list[str] | None = None,
) -> str | None:
    """Why NCCL would not run ``algorithm`` on these ranks (``None``: it would), as a sentence:

    * ``in_network`` (NVLS, or SHARP over every GPU): one reducing switch reaches every rank;
    * ``nvls_tree``: several nodes (NVLink domains), each reduced by its own NVSwitch with
      NVLink SHARP (NCCL's ``nvlsSupport``; on one node NCCL runs NVLS);
    * ``collnet``: several nodes, and a scale-out switch with in-network reduction (SHARP)
      reaching the nodes' heads (``collNetSupport``);
    * ``pat``: one GPU per node (``ncclPatEnable``: "PAT only supports 1 GPU per node").

    ``layout``/``gpus``: the ranks' layout and GPU names (default: every GPU of ``topology``).
    """
    layout = layout or layout_for(topology)
    names = gpus or [d.name for d in topology.gpus]
    many = layout.nnodes > 1
    if algorithm == "pat" and layout.ranks_per_node != 1:
        return (f"NCCL runs PAT with one GPU per node only; this job has {layout.ranks_per_node} "
                "per node (NVLink domain)")  # fmt: skip
    if algorithm == "in_network" and not topology.reduces_for(names):
        return (f"needs in-network reduction, and {topology.name} has no switch with "
                "in_network_reduction (NVLS/SHARP) that every GPU reaches")  # fmt: skip
    if algorithm in ("nvls_tree", "collnet") and not many:
        return (f"{algorithm} joins several nodes (NVLink domains); on one node NCCL runs NVLS "
                "(in_network)")  # fmt: skip
    if algorithm == "nvls_tree":
        reach = _reach(topology, frozenset({"nvswitch"}))
        holding: dict[str, list[set[str]]] = {}  # each GPU's reducing switches' reach
        for r in reach:
            for gpu in r:
                holding.setdefault(gpu, []).append(r)
        g = layout.ranks_per_node
        for m in range(layout.nnodes):
            node = set(names[m * g : m * g + layout.node_size(m)])
            first = names[m * g]
            if not any(node <= r for r in holding.get(first, ())):
                return (f"needs NVLink SHARP in every node: an nvswitch with in_network_reduction; "
                        f"{topology.name} has none for node {m}")  # fmt: skip
    if algorithm == "collnet":
        reach = _reach(topology, None)
        for col in head_ranks(layout).T:
            wanted = {names[int(r)] for r in col}
            if not any(wanted <= r for r in reach):
                return (f"needs SHARP: a fabric with in_network_reduction joining the nodes; "
                        f"{topology.name} has none")  # fmt: skip
    return None


class System:
    """One topology with its routes (cached across calls), fabric and rank layout."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.network = Network(topology)
        self.fabric = TopologyFabric(self.network)
        self.layout = layout_for(topology)
        self.has_in_network = topology.reduces_for_all_gpus
        self.wave_shares = WaveShares()
        """Max-min results of waves on this fabric, which its cost models share."""

    def candidates(self, collective: str) -> list[str]:
        """Algorithms ``auto`` considers for ``collective`` on this topology.

        One-shot ``direct`` reductions and gathers (every rank to every rank) are considered up to
        :data:`DIRECT_MAX_RANKS` ranks only: they are NVSwitch-domain algorithms, and their n^2
        flows make them both useless and expensive to cost at cluster scale. (All-to-all's
        ``direct`` is the all-to-all itself and always a candidate.)
        """
        # System.why_not, not self.why_not: a sweep asks with a stand-in holding the topology
        algos = [
            a for a in algorithms_for(collective) if System.why_not(self, collective, a) is None
        ]
        if self.topology.n_gpus > DIRECT_MAX_RANKS and collective != "alltoall":
            algos = [a for a in algos if a != "direct"]
        return algos

    def why_not(self, collective: str, algorithm: str) -> str | None:
        """Why NCCL would not run ``algorithm`` here (:func:`why_not`), cached per algorithm."""
        cache = self.__dict__.setdefault("_why_not", {})
        if algorithm not in cache:
            fabric = getattr(self, "fabric", None)
            gpus = list(getattr(fabric, "gpus", [])) or None  # a group's, in a group view
            layout = getattr(self, "layout", None)
            cache[algorithm] = why_not(self.topology, collective, algorithm, layout, gpus)
        return cache[algorithm]

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
