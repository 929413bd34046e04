"""Builders that expand a template into devices and links: one server, then the scale-out fabric.

Naming, relied on by tables and traces: ``n{node}.gpu{i}``, ``n{node}.nic{j}``,
``n{node}.nvswitch``, ``n{node}.pcie{k}``, ``n{node}.cpu{s}``; a multi-node NVLink domain's
switches ``nvl{domain}.nvswitch``; fabric switches ``leaf{i}``, ``spine{i}``, ``agg{i}``,
``core{i}``, ``sw0``, ``g{group}.r{router}``.

Fat-trees are folded Clos networks of switches of ``radix`` ports. A leaf has ``up`` uplinks and
``down`` endpoint ports with ``down / up`` = the oversubscription ratio (1:1 gives full bisection
bandwidth). Two tiers: every leaf links once to every spine (``up`` spines). Three tiers: pods of
``radix/2`` leaves and ``up`` aggregation switches; aggregation switch *j* of every pod links to the
``radix/2`` cores of core group *j* (Al-Fares et al., SIGCOMM 2008, for the 1:1 k-ary case: k pods,
5k^2/4 switches, k^3/4 hosts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from collsim.errors import TopologyError
from collsim.topology.host_p2p import cpu_above, forwarding_capacities
from collsim.topology.schema import FabricIn, IntraIn, LinkClassIn, NodeIn
from collsim.topology.spec import NIC_PATHS_THROUGH_CPU, Device, Link, SharedCapacity

# Preset pairs of the DGX-1 (V100) hybrid cube-mesh: (gpu, gpu, NVLink count), six links per GPU.
# Source: NVIDIA DGX-1 with Tesla V100 System Architecture white paper (WP-08437-002), Figure 4.
HYBRID_CUBE_MESH_PAIRS: tuple[tuple[int, int, int], ...] = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
    (1, 2, 2), (1, 3, 1), (1, 5, 2),
    (2, 3, 2), (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1), (4, 6, 1), (4, 7, 2),
    (5, 6, 2), (5, 7, 1),
    (6, 7, 2),
)  # fmt: skip


@dataclass
class Parts:
    """Devices and links under construction."""

    devices: list[Device] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    shared: list[SharedCapacity] = field(default_factory=list)

    def device(self, name: str, kind: str, **kw: object) -> str:
        self.devices.append(Device(name=name, kind=kind, **kw))  # type: ignore[arg-type]
        return name

    def link(self, a: str, b: str, cls: LinkClassIn, *, count: int = 1) -> None:
        duplex = None if cls.duplex_bandwidth is None else cls.duplex_bandwidth * count
        self.links.append(
            Link(
                a,
                b,
                cls.kind,
                cls.bandwidth * count,
                cls.latency,
                duplex_bandwidth_bytes_per_s=duplex,
            )
        )


def build_node(parts: Parts, n: int, node: NodeIn, gpus: int, gpu_forwards: bool) -> list[str]:
    """Add server ``n`` to ``parts``; returns its NIC names by rail (local NIC index)."""
    intra = node.intra
    first = len(parts.devices)  # this server's devices are the ones added from here on
    gpu_names = [
        parts.device(f"n{n}.gpu{i}", "gpu", node=n, index=i, forwards=gpu_forwards)
        for i in range(gpus)
    ]
    # Where each GPU meets PCIe (for NIC attachment): filled by the intra-node builders below.
    pcie_home: list[str] = list(gpu_names)

    if intra.kind in ("nvswitch", "mesh", "hybrid_cube_mesh") and intra.link is None:
        raise TopologyError(f"intra-node kind {intra.kind!r} needs a link", field="node.intra.link")
    if intra.kind == "nvswitch":
        sw = parts.device(
            f"n{n}.nvswitch",
            "nvswitch",
            node=n,
            latency_s=intra.switch_latency,
            in_network_reduction=intra.in_network_reduction,
            in_network_efficiency=intra.in_network_efficiency,
        )
        for g in gpu_names:
            parts.link(g, sw, intra.link)  # type: ignore[arg-type]
    elif intra.kind in ("mesh", "hybrid_cube_mesh"):
        for a, b, count in _mesh_pairs(intra.kind, intra.pairs, intra.links_per_pair, gpus):
            parts.link(gpu_names[a], gpu_names[b], intra.link, count=count)  # type: ignore[arg-type]
    elif intra.kind == "pcie":
        pcie_home = _pcie_tree(parts, n, node, gpu_names)

    if node.nics is None:
        parts.shared += forwarding_capacities(parts.devices, parts.links, n, node.intra)
        return []
    nics = node.nics
    count = nics.count_for(gpus)
    if count is None:
        raise TopologyError(
            f"{nics.per_gpu:g} NICs per GPU x {gpus} GPUs is not a whole number of NICs",
            field="node.nics.per_gpu",
            value=nics.per_gpu,
        )
    if max(count, gpus) % min(count, gpus):
        raise TopologyError(
            f"{count} NICs cannot be shared evenly by {gpus} GPUs",
            field="node.nics.count",
            value=count,
        )
    nic_names = [parts.device(f"n{n}.nic{j}", "nic", node=n, index=j) for j in range(count)]
    groups = min(count, gpus)
    hubs: list[str] = []
    cpus = [d.name for d in parts.devices[first:] if d.kind == "cpu" and d.node == n]
    # The NICs go up to a CPU only where its forwarding limit is declared: that limit is all the
    # CPU hop changes, and beside their GPUs the NICs keep the nearest-NIC affinity NCCL uses
    # (on the CPU every NIC would be equally near every GPU).
    phb = nics.gpu_path in NIC_PATHS_THROUGH_CPU and node.intra.host_p2p_bandwidth is not None
    for grp in range(groups):
        group_gpus = range(grp * gpus // groups, (grp + 1) * gpus // groups)
        group_nics = nic_names[grp * count // groups : (grp + 1) * count // groups]
        if nics.attach == "integrated":
            for g in group_gpus:
                for nic in group_nics:
                    parts.link(gpu_names[g], nic, nics.link)
            continue
        pcie = _require_pcie(node)
        if intra.kind == "pcie":
            hub = pcie_home[group_gpus[0]]
        elif len(group_gpus) == 1 and (len(group_nics) == 1 or phb):
            hub = gpu_names[group_gpus[0]]
        else:
            hub = parts.device(f"n{n}.pcie{grp}", "pcie_switch", node=n, index=grp)
            hubs.append(hub)
            for g in group_gpus:
                parts.link(gpu_names[g], hub, pcie)
        if phb:
            # The NICs sit on root ports of their own: GPU-NIC traffic crosses the CPU's root
            # complex (NCCL's PATH_PHB). A GPU without a PCIe home gets its own root port.
            cpus = cpus or _sockets(parts, n, intra)
            cpu = cpu_above(parts.devices, parts.links, hub) or cpus[grp * len(cpus) // groups]
            if hub == gpu_names[group_gpus[0]] and intra.kind != "pcie":
                parts.link(hub, cpu, pcie)
            hub = cpu
        for nic in group_nics:
            parts.link(hub, nic, pcie)
    if hubs:
        # The PCIe switches hang off the host's CPU sockets, which also join GPUs that share
        # no NVLink (e.g. GPU 0 and GPU 5 of a DGX-1).
        cpus = cpus or _sockets(parts, n, intra)
        for k, hub in enumerate(hubs):
            parts.link(hub, cpus[k * len(cpus) // len(hubs)], _require_pcie(node))
    parts.shared += forwarding_capacities(parts.devices, parts.links, n, node.intra)
    return nic_names


def _sockets(parts: Parts, n: int, intra: IntraIn) -> list[str]:
    """The node's CPU sockets, joined pairwise by ``intra.cpu_link``."""
    cpus = [
        parts.device(f"n{n}.cpu{s}", "cpu", node=n, index=s, latency_s=intra.host_latency)
        for s in range(intra.sockets)
    ]
    if intra.sockets > 1:
        if intra.cpu_link is None:
            raise TopologyError(
                "several CPU sockets need a link between them", field="node.intra.cpu_link"
            )
        for s in range(intra.sockets):
            for t in range(s + 1, intra.sockets):
                parts.link(cpus[s], cpus[t], intra.cpu_link)
    return cpus


def _require_pcie(node: NodeIn) -> LinkClassIn:
    if node.pcie is None:
        raise TopologyError("NICs attached over PCIe need the node's PCIe link", field="node.pcie")
    return node.pcie


def _mesh_pairs(
    kind: str, pairs: Sequence[tuple[int, int, int]] | None, per_pair: int, gpus: int
) -> list[tuple[int, int, int]]:
    if kind == "hybrid_cube_mesh":
        if gpus != 8:
            raise TopologyError(
                "a hybrid cube-mesh has exactly 8 GPUs", field="node.gpus", value=gpus
            )
        return list(HYBRID_CUBE_MESH_PAIRS)
    if pairs is None:
        return [(a, b, per_pair) for a in range(gpus) for b in range(a + 1, gpus)]
    for i, (a, b, count) in enumerate(pairs):
        if not (0 <= a < gpus and 0 <= b < gpus) or a == b or count < 1:
            raise TopologyError(
                f"mesh pair must name two different GPUs below {gpus} and a link count >= 1",
                field=f"node.intra.pairs.{i}",
                value=[a, b, count],
            )
    return list(pairs)


def _pcie_tree(parts: Parts, n: int, node: NodeIn, gpu_names: list[str]) -> list[str]:
    """PCIe switches under CPU sockets; without P2P, GPU traffic bounces through the CPU."""
    intra = node.intra
    link = intra.link or node.pcie
    if link is None:
        raise TopologyError("a PCIe node needs a PCIe link", field="node.intra.link")
    gpus = len(gpu_names)
    cpus = _sockets(parts, n, intra)
    # A switch with its GPUs below is the building block: sized to other GPU counts
    # (--gpus-per-node), a node keeps at most the template's GPUs per switch.
    n_sw = intra.pcie_switches
    if gpus != node.gpus:
        n_sw = max(1, min(gpus, math.ceil(intra.pcie_switches * gpus / node.gpus - 1e-9)))
    below = [i * n_sw // gpus for i in range(gpus)]  # each GPU's switch
    if not intra.p2p:
        # Without peer-to-peer a GPU's traffic goes to host memory and back, so the graph links
        # each GPU to its switch's socket; the GPUs below one switch share its uplink both ways
        # (a GPU alone below its switch still crosses the uplink, which may be the slower link).
        homes = [cpus[below[i] * intra.sockets // n_sw] for i in range(gpus)]
        for g, home in zip(gpu_names, homes, strict=True):
            parts.link(g, home, link)
        uplink = node.pcie or link
        for k in range(n_sw):
            members = [i for i in range(gpus) if below[i] == k]
            if len(members) < 2 and uplink.bandwidth >= link.bandwidth:
                continue  # nothing shared, nothing slower
            sw = f"n{n}.pcie{k}"
            for name, dirs in (
                (f"{sw} uplink (to host)", [(gpu_names[i], homes[i]) for i in members]),
                (f"{sw} uplink (from host)", [(homes[i], gpu_names[i]) for i in members]),
            ):
                parts.shared.append(
                    SharedCapacity(name, uplink.kind, uplink.bandwidth, tuple(dirs))
                )
        return homes
    switches = []
    for k in range(n_sw):
        sw = parts.device(f"n{n}.pcie{k}", "pcie_switch", node=n, index=k)
        parts.link(sw, cpus[k * intra.sockets // n_sw], node.pcie or link)
        switches.append(sw)
    homes = [switches[k] for k in below]
    for g, home in zip(gpu_names, homes, strict=True):
        parts.link(g, home, link)
    return homes


# -- scale-out fabrics ---------------------------------------------------------------------------


def leaf_ports(radix: int, oversubscription: float) -> tuple[int, int]:
    """(down, up) ports of a leaf switch for an oversubscription ratio down/up."""
    up = max(1, math.floor(radix / (1 + oversubscription) + 1e-9))
    down = min(radix - up, max(1, round(up * oversubscription)))
    return down, up


def build_fabric(
    parts: Parts,
    fabric: FabricIn,
    nics_by_node: list[list[str]],
    gpus_by_node: list[list[str]],
    nic_link: LinkClassIn | None,
) -> None:
    """Connect the servers' NICs (or GPUs, for a chip-level torus) with the scale-out fabric.

    Cables default to the NIC's own port (its kind, rate and latency) unless ``fabric.link`` says
    otherwise.
    """
    kind = fabric.kind
    if kind == "none":
        if len(nics_by_node) > 1:
            raise TopologyError(
                "several nodes need a scale-out fabric", field="fabric.kind", value=kind
            )
        return
    if kind in ("torus", "ring") and fabric.attach == "gpu":
        if fabric.link is None:
            raise TopologyError("a GPU-level torus needs its link", field="fabric.link")
        _torus(parts, fabric, [[g] for node in gpus_by_node for g in node], fabric.link)
        return
    if not nics_by_node or not nics_by_node[0]:
        raise TopologyError(f"fabric {kind!r} needs NICs in each node", field="node.nics")
    link = fabric.link or nic_link
    if link is None:
        raise TopologyError("the fabric needs a link class", field="fabric.link")
    if kind in ("torus", "ring"):
        _torus(parts, fabric, nics_by_node, link)
    elif kind == "single_switch":
        endpoints = [nic for node in nics_by_node for nic in node]
        if len(endpoints) > fabric.radix:
            raise TopologyError(
                f"a single switch of radix {fabric.radix} cannot hold {len(endpoints)} NICs "
                "(use fat_tree)",
                field="fabric.radix",
                value=fabric.radix,
            )
        sw = _switch(parts, "sw0", fabric, tier=1)
        for nic in endpoints:
            parts.link(nic, sw, link)
    elif kind in ("fat_tree", "rail_optimized"):
        down, _ = leaf_ports(fabric.radix, fabric.oversubscription)
        if kind == "fat_tree":
            flat = [nic for node in nics_by_node for nic in node]
            groups = [flat[i : i + down] for i in range(0, len(flat), down)]
        else:
            rails = len(nics_by_node[0])
            groups = []
            for r in range(rails):
                rail = [node[r] for node in nics_by_node]
                groups += [rail[i : i + down] for i in range(0, len(rail), down)]
        fat_tree(parts, groups, fabric, link)
    elif kind == "dragonfly":
        _dragonfly(parts, fabric, [nic for node in nics_by_node for nic in node], link)


def _switch(parts: Parts, name: str, fabric: FabricIn, tier: int) -> str:
    return parts.device(
        name,
        "switch",
        latency_s=fabric.switch_latency,
        in_network_reduction=fabric.in_network_reduction,
        in_network_efficiency=fabric.in_network_efficiency,
        tier=tier,
    )


def fat_tree(parts: Parts, groups: list[list[str]], fabric: FabricIn, link: LinkClassIn) -> None:
    """A 2- or 3-tier folded Clos over ``groups`` (each group of endpoints shares one leaf)."""
    k = fabric.radix
    _, up = leaf_ports(k, fabric.oversubscription)
    leaves = [_switch(parts, f"leaf{i}", fabric, 1) for i in range(len(groups))]
    for leaf, group in zip(leaves, groups, strict=True):
        for endpoint in group:
            parts.link(endpoint, leaf, link)
    if len(leaves) <= 1:
        return
    if fabric.tiers == 2:
        if len(leaves) > k:
            raise TopologyError(
                f"a 2-tier fat-tree of radix {k} holds at most {k} leaves, "
                f"{len(leaves)} are needed (use tiers: 3 or a larger radix)",
                field="fabric.tiers",
                value=2,
            )
        spines = [_switch(parts, f"spine{j}", fabric, 2) for j in range(up)]
        for leaf in leaves:
            for spine in spines:
                parts.link(leaf, spine, link)
        return
    per_pod = k // 2
    pods = math.ceil(len(leaves) / per_pod)
    if pods > k:
        raise TopologyError(
            f"a 3-tier fat-tree of radix {k} holds at most {k} pods, {pods} are needed",
            field="fabric.radix",
            value=k,
        )
    cores = (
        [[_switch(parts, f"core{j * per_pod + c}", fabric, 3) for c in range(per_pod)]
         for j in range(up)]
        if pods > 1
        else []
    )  # fmt: skip
    for p in range(pods):
        aggs = [_switch(parts, f"agg{p * up + j}", fabric, 2) for j in range(up)]
        for leaf in leaves[p * per_pod : (p + 1) * per_pod]:
            for agg in aggs:
                parts.link(leaf, agg, link)
        for j, agg in enumerate(aggs):
            for core in cores[j] if cores else ():
                parts.link(agg, core, link)


def torus_dims(total: int, dims: Sequence[int] | None, ndims: int) -> list[int]:
    """The torus shape: the given ``dims`` (checked) or a near-cubic factorisation of ``total``."""
    if dims is not None:
        if math.prod(dims) != total:
            raise TopologyError(
                f"torus dims multiply to {math.prod(dims)}, but there are {total} vertices",
                field="fabric.dims",
                value=list(dims),
            )
        return list(dims)
    shape = [1] * ndims
    remaining = total
    for i in range(ndims):
        target = round(remaining ** (1 / (ndims - i)))
        best = max(d for d in range(1, remaining + 1) if remaining % d == 0 and d <= max(1, target))
        shape[i] = best
        remaining //= best
    shape[-1] *= remaining
    return sorted(shape, reverse=True)


def fabric_shape(fabric: FabricIn, vertices: int) -> list[int]:
    """The shape of a torus or ring fabric over ``vertices`` vertices."""
    ndims = 1 if fabric.kind == "ring" else len(fabric.dims or (0, 0, 0))
    return torus_dims(vertices, fabric.dims if fabric.kind == "torus" else None, ndims)


def _torus(
    parts: Parts, fabric: FabricIn, vertices_by_node: list[list[str]], link: LinkClassIn
) -> None:
    """Wrap-around grid links; one torus per rail when each node brings several NICs."""
    n = len(vertices_by_node)
    dims = fabric_shape(fabric, n)
    strides = [math.prod(dims[:i]) for i in range(len(dims))]
    for rail in range(len(vertices_by_node[0])):
        for v in range(n):
            coords = [(v // strides[i]) % dims[i] for i in range(len(dims))]
            for i, size in enumerate(dims):
                if size == 1 or (size == 2 and coords[i] == 1):
                    continue
                nxt = v + ((coords[i] + 1) % size - coords[i]) * strides[i]
                parts.link(vertices_by_node[v][rail], vertices_by_node[nxt][rail], link)


def _dragonfly(parts: Parts, fabric: FabricIn, endpoints: list[str], link: LinkClassIn) -> None:
    """Groups of all-to-all routers; groups joined all-to-all by global links.

    Each router has ``global_links_per_router`` global ports; every pair of groups gets an equal
    share of a group's global ports (at least one link), spread round-robin over the routers of
    both groups (parallel links between the same two routers become one wider link).
    """
    p, a = fabric.nics_per_router, fabric.routers_per_group
    routers_needed = math.ceil(len(endpoints) / p)
    groups = math.ceil(routers_needed / a)
    routers = [[_switch(parts, f"g{g}.r{r}", fabric, 1) for r in range(a)] for g in range(groups)]
    flat = [r for grp in routers for r in grp]
    for i, endpoint in enumerate(endpoints):
        parts.link(endpoint, flat[i // p], link)
    for grp in routers:
        for i in range(a):
            for j in range(i + 1, a):
                parts.link(grp[i], grp[j], link)
    if groups < 2:
        return
    per_pair = max(1, a * fabric.global_links_per_router // (groups - 1))
    cursor = [0] * groups
    bundles: dict[tuple[str, str], int] = {}
    for g in range(groups):
        for h in range(g + 1, groups):
            for _ in range(per_pair):
                key = (routers[g][cursor[g] % a], routers[h][cursor[h] % a])
                bundles[key] = bundles.get(key, 0) + 1
                cursor[g] += 1
                cursor[h] += 1
    for (u, v), count in bundles.items():
        parts.link(u, v, link, count=count)
